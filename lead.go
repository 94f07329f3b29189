package etcdlock

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lead, the loop of a primary/standby service: campaign with a session of
// its own, run fn while leader, resign, and campaign again.

// A LeadOption configures Lead. An invalid value makes Lead return an
// error wrapping ErrInvalidOption.
type LeadOption func(*leadOptions) error

// leadOptions holds Lead's settings; Lead sets the defaults.
type leadOptions struct {
	session  []SessionOption
	ttl      time.Duration // the TTL session sets: it bounds each Grant
	observer func(Leader)
	yield    bool // YieldOnRequest

	// testHookReturned, when set, is called once fn has returned and
	// its term's end is decided, before the watch of the term stops.
	testHookReturned func(fctx context.Context, e *Election)
}

// WithSessionOptions sets the options of the sessions Lead makes, one per
// candidacy: WithTTL sets how long a dead leader keeps the leadership.
// WithLease is an error (each candidacy needs a lease of its own), and
// WithContext is overridden (Lead ends each session itself, after it
// resigned). Default: none, so the TTL is DefaultTTL.
func WithSessionOptions(opts ...SessionOption) LeadOption {
	return func(o *leadOptions) error {
		so := defaultSessionOptions()
		for _, opt := range append(o.session[:len(o.session):len(o.session)], opts...) {
			if err := opt(&so); err != nil {
				return err
			}
		}
		if so.lease != 0 {
			return errorf("%w: WithLease: each candidacy of Lead needs a lease of its own", ErrInvalidOption)
		}
		o.session = append(o.session, opts...)
		o.ttl = so.ttl
		return nil
	}
}

// WithObserver makes Lead call f with each state of the election, as
// ObserveLeader yields them (a new leader, a new value, no leader), from
// one goroutine, in order, while Lead runs: what client-go's
// OnNewLeader gives. f must not block for long: later states wait for it.
// Default: no observer.
func WithObserver(f func(Leader)) LeadOption {
	return func(o *leadOptions) error {
		if f == nil {
			return errorf("%w: nil observer", ErrInvalidOption)
		}
		o.observer = f
		return nil
	}
}

// YieldOnRequest makes Lead step down when its leadership is asked to
// (RequestRelease on the election's name): it cancels fn's ctx with a
// context.Cause matching ErrReleaseRequested, waits for fn to return,
// resigns, so that the next candidate in line is elected at once, and
// campaigns again at the back of the line, whatever fn returned. A deploy
// that asks the leader to step down thus moves the leadership once, to
// the next in line. A request that comes once fn has returned cancels
// nothing: Lead returns fn's error, as without the option (see Lead).
// Default: a request cancels nothing; fn may watch for it
// (Term.ReleaseRequested) and decide.
func YieldOnRequest() LeadOption {
	return func(o *leadOptions) error {
		o.yield = true
		return nil
	}
}

// A Term is one leadership won by Lead: the ctx Lead gives fn carries it
// (TermFromContext). Its Leader is the leadership as won: Key, Lease and
// Token are the leader key's, Value the value Lead campaigns with, and
// Revision the etcd revision at which the campaign was won.
//
// Token is the term's fencing token: a later term of the election, this
// process's or another's, has a larger one. Pass it along with writes
// outside etcd, and have the resource reject tokens lower than the highest
// it has accepted. Guard writes to etcd with IsOwner.
type Term struct {
	Leader
	e *Election // the term's candidacy; nil in a Term Lead did not win
}

// ReleaseRequested returns a channel closed when the term is asked to end
// (RequestRelease on the election's name): see Election.ReleaseRequested.
// With YieldOnRequest, Lead also ends fn then. The zero Term's is nil,
// which never closes.
func (t Term) ReleaseRequested() <-chan struct{} {
	if t.e == nil {
		return nil
	}
	return t.e.ReleaseRequested()
}

// IsOwner returns a comparison that holds only while t's key exists
// unchanged (the same create revision, t's Token): use it in Txn().If so
// that etcd applies a write only while the term lasts. Once the key is
// deleted, by a resign, a lease that ended or anyone else, it never holds
// again, even if a key of that name is created anew. The zero Term names
// no key: etcd refuses a Txn with its comparison, with an error.
func (t Term) IsOwner() clientv3.Cmp {
	rev := t.Token
	if rev <= 0 {
		// Not a term Lead won. No key has create revision -1; 0 would
		// match a missing key.
		rev = -1
	}
	return clientv3.Compare(clientv3.CreateRevision(t.Key), "=", rev)
}

// termKey is the context key under which Lead gives fn its Term.
type termKey struct{}

// TermFromContext returns the Term of the Lead whose fn was given ctx, or
// a context derived from it, and true; for any other ctx it returns the
// zero Term and false. The Term stays the same after the term ends: check
// ctx.Done, and guard writes with IsOwner or Token.
func TermFromContext(ctx context.Context) (Term, bool) {
	t, ok := ctx.Value(termKey{}).(Term)
	// Each caller gets a Value of its own: a change to one never shows
	// in the Term that later callers get.
	t.Value = bytes.Clone(t.Value)
	return t, ok
}

// Lead keeps this process a candidate in the election called name, with
// value as its proposal, and runs fn whenever it is the leader: the loop
// of a primary/standby service.
//
//   - fn's ctx is cancelled the moment the leadership is lost (lease
//     expired or revoked, key deleted, etcd out of reach past the session's
//     margin), before anyone else can be elected, with a context.Cause
//     matching ErrLockLost. fn must return promptly then: the next leader
//     is elected when the lease runs out, whether fn has returned or not.
//   - fn's ctx carries the term it runs for: TermFromContext returns its
//     key, lease and fencing token (Term.Token), and Term.IsOwner guards
//     fn's writes to etcd. fn's ctx ending is no mutual exclusion by
//     itself (a paused fn may still write after a successor was elected):
//     fence fn's writes with the term.
//   - fn never runs twice at once: Lead waits for fn to return before it
//     campaigns again.
//   - After a loss, or a failed Campaign, Lead campaigns again with a fresh
//     Session, after a backoff (50ms, doubling up to 5s; reset by a term
//     that lasted that long), until ctx ends. A fresh Session's Grant that
//     etcd does not answer within the TTL is given up, and tried again
//     after the backoff: a Grant sent into a dead link never blocks Lead.
//   - If fn returns before Lead has cancelled its ctx, Lead resigns and
//     returns fn's error (nil included), even if the leadership is lost
//     or a request comes as fn returns: fn is not run again for them.
//     Once Lead has cancelled fn's ctx (a loss, or a request with
//     YieldOnRequest), the term ends for that cause, whatever fn returns
//     then (nil included): Lead campaigns again, and runs fn again when
//     it wins. To stop Lead, end its ctx.
//   - A request to step down (RequestRelease) closes the term's
//     ReleaseRequested; with YieldOnRequest, Lead ends fn (cause
//     ErrReleaseRequested), resigns, and campaigns again at once, at the
//     back of the line.
//   - When ctx ends, Lead waits for fn to return, resigns (the next
//     candidate wins at once) and returns ctx's error.
//   - Lead resigns before it ends the session, so that Hooks report the
//     term's end as Released, not as a loss. It then revokes the session's
//     lease. If etcd is out of reach, the resign gives up after 5s or when
//     the session ends, whichever comes first, and the lease, not revoked,
//     expires on its own within the TTL.
//
// There is no "stopped leading" callback: fn's return is the end of a
// term, so nothing runs for a term that never began (client-go's
// OnStoppedLeading is called even then).
//
// Lead returns at once, with the error, for an invalid name, value or
// option, and when etcd denies the election's keys (permission) or cli is
// closed; every other error passes with a new candidacy. With
// WithObserver, it also returns the error that ends the observation.
func Lead(ctx context.Context, cli *clientv3.Client, name, value string, fn func(ctx context.Context) error, opts ...LeadOption) error {
	o := leadOptions{ttl: DefaultTTL}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return err
		}
	}
	switch {
	case cli == nil:
		return errorf("%w: nil client", ErrInvalidOption)
	case fn == nil:
		return errorf("%w: nil fn", ErrInvalidOption)
	}
	if err := checkName(name); err != nil {
		return err
	}
	if err := checkValue(value); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if o.observer != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			for l, err := range ObserveLeader(ctx, cli, name) {
				if err != nil {
					cancel(err) // ends Lead, unless ctx ended first
					return
				}
				o.observer(l)
			}
		}()
		defer func() {
			cancel(nil)
			<-done
		}()
	}
	const maxLeadBackoff = 5 * time.Second
	backoff := minBackoff
	for {
		started := time.Now()
		again, err := term(ctx, cli, name, value, fn, &o)
		if !again {
			return err
		}
		if errors.Is(err, ErrReleaseRequested) {
			// Yielded: the next candidate leads; join the line at once.
			backoff = minBackoff
			continue
		}
		if time.Since(started) > maxLeadBackoff {
			backoff = minBackoff
		}
		if !pauseUpTo(ctx, &backoff, maxLeadBackoff) {
			return context.Cause(ctx)
		}
	}
}

// term is one candidacy of Lead, with a session of its own: it campaigns,
// runs fn while leader, resigns and ends the session. It reports whether
// Lead is to campaign again, and otherwise what Lead returns.
func term(ctx context.Context, cli *clientv3.Client, name, value string, fn func(ctx context.Context) error, o *leadOptions) (again bool, _ error) {
	// The session is not bound to ctx: when ctx ends, fn's ctx ends, and
	// the session must outlive fn's return for the resign, so that Hooks
	// see a release and not a session_closed loss. term ends it. The Grant
	// is bound to ctx, and to the TTL: a Grant sent into a dead link is
	// never answered (its lease, granted that late, would have little
	// life left anyway), and Lead tries again after a backoff.
	gctx, cancelGrant := context.WithTimeout(ctx, o.ttl)
	sopts := append(o.session[:len(o.session):len(o.session)], WithContext(context.WithoutCancel(ctx)))
	s, err := NewSession(gctx, cli, sopts...)
	cancelGrant()
	if err != nil {
		return leadAgain(ctx, cli, err)
	}
	e := NewElection(s, name)
	if err := e.Campaign(ctx, value); err != nil {
		endSession(s, nil)
		return leadAgain(ctx, cli, err)
	}

	// The term as won, read once for fn: e is private to this candidacy
	// and only the resign after fn returns clears its hold, so these are
	// this term's even after a loss. (Header is then never nil; a nil one
	// would only leave Revision 0.)
	won := Term{Leader{Key: e.Key(), Value: []byte(value), Lease: s.Lease(), Token: e.Token()}, e}
	if hdr := e.Header(); hdr != nil {
		won.Revision = hdr.Revision
	}
	fnErr, lost := runTerm(ctx, won, name, fn, o)

	// Resign, also after a loss (it then only forgets the leadership).
	// It is bounded, as release.go's unlock attempts are, and by the session:
	// once the session has ended, the key goes with the lease.
	rctx, cancelResign := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	bctx, unbind := s.bound(rctx)
	rerr := e.Resign(bctx)
	unbind()
	cancelResign()
	endSession(s, rerr)
	switch {
	case ctx.Err() != nil:
		return false, context.Cause(ctx)
	case lost != nil:
		return true, lost
	}
	return false, fnErr
}

// runTerm runs fn for the term won, with a ctx that carries it and that
// ends, with its cause, when the leadership is lost or, with
// YieldOnRequest, asked to end. It returns fn's error, and the cause that
// ended fn's ctx before fn returned (nil: fn returned on its own).
func runTerm(ctx context.Context, won Term, name string, fn func(ctx context.Context) error, o *leadOptions) (fnErr, lost error) {
	e := won.e
	fctx, cancel := context.WithCancelCause(context.WithValue(ctx, termKey{}, won))
	var asked <-chan struct{} // nil: never
	if o.yield {
		asked = e.ReleaseRequested()
	}
	// One rule decides how the term ended: by a cause that cancelled
	// fn's ctx before fn returned (a loss, a request with YieldOnRequest),
	// whatever fn returns then, or by fn's return. A cause that comes once
	// fn has returned cancels nothing: fn's return stands (nil included),
	// and fn is not run again for it.
	var mu sync.Mutex
	returned := false // guarded by mu
	end := func(cause error) {
		mu.Lock()
		defer mu.Unlock()
		if !returned {
			cancel(cause)
		}
	}
	finished := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-e.Done():
			err := e.Err() // matches ErrLockLost
			if err == nil {
				err = errorf("%w: leadership of %s ended", ErrLockLost, name)
			}
			end(err)
		case <-asked:
			end(errorf("%w: leadership of %s", ErrReleaseRequested, name))
		case <-finished:
		}
	}()
	fnErr = fn(fctx)
	mu.Lock()
	returned = true
	lost = context.Cause(fctx)
	mu.Unlock()
	if o.testHookReturned != nil {
		o.testHookReturned(fctx, e)
	}
	close(finished)
	<-watcherDone
	cancel(nil)
	return fnErr, lost
}

// endSession ends a term's session s once its election was resigned with
// error rerr: Close revokes the lease, unless the session has ended
// already or the resign failed (etcd out of reach: a revoke would wait
// for the TTL too), and then Orphan leaves it to expire.
func endSession(s *Session, rerr error) {
	if s.Err() != nil || rerr != nil && !errors.Is(rerr, ErrLockLost) {
		s.Orphan()
		return
	}
	s.Close()
}

// leadAgain reports whether Lead campaigns again after err, and
// otherwise returns what Lead returns.
func leadAgain(ctx context.Context, cli *clientv3.Client, err error) (bool, error) {
	switch {
	case ctx.Err() != nil:
		return false, context.Cause(ctx)
	case cli.Ctx().Err() != nil:
		return false, errorf("%w: %w", errClientClosed, err)
	case errors.Is(err, ErrInvalidOption), errors.Is(err, rpctypes.ErrPermissionDenied),
		errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrInvalidAuthToken),
		errors.Is(err, rpctypes.ErrUserEmpty):
		return false, err
	}
	return true, err
}
