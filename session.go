package etcdlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/streams"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Session is a lease on etcd kept alive while the process runs. Every
// hold and place in line taken through the session (a Mutex's, an
// RWMutex's, a Semaphore's, an Election's) is bound to that lease, so all
// of them end when the session ends: at Close (at once, the lease is revoked), or
// TTL after the process stops renewing (it died, was paused, or lost etcd).
//
// The session renews its lease every TTL/3, on one LeaseKeepAlive stream
// that all the sessions of its client share; their watches share one Watch
// stream too. It counts the
// lease's life from the moment each renewal was sent, because etcd extends
// the lease only when it receives the request: the lease lives at least
// until send time + TTL, and an answer that arrives late proves nothing
// newer. When that deadline, less a small margin, passes without a newer
// confirmed renewal, the session ends on its own and Done is closed:
// before etcd can expire the lease and hand this session's locks to anyone
// else.
//
// A renewal left unanswered for TTL/2 − 200ms, while nothing else comes on
// the shared stream either, marks the stream as stuck (as over a TCP
// connection gone half-open): it is given up for a new one, which the
// client may open to another of its endpoints, and the renewal is tried
// again there. The client's other calls still rely on gRPC keepalive
// (clientv3.Config.DialKeepAliveTime) to notice a dead connection.
//
// A Session is safe for concurrent use. Its locks share the key
// name/<lease>, and exclude each other only through the Session: a process
// keeps one Session per lease alive at a time (NewSession refuses a second
// one, see WithLease), and a lease must never be used by two processes at
// once.
type Session struct {
	cli    *clientv3.Client
	keeper *streams.Keeper // renews the lease, on the stream shared by cli's sessions
	id     clientv3.LeaseID
	ttl    time.Duration // TTL etcd granted

	leaseKey leaseKey      // the lease in the process's registry (claimLease), until the session ends
	donec    chan struct{} // closed when the session ends

	// endCtx is cancelled when the session ends, with the reason as cause,
	// so that RPCs made for the session's locks stop with it.
	endCtx    context.Context
	endCancel context.CancelCauseFunc
	// watchCtx is endCtx with clientv3.WithRequireLeader: the watches
	// made through the client's Watcher (see watchAlone) derive from it.
	watchCtx context.Context
	watcher  *sessionWatcher // watches the keys of the session's holds and waiters, on the stream shared by cli's sessions
	releaser *releaser       // sends the releases that Unlock left to the background
	batch    *batcher        // sends the releases, in batches when many are in flight

	stop     func()        // stops the keepalive loop
	loopDone chan struct{} // closed when the keepalive loop returned

	ev *reporter // reports to the WithHooks hooks and WithLogger logger; nil without them

	mu        sync.Mutex // guards err, cause, deadline, closed, revoking, leaseGone, names, extra
	err       error      // why the session ended; nil while it runs
	cause     SessionEnd // why it ended, for Hooks; set with err
	deadline  time.Time  // the lease is known to live until then
	closed    bool       // Close or Orphan was called
	revoking  bool       // Close was called: it revokes the leases, once
	leaseGone bool       // etcd said the lease no longer exists
	names     map[string]nameLock
	extra     map[clientv3.LeaseID]time.Time // WithMaxHold leases not yet revoked, and when they run out
	// adoptRev is the revision at which the session adopted its lease
	// (WithLease); 0 for a lease of its own. A key under the lease's name
	// created at or before it is a hold of the process before (see
	// inherits). Set once.
	adoptRev int64

	// The goroutines that finish what a caller whose ctx ended left
	// (spawn): shutdown waits for them. noSpawn is guarded by mu.
	bg      sync.WaitGroup
	bgN     atomic.Int32 // running
	noSpawn bool
}

// spawn runs f in a goroutine the session owns, which shutdown waits for
// (f must end once the session has ended). It reports false, and runs
// nothing, once the session is shutting down.
func (s *Session) spawn(f func()) bool {
	s.mu.Lock()
	if s.noSpawn {
		s.mu.Unlock()
		return false
	}
	s.bg.Add(1)
	s.bgN.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		defer s.bgN.Add(-1)
		f()
	}()
	return true
}

// errClientClosed is why a session ends when its client was closed.
var errClientClosed = errors.New("etcd client closed")

// Two Sessions on one lease would share every key name/<lease>, and etcd
// could not tell their locks apart: a Mutex of each would hold at once,
// and one's Unlock would delete the other's key. So a process keeps one
// Session per lease alive at a time: the leases of its live sessions are
// registered by cluster (lease IDs are unique within a cluster only).
var leasesInUse struct {
	mu sync.Mutex
	m  map[leaseKey]bool
}

// leaseKey names a lease across the clusters a process may use.
type leaseKey struct {
	cluster uint64
	id      clientv3.LeaseID
}

// claimLease registers the lease of a new Session, and reports false if a
// live Session of this process has it.
func claimLease(k leaseKey) bool {
	leasesInUse.mu.Lock()
	defer leasesInUse.mu.Unlock()
	if leasesInUse.m[k] {
		return false
	}
	if leasesInUse.m == nil {
		leasesInUse.m = make(map[leaseKey]bool)
	}
	leasesInUse.m[k] = true
	return true
}

// releaseLease forgets a lease claimLease registered: its Session ended.
func releaseLease(k leaseKey) {
	leasesInUse.mu.Lock()
	defer leasesInUse.mu.Unlock()
	delete(leasesInUse.m, k)
}

// nameLock lets one Mutex of a session at a time queue for or hold a name:
// they all share the key name/<lease>, so etcd cannot tell them apart. It
// is kept by value in Session.names, guarded by Session.mu.
type nameLock struct {
	refs int32         // Mutex calls using the name
	held bool          // a Mutex queues for or holds the name
	free chan struct{} // closed when held ends, made only when someone waits for that
	// holder is the queue whose hold has the name, from its admission to
	// its release (a set's lead, on the set's first name): the session's
	// end reports the holds nobody watched (sessionWatcher.end).
	holder *queue
}

// NewSession grants a lease (or adopts one, see WithLease) and starts
// keeping it alive. The keepalive goroutine ends with Close, Orphan, the
// WithContext context, the client's Close, or the end of the lease.
//
// ctx bounds the start alone. NewSession waits for etcd as Lock does: it
// sends its requests again after errors that pass (no leader, a leader
// change, no member in reach) until etcd answers, an error that does not
// pass comes, or ctx ends; then its error matches ctx's. Once NewSession
// has returned, the end of ctx does not touch the session, as with
// net.Dialer's DialContext: WithContext bounds the session's life. A grant
// whose answer was lost on the way leaves a lease that nothing uses; etcd
// drops it a TTL later.
func NewSession(ctx context.Context, cli *clientv3.Client, opts ...SessionOption) (*Session, error) {
	if ctx == nil {
		return nil, errorf("%w: nil context", ErrInvalidOption)
	}
	if cli == nil {
		return nil, errorf("%w: nil client", ErrInvalidOption)
	}
	o, err := newSessionOptions(opts)
	if err != nil {
		return nil, err
	}
	batch := newBatcher(ctx, cli)
	st, err := startLease(ctx, cli, &o)
	if err != nil {
		return nil, err
	}

	// The session ends when the client is closed, as etcd's does: a
	// closed client can renew nothing, and the session would otherwise
	// try until its TTL ran out.
	ctx, stop := context.WithCancelCause(o.ctx)
	unwatch := context.AfterFunc(cli.Ctx(), func() { stop(errClientClosed) })
	endCtx, endCancel := context.WithCancelCause(context.Background())
	s := &Session{
		endCtx:    endCtx,
		endCancel: endCancel,
		watchCtx:  streams.RequireLeader(endCtx),
		cli:       cli,
		keeper:    streams.AcquireKeeper(cli),
		id:        st.id,
		leaseKey:  st.key,
		ttl:       st.ttl,
		donec:     make(chan struct{}),
		stop:      func() { stop(nil) },
		loopDone:  make(chan struct{}),
		deadline:  st.deadline,
		adoptRev:  st.adoptRev,
		names:     make(map[string]nameLock),
		ev:        newReporter(o.hooks, o.logger),
	}
	s.watcher = newSessionWatcher(s)
	s.releaser = newReleaser(s.endCtx)
	batch.end = s.endCtx
	s.batch = batch
	go s.keepAlive(ctx, unwatch)
	return s, nil
}

// A startedLease is the lease NewSession starts a Session with.
type startedLease struct {
	id       clientv3.LeaseID
	key      leaseKey      // claimed (claimLease) for the new Session
	ttl      time.Duration // granted
	deadline time.Time     // the lease lives at least until then
	adoptRev int64         // the revision etcd answered the adopted lease's look-up at
}

// startLease grants the session's lease, or checks and renews the one
// WithLease adopts, within ctx and the session's own context.
func startLease(ctx context.Context, cli *clientv3.Client, o *sessionOptions) (startedLease, error) {
	// The session's context bounds the start too: a session whose
	// context has ended would end at once.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(o.ctx, cancel)()
	defer context.AfterFunc(cli.Ctx(), cancel)()
	started := func(err error) error {
		return startErr(ctx, o.ctx, cli, err)
	}

	if o.lease == 0 {
		sent := time.Now()
		resp, err := retry(ctx, transient, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) {
			return cli.Grant(ctx, ttlSeconds(o.ttl))
		})
		if err != nil {
			return startedLease{}, errorf("grant lease: %w", started(err))
		}
		ttl := time.Duration(resp.TTL) * time.Second
		lk := leaseKey{resp.ResponseHeader.GetClusterId(), resp.ID}
		claimLease(lk) // new: no Session has it
		return startedLease{id: resp.ID, key: lk, ttl: ttl, deadline: sent.Add(ttl)}, nil
	}

	id := o.lease
	resp, err := retry(ctx, transient, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		// The leader answers once it has applied all that was
		// committed: every key an earlier process put under the lease's
		// name was created at or before the answer's revision.
		return cli.TimeToLive(ctx, id)
	})
	if err != nil {
		return startedLease{}, errorf("look up lease %x: %w", id, started(err))
	}
	if resp.TTL < 0 { // -1: no such lease; 0 is a live lease with under 1s left
		return startedLease{}, errorf("%w: lease %x does not exist", ErrSessionExpired, id)
	}
	lk := leaseKey{resp.ResponseHeader.GetClusterId(), id}
	if !claimLease(lk) {
		return startedLease{}, errorf("%w: lease %x is in use by another Session of this process", ErrInvalidOption, id)
	}
	// Renew at once: the lease may have little time left, less than the
	// first renewal interval. Its life counts from each attempt's send.
	var sent time.Time
	ka, err := retry(ctx, transient, func(ctx context.Context) (*clientv3.LeaseKeepAliveResponse, error) {
		sent = time.Now()
		return cli.KeepAliveOnce(ctx, id)
	})
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		releaseLease(lk)
		return startedLease{}, errorf("%w: lease %x does not exist", ErrSessionExpired, id)
	case err != nil:
		releaseLease(lk)
		return startedLease{}, errorf("renew lease %x: %w", id, started(err))
	}
	return startedLease{id: id, key: lk, ttl: time.Duration(resp.GrantedTTL) * time.Second, deadline: sent.Add(time.Duration(ka.TTL) * time.Second), adoptRev: resp.ResponseHeader.GetRevision()}, nil
}

// startErr is the error of a start that failed with err: ctx's or the
// session context's if one of them ended (err then says what etcd did
// last), errClientClosed if the client was closed, else err.
func startErr(ctx, sessionCtx context.Context, cli *clientv3.Client, err error) error {
	var end error
	switch {
	case sessionCtx.Err() != nil:
		end = sessionCtx.Err()
	case cli.Ctx().Err() != nil:
		end = errClientClosed
	case ctx.Err() != nil:
		end = ctx.Err()
	default:
		return err
	}
	if errors.Is(err, end) {
		return err
	}
	return errorf("%w (last: %v)", end, err)
}

// Client returns the etcd client the session was made with.
func (s *Session) Client() *clientv3.Client { return s.cli }

// Lease returns the ID of the session's lease.
func (s *Session) Lease() clientv3.LeaseID { return s.id }

// TTL returns the lease TTL etcd granted (it may round up what was asked).
func (s *Session) TTL() time.Duration { return s.ttl }

// inherits reports whether our key, found under the session's lease's
// name before a lock placed its own, with create revision rev, is a hold
// of the process that used the lease before (WithLease): then its place
// and token are not the lock's to take over. It is when it was created at
// or before the adoption, whatever lease it is bound to now (a WithMaxHold
// hold's key is bound to a lease of its own). A key a cleanup of this
// session left is not: it was created after.
func (s *Session) inherits(rev int64) bool {
	return rev != 0 && rev <= s.adoptRev
}

// Expiry returns the time until which the session's lease is known to
// live: the send time of the newest renewal etcd confirmed (or of the
// grant) plus the TTL etcd granted. etcd extends a lease only when it
// receives a renewal, so it cannot expire the lease, and give the
// session's locks to anyone else, before then; later renewals move it on.
// The session ends a small margin before it if no renewal is confirmed
// meanwhile. Work that must be stopped before the locks can pass on (a
// child process given time to shut down, say) counts back from Expiry.
// After the session ends Expiry no longer moves.
func (s *Session) Expiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// Done returns a channel closed when the session ends: Close, Orphan, the
// WithContext context ending, the client closed, the lease revoked, or the
// lease's life running out without a confirmed renewal. Locks held through
// the session must be taken as lost from then on.
//
// A revoked lease is learned at the next renewal (TTL/3 at most), or at
// once when one of the session's locks sees its key go: the loss watch of
// a hold whose Done was called, a waiting Lock, or Unlock.
func (s *Session) Done() <-chan struct{} { return s.donec }

// Err returns nil while the session runs, and then why it ended: always an
// error matching ErrSessionExpired. An end the program asked for (Close,
// Orphan, the WithContext context's end) also matches ErrSessionClosed,
// and the context's error when that ended the session.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Close ends the session and revokes its lease (and the leases of its
// WithMaxHold holds), which releases every lock of the session at once. It
// waits for the session's goroutines to end (its keepalive, and those
// that finish what a caller whose ctx ended left), so it must not be
// called from within one of the session's requests (a gRPC interceptor
// of its client, say), nor must Orphan. A lease that has already
// expired is not an error; calling Close again does nothing. Close after
// Orphan revokes the lease, as etcd's Session does. If the revoke
// fails (etcd unreachable, or the client already closed), the locks are
// released when the lease expires, at most TTL later, and Close returns
// the error.
//
// Before it ends the session, Close sends the releases that Unlock handed
// to the background (its ctx had ended) and waits for them, for up to 5
// seconds: so Unlock followed at once by Close, even with an ended ctx
// (the usual shutdown after SIGTERM), is a clean release, and a lock
// delay (WithLockDelay) does not begin. A release that a minimum hold
// (WithMinHold) still holds back is sent now, and the rest of the
// minimum hold moves onto a lease of its own. A release etcd has not
// confirmed by then goes with the lease.
func (s *Session) Close() error {
	if s.Err() == nil {
		fctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		s.releaser.flush(fctx)
		cancel()
	}
	s.shutdown()
	s.mu.Lock()
	again := s.revoking
	s.revoking = true
	s.mu.Unlock()
	if again {
		return nil
	}
	if err := s.cli.Ctx().Err(); err != nil {
		// Every RPC on a closed client fails, and etcd's client logs each
		// failure: do not try.
		return errorf("lease %x not revoked: %w: %w", s.id, errClientClosed, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.ttl)
	defer cancel()
	s.mu.Lock()
	gone, extra := s.leaseGone, s.extra
	s.extra = nil
	s.mu.Unlock()
	var errs []error
	if !gone {
		err := s.revoke(ctx, s.id)
		s.mu.Lock()
		s.leaseGone = err == nil
		s.mu.Unlock()
		errs = append(errs, err)
	}
	for id, until := range extra {
		if time.Now().Before(until) { // else it has run out
			errs = append(errs, s.revoke(ctx, id))
		}
	}
	return join(errs...)
}

// revoke revokes lease id unless etcd says it no longer exists. It asks
// first because revoking a lease that is gone fails, and etcd's client
// logs every failed call as a warning: a program that closes its session
// after the lease was revoked must not log one. (A lease that ends between
// the question and the revoke is not an error either, only logged.)
func (s *Session) revoke(ctx context.Context, id clientv3.LeaseID) error {
	resp, err := s.cli.TimeToLive(ctx, id)
	if err == nil && resp.TTL < 0 { // -1: no such lease
		return nil
	}
	if err == nil {
		_, err = s.cli.Revoke(ctx, id)
	}
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return errorf("revoke lease %x: %w", id, err)
	}
	return nil
}

// trackLease records a WithMaxHold lease of one of the session's holds,
// which runs out at until, so that Close revokes it with the session's own.
func (s *Session) trackLease(id clientv3.LeaseID, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.extra == nil {
		s.extra = make(map[clientv3.LeaseID]time.Time)
	}
	s.extra[id] = until
}

// untrackLease forgets a lease trackLease recorded, and reports whether it
// was still recorded: whether the caller, not Close, is to revoke it.
func (s *Session) untrackLease(id clientv3.LeaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.extra[id]
	delete(s.extra, id)
	return ok
}

// Orphan ends the session without revoking its lease: keepalives stop and
// the session's locks are released when the lease expires, TTL from the last
// renewal, or when Close is called. It waits for the keepalive goroutine to
// end. Calling Orphan again, or after Close, does nothing.
func (s *Session) Orphan() { s.shutdown() }

// shutdown stops the keepalive loop and ends the session, and waits for
// the session's watches to end.
func (s *Session) shutdown() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	<-s.loopDone
	s.end(SessionClosed, ErrSessionClosed)
	s.watcher.wait()
	s.releaser.wait()
	s.batch.wait()
	s.mu.Lock()
	s.noSpawn = true
	s.mu.Unlock()
	s.bg.Wait()
}

// end records why the session ended and closes Done, once, and then tells
// the hooks and logger.
func (s *Session) end(cause SessionEnd, err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err, s.cause = err, cause
	close(s.donec)
	s.endCancel(err)
	s.mu.Unlock()
	releaseLease(s.leaseKey)
	if s.ev != nil {
		s.ev.sessionDone(SessionDoneInfo{Lease: s.id, Cause: cause, Err: err})
	}
}

// holdEnd says how a hold of the session ended with err: nil (released),
// or the loss, which names its cause (hold.go) or is the session's end.
func (s *Session) holdEnd(err error) HoldEnd {
	switch {
	case err == nil:
		return Released
	case errors.Is(err, errMaxHold):
		return LostMaxHold
	case errors.Is(err, ErrSessionExpired):
		s.mu.Lock()
		cause := s.cause
		s.mu.Unlock()
		if cause == SessionNotRenewed || cause == SessionLeaseGone {
			return LostLease
		}
		return LostSessionClosed
	case errors.Is(err, errDeleted):
		return LostKeyDeleted
	case errors.Is(err, errRevokedOrExpired):
		return LostLease
	}
	return LostUnknown
}

// expiryMargin is how long before the computed end of its lease a session
// gives up: room for the two clocks to run at slightly different rates.
func (s *Session) expiryMargin() time.Duration {
	return max(100*time.Millisecond, s.ttl/50)
}

// keepAlive renews the lease every TTL/3 until the session is stopped, its
// client is closed, or the lease is known, or must be assumed, to be gone.
// unwatch is called as it returns.
func (s *Session) keepAlive(ctx context.Context, unwatch func() bool) {
	defer close(s.loopDone)
	defer s.keeper.Release()
	defer unwatch()
	interval := s.ttl / 3
	retry := min(interval, 500*time.Millisecond)
	patience := streams.StuckAfter(s.ttl)

	next := time.NewTimer(interval)
	defer next.Stop()
	// expire fires when the lease's known life, less the margin, is over:
	// the session gives up then, in the middle of a renewal too. One timer
	// for the session's life, reset after each renewal, rather than a
	// timer and a context per renewal: renewals are the one thing every
	// idle session does.
	expire := time.NewTimer(time.Hour)
	defer expire.Stop()
	for {
		s.mu.Lock()
		giveUp := s.deadline.Add(-s.expiryMargin())
		s.mu.Unlock()
		expire.Reset(time.Until(giveUp))
		select {
		case <-ctx.Done():
			s.loopEnded(ctx)
			return
		case <-expire.C:
			s.end(SessionNotRenewed, errorf("%w: lease %x not renewed within its TTL", ErrSessionExpired, s.id))
			return
		case <-next.C:
		}

		// The renewal may take no longer than the lease's known life: past
		// that, its answer could not save the session anyway.
		var began time.Time
		if s.ev != nil {
			began = time.Now()
		}
		sent, ttl, err := s.keeper.Renew(ctx, s.id, patience, giveUp, expire.C)
		wait, gone, err := s.renewed(sent, ttl, err, interval, retry)
		next.Reset(wait)
		// A failure because the loop was stopped is no failure to renew.
		if s.ev != nil && (err == nil || ctx.Err() == nil) {
			s.reportRenewal(began, sent, ttl, err)
		}
		if gone {
			s.lost()
			return
		}
	}
}

// loopEnded records why the keepalive loop's ctx ended, unless the
// session is shutting down (Close or Orphan: shutdown sets the reason).
func (s *Session) loopEnded(ctx context.Context) {
	switch {
	case s.shuttingDown():
	case errors.Is(context.Cause(ctx), errClientClosed):
		// The lease lives on until its TTL runs out: there is no client
		// left to revoke it with.
		s.end(SessionClientClosed, errorf("%w: %w", ErrSessionExpired, errClientClosed))
	default:
		s.end(SessionContextEnded, errorf("%w: its context ended: %w", ErrSessionClosed, ctx.Err()))
	}
}

// renewed takes in the outcome of a renewal sent at sent (ttl granted, or
// err): a confirmed renewal moves the deadline. It returns how long to
// wait before the next, whether etcd said the lease is gone, and the
// error to report (the lease's end, when gone).
func (s *Session) renewed(sent time.Time, ttl int64, err error, interval, retry time.Duration) (time.Duration, bool, error) {
	switch {
	case err == nil && ttl > 0:
		s.mu.Lock()
		if d := sent.Add(time.Duration(ttl) * time.Second); d.After(s.deadline) {
			s.deadline = d
		}
		s.mu.Unlock()
		return max(0, interval-time.Since(sent)), false, nil
	case err == nil: // etcd answers TTL 0 or less for a lease it does not have
		return 0, true, s.goneErr()
	case errors.Is(err, streams.ErrStreamBroken):
		// The request proves nothing and its stream is gone (it broke,
		// or was given up as stuck): ask again at once. The new request
		// waits for the keeper's next stream, and the keeper paces its
		// streams with its backoff; waiting here too would only spend
		// the lease's life (see streams.StuckAfter).
		return 0, false, err
	}
	// etcd unreachable or busy: try again soon, until the deadline.
	return retry, false, err
}

// reportRenewal tells the hooks and logger of a renewal attempt that began
// at began: sent at sent with ttl granted, or failed with err.
func (s *Session) reportRenewal(began, sent time.Time, ttl int64, err error) {
	now := time.Now()
	i := RenewDoneInfo{Lease: s.id, Latency: now.Sub(began), Err: err}
	if err == nil {
		i.Latency, i.TTL = now.Sub(sent), time.Duration(ttl)*time.Second
	}
	if !errors.Is(err, ErrSessionExpired) {
		s.mu.Lock()
		i.Left = max(0, s.deadline.Sub(now))
		s.mu.Unlock()
	}
	s.ev.renewDone(i)
}

func (s *Session) shuttingDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// bound returns a context that ends with ctx or with the session, whichever
// comes first, and its cancel function. Calls that block for a lock use it,
// so that no RPC outlives the session that made it.
func (s *Session) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(s.endCtx, func() { cancel(context.Cause(s.endCtx)) })
	return bctx, func() {
		stop()
		cancel(nil)
	}
}

// callerErr returns the error of ctx, a context bound to the session
// (bound), if it ended by its own doing: nil while it lasts, and when the
// session's end is what ended it first.
func (s *Session) callerErr(ctx context.Context) error {
	err := ctx.Err()
	if err != nil && s.Err() != nil && context.Cause(ctx) == context.Cause(s.endCtx) {
		return nil
	}
	return err
}

// lost ends the session because etcd says its lease is gone, and notes
// that there is no lease left for Close to revoke.
func (s *Session) lost() {
	s.mu.Lock()
	s.leaseGone = true
	s.mu.Unlock()
	s.end(SessionLeaseGone, s.goneErr())
}

// goneErr is the session's error when etcd says its lease is gone.
func (s *Session) goneErr() error {
	return errorf("%w: lease %x was revoked or expired", ErrSessionExpired, s.id)
}

// acquireName takes the session-local right to queue for name. With wait it
// blocks until the right is free, ctx ends or the session ends; without, it
// returns ErrLocked if another Mutex of the session queues for or holds
// name. ctx must be bound to the session (bound), so that waiting ends with
// it. Give the right back with releaseName, exactly once.
func (s *Session) acquireName(ctx context.Context, name string, wait bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	nl := s.names[name]
	nl.refs++
	for nl.held {
		if !wait {
			s.unrefName(name, nl)
			return ErrLocked
		}
		if nl.free == nil {
			nl.free = make(chan struct{})
		}
		s.names[name] = nl
		s.mu.Unlock()
		select {
		case <-nl.free:
			s.mu.Lock()
			nl = s.names[name]
		case <-ctx.Done(): // ctx is bound to the session: this is its end too
			s.mu.Lock()
			s.unrefName(name, s.names[name])
			return ctx.Err()
		}
	}
	nl.held = true
	s.names[name] = nl
	return nil
}

// releaseName gives back the right to name that acquireName took.
func (s *Session) releaseName(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nl := s.names[name]
	nl.held, nl.holder = false, nil
	if nl.free != nil {
		close(nl.free)
		nl.free = nil
	}
	s.unrefName(name, nl)
}

// holding records q, whose take has just admitted a hold, as the holder
// of its name (see nameLock.holder), and returns the session's error: not
// nil if it has ended, whose end may then have passed q by.
func (s *Session) holding(q *queue) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if nl, ok := s.names[q.lockName()]; ok && nl.held {
		nl.holder = q
		s.names[q.lockName()] = nl
	}
	return s.err
}

// holders returns the queues that hold a name of the session (holding).
func (s *Session) holders() []*queue {
	s.mu.Lock()
	defer s.mu.Unlock()
	var qs []*queue
	for _, nl := range s.names {
		if nl.holder != nil {
			qs = append(qs, nl.holder)
		}
	}
	return qs
}

// unrefName stores nl, the state of name, less one reference, and forgets
// name with the last one. Called with s.mu held.
func (s *Session) unrefName(name string, nl nameLock) {
	nl.refs--
	if nl.refs == 0 {
		delete(s.names, name)
		return
	}
	s.names[name] = nl
}
