package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The minimum hold (WithMinHold): a release that Unlock asks for before
// the hold is d old waits, in the session's releaser, until it is; the
// hold's record (delay.go) keeps waiters out if the holder dies first.
//
// etcd learns a time only from a lease request, and no Txn the engine
// sends anyway can carry one: timing an early Unlock with a lease would
// cost a Grant per hold, and a lease's whole seconds (etcd's minimum TTL
// is 2 s by default) could not keep a job that runs every second to
// once per tick. So the holder's monotonic clock counts d from the answer
// that admitted it, which etcd sent after it applied the admission: the
// key goes no sooner than d after the admission. No other machine's
// clock is read or compared, and a wall clock's steps do not reach a
// monotonic one; a pause of the holder only makes the hold longer. When
// the holder cannot count (it crashed, it was cut off, its session ended
// or Close came first) etcd counts: the record says how long, and the
// next waiter starts it on a lease, as a lock delay (delay.go); Close
// moves the rest onto a lease itself (leaveToLease).

// WithMinHold keeps the lock taken until d after each hold was admitted,
// even after Unlock: no other hold of the lock is admitted sooner, whether
// the holder unlocks early, crashes or is cut off. A hold longer than d
// releases as usual. It makes a scheduled job run once per tick across
// replicas whose clocks disagree: the first replica to fire takes the
// lock, and the others, firing up to the clocks' skew later, find it
// taken (see docs/operations.md for choosing d).
//
// Unlock before d returns at once, without an RPC: the session deletes
// the key when d has passed since the admission, by the holder's
// monotonic clock (never its wall clock, and no other machine's), in the
// one release RPC that Unlock would have sent. Until then the Mutex is no
// longer held (Token is 0), Done closes when the key goes, a Lock of the
// same session and name waits for it, and a TryLock of another session
// returns ErrLocked with one read-only RPC. Unlock reports a loss it
// knows of then (the loss watch's, the session's end); one found when the
// key goes reaches Done and Hooks only. Session.Close before d has passed
// moves the rest of the minimum hold onto an etcd lease of its own
// (whole seconds, 2 s at least on a default etcd) and deletes the key,
// so that a replica may shut down at once.
//
// If the holder dies or is cut off before d has passed, etcd counts
// instead: each hold writes a record under LockDelayPrefix, as
// WithLockDelay does (in the Txn that admits it where it can, no RPC of
// its own), and once its key has gone with the lease the next Lock waits
// d more on an etcd lease from when it finds the key gone, on the safe
// side (a TryLock then returns ErrLocked and starts it: for a scheduler,
// a skipped tick). A hold that outlives d drops its record then, in one
// RPC of its own, so that a holder that dies later owes nothing. Give the option, with
// the same d, to every Mutex of the lock: a Mutex without it, etcd's
// Mutex, `etcdctl lock`, a MultiMutex and an Election read no records:
// a holder that dies within its minimum hold lets them in as soon as its
// key is gone.
//
// With WithLockDelay the record asks for the longer of the two after a
// hold that ended without Unlock; a clean Unlock leaves only the minimum
// hold. WithMaxHold must exceed d by at least a second plus the session's
// margin (TTL/50, 100ms at least). It is refused on an RWMutex, a
// Semaphore and a MultiMutex: a pending record keeps every waiter out, so
// a reader's or a permit's minimum hold would become an exclusive one.
// Values below a millisecond or above MaxLockDelay are an error. Default:
// none.
func WithMinHold(d time.Duration) MutexOption {
	return func(o *mutexOptions) error {
		switch {
		case d < time.Millisecond:
			return errorf("%w: minimum hold %v is below 1ms", ErrInvalidOption, d)
		case d > MaxLockDelay:
			return errorf("%w: minimum hold %v is above the maximum %v", ErrInvalidOption, d, MaxLockDelay)
		}
		o.minHold = d
		return nil
	}
}

// minHoldGuard is the minimum hold's guard: it refuses a minimum hold
// where it makes no sense, and at admission has the record dropped when
// the hold outlives it (outliveMinHold). Its record is recordGuard's; its
// hold-back, the release's (release.go).
type minHoldGuard struct{}

func (minHoldGuard) admitted(_ context.Context, q *queue, h *hold, _ bool) error {
	q.outliveMinHold(h)
	return nil
}

// check refuses a minimum hold where it makes no sense.
func (minHoldGuard) check(q *queue) error {
	switch o := q.opts; {
	case o.kind != KindMutex && o.kind != KindShard:
		return errorf("%w: a minimum hold is for a Mutex (a pending one keeps every waiter out)", ErrInvalidOption)
	case o.maxHold > 0 && o.maxHold < o.minHold+minHoldBelowMax(q.s):
		// An early Unlock's release comes at the minimum hold's end;
		// the max hold must not end the hold first (its holder is told
		// a margin before the lease ends).
		return errorf("%w: max hold %v must exceed the minimum hold %v by at least %v", ErrInvalidOption, o.maxHold, o.minHold, minHoldBelowMax(q.s))
	}
	return nil
}

// minHoldLeft returns how long h's minimum hold still lasts: 0 when q
// has none or it has passed.
func (q *queue) minHoldLeft(h *hold) time.Duration {
	if q.opts.minHold == 0 {
		return 0
	}
	return max(0, q.opts.minHold-(monotime()-h.since))
}

// outliveMinHold has the releaser drop h's record once h's minimum hold
// has passed, if h is still held then: a holder that dies after that owes
// the next holder no minimum hold, and a record left pending would make
// the next Lock wait it out again, from when it finds the key gone (for a
// scheduler, a skipped tick). With a lock delay the record stays, asking
// for the delay alone. A hold released before then needs nothing: its
// release deletes the record. It costs one RPC, only for a hold that
// outlives its minimum hold.
func (q *queue) outliveMinHold(h *hold) {
	until := time.Now().Add(q.minHoldLeft(h))
	q.s.releaser.addAt(until, func() bool {
		q.mu.Lock()
		held := h.held()
		q.mu.Unlock()
		if !held || q.s.Err() != nil || time.Now().Before(until) {
			return true // released, or the session ends (Close flushes): the record stays
		}
		actx, cancel := context.WithTimeout(q.s.endCtx, cleanupTimeout)
		defer cancel()
		rec := clientv3.OpDelete(delayKey(q.key))
		if q.opts.delay > 0 {
			rec = clientv3.OpPut(delayKey(q.key), delayValue(h.rev, ttlSeconds(q.opts.delay), 0))
		}
		_, err := q.s.cli.Txn(actx).If(q.ownCmps(h.rev)...).Then(rec).Commit()
		return err == nil || q.s.Err() != nil
	})
}

// minHoldBelowMax is how much longer than a minimum hold a max hold on
// session s must be: the margin before its end at which the holder is
// told it has passed, and a second for the release.
func minHoldBelowMax(s *Session) time.Duration { return s.expiryMargin() + time.Second }

// leaveToLease deletes the key of the hold created at rev, if it is
// still that hold's, and puts the hold's record, asking for left (rounded
// up to seconds), on a lease of that TTL in the same Txn: the record
// keeps waiters out until etcd ends the lease. A lease whose Txn fails is
// left to run out.
func (q *queue) leaveToLease(ctx context.Context, rev int64, left time.Duration) (*clientv3.TxnResponse, error) {
	secs := ttlSeconds(left)
	g, err := q.s.cli.Grant(ctx, secs)
	if err != nil {
		return nil, err
	}
	// The record asks for the rest, which its lease times.
	return q.s.cli.Txn(ctx).
		If(q.ownCmps(rev)...).
		Then(clientv3.OpDelete(q.key), clientv3.OpPut(delayKey(q.key), delayValue(rev, secs, q.opts.minHold), clientv3.WithLease(g.ID))).
		Commit()
}
