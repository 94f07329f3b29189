package concurrency

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	v3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

const defaultSessionTTL = 60

// Session represents a lease kept alive for the lifetime of a client.
// Fault-tolerant applications may use sessions to reason about liveness.
//
// It is an *etcdlock.Session (see Etcdlock) seen through etcd's API: its
// Done closes, and its Ctx is cancelled, a margin before etcd can expire
// the lease when renewals fail, not only once the keepalive stream
// reports it.
type Session struct {
	client *v3.Client
	opts   *sessionOptions
	core   *core

	ctx      context.Context
	cancel   context.CancelFunc
	donec    chan struct{}
	orphaned sync.Once
}

// NewSession gets the leased session for a client.
//
// With WithLease, a lease that a Session of this process still keeps
// alive is shared with it (etcd's package would run a second keepalive
// loop on it): the two are one holder, as they are in etcd, and a lock or
// election of one is held by the other too.
func NewSession(client *v3.Client, opts ...SessionOption) (*Session, error) {
	lg := client.GetLogger()
	ops := &sessionOptions{ttl: defaultSessionTTL, ctx: client.Ctx()}
	for _, opt := range opts {
		opt(ops, lg)
	}
	c, err := openCore(client, ops)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ops.ctx)
	s := &Session{client: client, opts: ops, core: c, ctx: ctx, cancel: cancel, donec: make(chan struct{})}
	// Done and Ctx follow the etcdlock session's end, or this Session's
	// own Orphan when it shares the lease with another.
	go func() {
		defer close(s.donec)
		defer cancel()
		select {
		case <-c.es.Done():
		case <-ctx.Done():
		}
	}()
	return s, nil
}

// openCore starts the etcdlock session of a new Session, or finds the one
// a live Session of this process keeps alive on the lease WithLease names.
func openCore(client *v3.Client, ops *sessionOptions) (*core, error) {
	eopts := []etcdlock.SessionOption{
		etcdlock.WithTTL(time.Duration(ops.ttl) * time.Second),
		etcdlock.WithContext(ops.ctx),
	}
	if ops.leaseID != v3.NoLease {
		eopts = append(eopts, etcdlock.WithLease(ops.leaseID))
	}
	es, err := etcdlock.NewSession(ops.ctx, client, eopts...)
	if err == nil {
		return newCore(es), nil
	}
	if ops.leaseID > 0 && errors.Is(err, etcdlock.ErrInvalidOption) {
		if c := findCore(client, ops.leaseID); c != nil {
			return c, nil
		}
	}
	return nil, err
}

// Client is the etcd client that is attached to the session.
func (s *Session) Client() *v3.Client {
	return s.client
}

// Lease is the lease ID for keys bound to the session.
func (s *Session) Lease() v3.LeaseID { return s.core.es.Lease() }

// Ctx is the context attached to the session, it is canceled when the lease is orphaned, expires, or
// is otherwise no longer being refreshed.
func (s *Session) Ctx() context.Context {
	return s.ctx
}

// Done returns a channel that closes when the lease is orphaned, expires, or
// is otherwise no longer being refreshed.
func (s *Session) Done() <-chan struct{} { return s.donec }

// Orphan ends the refresh for the session lease. This is useful
// in case the state of the client connection is indeterminate (revoke
// would fail) or when transferring lease ownership.
//
// Unlike etcd's, an orphaned Session takes no new locks or
// leaderships: they would be held by a lease that no one renews, and
// whose end no one would be told of (Lock and Campaign return
// ErrSessionExpired). A lease another Session of this process shares
// (see NewSession) is renewed until that one is orphaned too.
func (s *Session) Orphan() {
	s.orphaned.Do(func() {
		s.cancel()
		<-s.donec
		s.core.unref()
	})
}

// Close orphans the session and revokes the session lease.
func (s *Session) Close() error {
	s.Orphan()
	return s.core.es.Close()
}

// Etcdlock returns the etcdlock Session behind s, for what etcd's API
// has no words for: Expiry, Err (why it ended), etcdlock's own Mutex,
// RWMutex, Semaphore and Election on the same lease. Sessions sharing a
// lease share it.
func (s *Session) Etcdlock() *etcdlock.Session { return s.core.es }

type sessionOptions struct {
	ttl     int
	leaseID v3.LeaseID
	ctx     context.Context
}

// SessionOption configures Session.
type SessionOption func(*sessionOptions, *zap.Logger)

// WithTTL configures the session's TTL in seconds.
// If TTL is <= 0, the default 60 seconds TTL will be used.
func WithTTL(ttl int) SessionOption {
	return func(so *sessionOptions, lg *zap.Logger) {
		if ttl > 0 {
			so.ttl = ttl
		} else {
			lg.Warn("WithTTL(): TTL should be > 0, preserving current TTL", zap.Int64("current-session-ttl", int64(so.ttl)))
		}
	}
}

// WithLease specifies the existing leaseID to be used for the session.
// This is useful in process restart scenario, for example, to reclaim
// leadership from an election prior to restart.
//
// A lock or campaign of the new process that finds the old process's key
// under the lease takes it as a new hold, as etcdlock.WithLease says: the
// old hold's lock delay and minimum hold are waited out, and it queues
// again behind whoever queued meanwhile, with a larger fencing token. In
// this process, a lease a live Session keeps alive is shared instead (see
// NewSession).
func WithLease(leaseID v3.LeaseID) SessionOption {
	return func(so *sessionOptions, _ *zap.Logger) {
		so.leaseID = leaseID
	}
}

// WithContext assigns a context to the session instead of defaulting to
// using the client context. This is useful for canceling NewSession and
// Close operations immediately without having to close the client. If the
// context is canceled before Close() completes, the session's lease will be
// abandoned and left to expire instead of being revoked.
func WithContext(ctx context.Context) SessionOption {
	return func(so *sessionOptions, _ *zap.Logger) {
		so.ctx = ctx
	}
}
