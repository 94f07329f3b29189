package etcdlock

import (
	"context"
	"log/slog"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The options of a Session and of every lock, with their defaults in one
// place and invalid values returned as errors.

// DefaultTTL is the lease TTL of a Session made without WithTTL.
const DefaultTTL = 15 * time.Second

// MinTTL is the shortest TTL WithTTL accepts: etcd leases count whole seconds.
const MinTTL = time.Second

// sessionOptions holds a Session's settings; defaults live in
// defaultSessionOptions and nowhere else.
type sessionOptions struct {
	ttl    time.Duration
	lease  clientv3.LeaseID
	ctx    context.Context
	hooks  Hooks
	logger *slog.Logger
}

func defaultSessionOptions() sessionOptions {
	return sessionOptions{ttl: DefaultTTL, ctx: context.Background()}
}

// A SessionOption configures NewSession. An invalid value makes NewSession
// return an error wrapping ErrInvalidOption.
type SessionOption func(*sessionOptions) error

// newSessionOptions applies opts to the defaults, and returns the first
// invalid option's error.
func newSessionOptions(opts []SessionOption) (sessionOptions, error) {
	o := defaultSessionOptions()
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	return o, nil
}

// CheckSessionOptions returns nil if NewSession takes opts, and the error
// it would return for them otherwise (matching ErrInvalidOption). It
// makes no RPC: a program or an adapter can check its configuration
// before it has a client that reaches etcd.
func CheckSessionOptions(opts ...SessionOption) error {
	_, err := newSessionOptions(opts)
	return err
}

// CheckMutexOptions returns nil if a Mutex takes opts, and the error its
// Lock and TryLock would return for them otherwise (matching
// ErrInvalidOption). It makes no RPC and needs no Session. One check is
// left to Lock, since it depends on the Session: a WithMaxHold must
// exceed a WithMinHold by the session's margin and a second.
func CheckMutexOptions(opts ...MutexOption) error {
	return newMutexOptions(KindMutex, opts).err
}

// WithTTL sets the TTL of the session's lease: how long etcd keeps the
// session's locks, and its places in their queues, after the process
// stops renewing it (it died or was cut off). So a waiter killed with
// SIGKILL stalls the queue for up to the TTL when its turn comes. Renewals
// go every TTL/3, so the session rides out an etcd that does not answer
// for at least about two thirds of the TTL. Default DefaultTTL (15s).
// Values below MinTTL (1s) are an error; fractions of a second round up,
// since etcd leases count whole seconds. WithTTL has no effect together
// with WithLease, whose lease keeps its TTL.
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) error {
		if d < MinTTL {
			return errorf("%w: TTL %v is below the minimum %v", ErrInvalidOption, d, MinTTL)
		}
		if d > time.Duration(math.MaxInt64/2) {
			return errorf("%w: TTL %v is too large", ErrInvalidOption, d)
		}
		o.ttl = d
		return nil
	}
}

// WithLease makes the session use an existing lease instead of granting a
// new one. NewSession checks the lease is alive and takes over its
// keepalives; Close revokes it. Default: a new lease.
//
// The locks of a session share the key name/<lease>, and exclude each
// other only through the session. So NewSession returns an error matching
// ErrInvalidOption for a lease that another Session of this process still
// uses, through any client of the cluster: adopt a lease once the Session
// that used it has ended (Orphan, Close, its lease's loss), and its calls
// have returned. A lock of the new session that finds a key left under the
// lease (the old session's hold, say) takes the lock as a new hold: it
// removes that key as a hold that ended without Unlock, so the old hold's
// minimum hold and lock delay are waited out, and joins the queue behind
// whoever queued since, with a larger token. Uncontended, a restarted
// process thus holds its lock again at once, and the old hold's late
// writes are refused by every fence. A key left under the lease that no
// lock of the new session takes stays queued (and holds, if it is first)
// while the session keeps the lease alive: lock and unlock each name the
// old process held, or end the session. A lease must never be used by two
// processes at once.
func WithLease(id clientv3.LeaseID) SessionOption {
	return func(o *sessionOptions) error {
		if id <= 0 {
			return errorf("%w: lease ID %d", ErrInvalidOption, id)
		}
		o.lease = id
		return nil
	}
}

// WithContext sets a context that bounds the session's life: when it ends,
// the session stops renewing its lease and ends (Done is closed; the lease
// is left to expire, as with Orphan). It bounds NewSession's start too,
// beside NewSession's ctx, which bounds only the start. Default
// context.Background().
func WithContext(ctx context.Context) SessionOption {
	return func(o *sessionOptions) error {
		if ctx == nil {
			return errorf("%w: nil context", ErrInvalidOption)
		}
		o.ctx = ctx
		return nil
	}
}

// ttlSeconds is the lease TTL etcd is asked for: d rounded up to seconds.
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// mutexOptions holds a Mutex's settings; the zero value, with its kind, is
// the default.
type mutexOptions struct {
	kind     Kind // the primitive (KindRWMutexWrite for an RWMutex), for Hooks' events
	maxHold  time.Duration
	identity string // WithIdentity's; "" for none
	// cancelOnRequest: Do cancels fn's ctx when the hold is asked to
	// release (WithCancelOnRequest).
	cancelOnRequest bool
	delay           time.Duration // WithLockDelay's; 0 for none
	minHold         time.Duration // WithMinHold's; 0 for none
	err             error         // the first invalid option, reported by Lock and TryLock
	// records: the lock's holds write a record and its waiters honour
	// others' (delay.go): set with a lock delay or a minimum hold.
	records bool
	guards  []guard // what the options above ask of each Lock (guardsOf)
}

// A MutexOption configures NewMutex. An invalid value makes Lock and
// TryLock return an error wrapping ErrInvalidOption.
type MutexOption func(*mutexOptions) error

// defaultMutexOptions are the settings of every lock of each kind made
// without options: shared, never written.
var defaultMutexOptions = func() (d [numKinds]mutexOptions) {
	for k := range d {
		d[k].kind = Kind(k)
	}
	return d
}()

// newMutexOptions applies opts to the defaults of kind. The result is
// read-only: without opts it is defaultMutexOptions[kind], shared by every
// such lock (a pointer, not a copy, keeps each Mutex smaller; the kind
// lives here rather than in the Mutex for the same reason).
func newMutexOptions(kind Kind, opts []MutexOption) *mutexOptions {
	if len(opts) == 0 {
		return &defaultMutexOptions[kind]
	}
	o := &mutexOptions{kind: kind}
	for _, opt := range opts {
		if err := opt(o); err != nil && o.err == nil {
			o.err = err
		}
	}
	o.records = o.delay > 0 || o.minHold > 0
	o.guards = guardsOf(o)
	return o
}

// WithMaxHold makes etcd itself end every hold d after acquisition, even if
// the holder hangs: at acquisition the key is re-attached to a lease of its
// own with TTL d (rounded up to seconds), keeping its place and token. Done
// closes, and Err reports ErrLockLost, a margin before etcd ends the hold.
// The key then no longer follows the session's lease: if the holder dies,
// the lock passes on when d has run out, not TTL. It costs two more RPCs
// per acquisition and one more per Unlock. Default: no limit. Values below
// MinTTL (1s) are an error.
func WithMaxHold(d time.Duration) MutexOption {
	return func(o *mutexOptions) error {
		if d < MinTTL {
			return errorf("%w: max hold %v is below the minimum %v", ErrInvalidOption, d, MinTTL)
		}
		o.maxHold = d
		return nil
	}
}

// WithCancelOnRequest makes Do cancel fn's ctx when the hold is asked to
// release (RequestRelease), with a context.Cause matching
// ErrReleaseRequested; Do then releases the lock once fn returns, as
// always. Without it a request cancels nothing: fn may watch
// ReleaseRequested itself. It changes only Do. Default: off.
func WithCancelOnRequest() MutexOption {
	return func(o *mutexOptions) error {
		o.cancelOnRequest = true
		return nil
	}
}

// MaxIdentityLen is the longest identity WithIdentity accepts. Every
// waiter of an RWMutex or a Semaphore reads the values of the keys ahead
// of it, identities included: a short description keeps those reads small.
const MaxIdentityLen = 1 << 10

// WithIdentity records who holds: identity (for example a host, a pid, a
// service name, the time it queued) goes into the value of the key, in the
// Put that joins the queue, so it costs no RPC of its own. InspectLock and
// ListLocks return it, and so do `etcdlock status` and `etcdlock ls`.
//
// The value's first line stays the key's mode (see ParseKeyMode), and the
// identity follows its "\n": a Mutex's key then reads "\n"+identity, which
// etcd's concurrency.Mutex and `etcdctl lock` ignore like any value. The
// identity is written as given; it may not be changed while the key exists
// (a key's value changes only with its mode). Default: none, and a Mutex's
// key has the empty value of etcd's. An identity longer than
// MaxIdentityLen is an error.
func WithIdentity(identity string) MutexOption {
	return func(o *mutexOptions) error {
		if len(identity) > MaxIdentityLen {
			return errorf("%w: identity is %d bytes, longer than %d", ErrInvalidOption, len(identity), MaxIdentityLen)
		}
		o.identity = identity
		return nil
	}
}
