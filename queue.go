package etcdlock

import (
	"context"
	"fmt"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The queue engine's entry: a lock's name is checked and its hold taken
// here (lock, take); the parts take calls, in the order a Lock meets them,
// are listed on the queue type.

// A queue is the mechanism every primitive shares: a key per session under
// name/, placed in line by its create revision; a grant rule per key mode
// that says, given the keys ahead, which of them keep a key out (its
// blockers); a waiter that watches exactly its blockers and its own key;
// and the hold that follows, with its loss watch. Mutex, RWMutex and
// Semaphore embed a queue and only state their rule.
//
// Its parts, in the order a Lock meets them: this file takes a hold
// (lock, take); place.go puts the key in line; queueread.go reads the
// queue ahead of it (pages: page.go) and applies the rule; wait.go waits
// for the turn; try.go is the Try forms; hold.go is the hold and its
// loss, holdstate.go its states, release.go its release; retry.go says
// which errors pass and how long to pause.
//
// Invariant K: no code changes the mode (the value) of an existing key.
// Everything that Puts an existing key keeps its value; a key of this
// session left in another mode is deleted and created again. The one
// exception, Election.Proclaim, changes a value but never a mode: every
// election value reads as exclusive (checkValue). Every rule's
// blockers are a witness only while the keys ahead keep their modes: a
// waiter is not woken when a key it does not watch changes.
type queue struct {
	s *Session
	// key is the lock's prefix (its name and "/") then the session's
	// lease ID in hex; only the prefix when there is no session. One
	// string for the three: a held lock keeps one queue.
	key  string
	plen int // len of the prefix

	opts *mutexOptions // read-only: may be shared (newMutexOptions)

	mu   sync.Mutex // guards h, last, and the fields of holds marked so
	h    *hold      // the current hold; nil when not held
	last *hold      // the hold that ended last, for Done and Err

	// set is the MultiMutex q is a part of, nil for every other
	// primitive. Its first part (set.lead) owns the hold, its mu and the
	// session-local rights of every name; the others only carry their
	// name's key and prefix (see multimutex.go).
	set *multiSet

	// testHookWait, when set, is called each time a waiter has set up its
	// watches and blocks for an event, with the keys it watches: its
	// blockers, or the prefix when it watches the whole lock. Tests use it
	// to know waiters are idle.
	testHookWait func(keys []string)
}

// init sets q up for the lock name of kind taken through s. (Not a
// constructor returning a queue: a queue holds a sync.Mutex and must not
// be copied.)
func (q *queue) init(s *Session, name string, kind Kind, opts []MutexOption) {
	q.s, q.key, q.plen, q.opts = s, name+"/", len(name)+1, newMutexOptions(kind, opts)
	if s != nil {
		q.key = fmt.Sprintf("%s%x", q.key, int64(s.Lease()))
	}
}

// self returns q; through promotion, any primitive has it (export_test.go).
func (q *queue) self() *queue { return q }

// lock is Lock, RLock and Acquire (wait) and their Try forms: it takes a
// hold in mode.
func (q *queue) lock(ctx context.Context, mode KeyMode, wait bool) error {
	return q.lockValue(ctx, mode, q.value(mode), wait)
}

// lockValue is lock with the key's value given: q.value(mode), or an
// election's proposal (whose mode, read back, is exclusive). With the
// session's events, it reports the acquisition (reported).
func (q *queue) lockValue(ctx context.Context, mode KeyMode, val string, wait bool) error {
	if err := q.validate(); err != nil {
		return err
	}
	// A writer cannot be admitted while this value holds a read: it would
	// wait for itself (sync.RWMutex deadlocks here), and turning the read
	// key exclusive in place would let it in among the readers behind it.
	if mode.Exclusive() && q.holding(func(m KeyMode) bool { return m.Shared }) {
		return ErrUpgrade
	}
	if q.s.ev != nil {
		return q.reported(ctx, mode, val, wait)
	}
	h, err := q.take(ctx, mode, val, wait)
	if err == nil {
		q.keep(h)
	}
	return err
}

// reported is lockValue for a session with events: it reports the
// acquisition (Hooks.AcquireStart and AcquireDone) around take. It is a
// function of its own so that the events' structs stay out of the stack
// frame a waiter without events keeps while it waits: with them, a
// waiting goroutine's stack could not shrink back to its initial size.
//
//go:noinline
func (q *queue) reported(ctx context.Context, mode KeyMode, val string, wait bool) error {
	ev := q.s.ev
	li := LockInfo{Kind: q.opts.kind, Name: q.label(), Mode: mode}
	if mode.Shared {
		li.Kind = KindRWMutexRead
	}
	ev.acquireStart(AcquireStartInfo{LockInfo: li, Wait: wait, Context: ctx})
	start := monotime()
	h, err := q.take(ctx, mode, val, wait)
	done := AcquireDoneInfo{LockInfo: li, Wait: wait, Outcome: outcome(ctx, err), Err: err, Context: ctx}
	now := monotime()
	done.Waited = now - start
	if h != nil {
		h.kind, h.since, done.Token, done.Key = li.Kind, now, h.rev, q.owner().key
	}
	// Called before the hold is q's: its HoldDone cannot come first.
	ev.acquireDone(done)
	if h != nil {
		q.keep(h)
	}
	return err
}

// keep makes h, just admitted, q's hold, and notes q as the holder of its
// name, so that the session's end reports h if nobody watched it
// (sessionWatcher.end). An end that came before the note passed q by: then
// the session has ended by now, and h ends as lost here, as end would
// have ended it (lose reports a hold once, whoever comes second).
func (q *queue) keep(h *hold) {
	q.mu.Lock()
	q.h = h
	q.mu.Unlock()
	if q.s.holding(q) != nil {
		q.lose(h, context.Cause(q.s.endCtx))
	}
}

// take is lockValue's acquisition, once the call is found valid: it
// returns the hold, which lockValue makes q's. A refusal by etcd is
// explained (refusedErr) on the way out.
func (q *queue) take(ctx context.Context, mode KeyMode, val string, wait bool) (_ *hold, err error) {
	defer func() {
		if refused(err) {
			err = q.refusedErr(ctx, err)
		}
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := q.s.Err(); err != nil {
		return nil, err
	}
	// Stop waiting, and stop any RPC, as soon as the session ends.
	bctx, cancel := q.s.bound(ctx)
	defer cancel()
	// The right is per session and name, across primitives: they all share
	// the key name/<lease>, so one hold per session and name holds for
	// every mix of them.
	if err := q.acquireNames(bctx, wait); err != nil {
		return nil, q.cause(ctx, err)
	}
	var in admission
	if c := q.claim(); wait {
		in, err = c.acquire(bctx, q, mode, val)
	} else {
		in, err = c.try(bctx, q, mode, val)
	}
	if err != nil {
		if !isHandedOff(err) {
			// (A write handed off keeps the right to the name until
			// the session has undone it: see writeOrHandOff.)
			q.releaseNames()
		}
		return nil, q.cause(ctx, err)
	}
	// since: the answer that admitted it has come, no sooner.
	h := &hold{rev: in.rev, mode: mode, hdr: headerOf(in.hdr), since: monotime()}
	for _, g := range q.opts.guards {
		if err := g.admitted(bctx, q, h, in.recorded); err != nil {
			err = q.fail(bctx, in.rev, err)
			q.releaseNames()
			return nil, q.cause(ctx, err)
		}
	}
	return h, nil
}

// holding reports whether q holds, in a mode match accepts.
func (q *queue) holding(match func(KeyMode) bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.h != nil && match(q.h.mode)
}

// validate is a Lock's first stage: a session, valid options, then what
// the claim refuses (a name, a set's names) and what each guard does.
func (q *queue) validate() error {
	if q.s == nil {
		return errorf("%w: no Session", ErrSessionExpired)
	}
	if q.opts.err != nil {
		return q.opts.err
	}
	if err := q.claim().check(q); err != nil {
		return err
	}
	for _, g := range q.opts.guards {
		if err := g.check(q); err != nil {
			return err
		}
	}
	return nil
}

// IsOwner returns a comparison that holds only while the current hold is
// current: use it in Txn().If to make a write conditional on the lock.
// When nothing is held the comparison never holds. Under an RWMutex's read
// lock it guards reads; guard writes only under a write lock.
func (q *queue) IsOwner() clientv3.Cmp {
	rev := int64(-1) // no key has create revision -1; 0 would match a missing key
	q.mu.Lock()
	if q.h != nil {
		rev = q.h.rev
	}
	q.mu.Unlock()
	return clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)
}

// Key returns the key used in etcd: name/<lease ID in hex>.
func (q *queue) Key() string {
	if q.s == nil {
		return ""
	}
	return q.key
}

// Header returns the header of the etcd response that showed the current
// hold was admitted (a copy, new at each call), or nil when nothing is
// held.
func (q *queue) Header() *pb.ResponseHeader {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h == nil {
		return nil
	}
	return q.h.hdr.proto()
}

// Token returns the fencing token of the current hold: the create revision
// of the holder's key. A hold admitted after a hold that excludes it has a
// larger token (successive Mutex holders' tokens strictly increase), so a
// resource that remembers the highest token it has seen can reject a
// stale holder. Token returns 0 when nothing is held; after a loss it
// returns the lost hold's token until it is released.
func (q *queue) Token() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h == nil {
		return 0
	}
	return q.h.rev
}
