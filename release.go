package etcdlock

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The release of a hold, by Unlock or by the session's releaser. The
// hold's states and their transitions are in holdstate.go.

// unlock ends the current hold if match accepts its mode (nil: any). op
// names the caller for errors ("RUnlock"). A hold of another mode stays
// held: RUnlock of a write lock returns ErrLockReleased, as does Unlock of
// a read lock. See Mutex.Unlock for what it returns.
func (q *queue) unlock(ctx context.Context, match func(KeyMode) bool, op string) error {
	q.mu.Lock()
	h := q.h
	switch {
	case h == nil:
		return q.unlockNone(ctx, op) // unlocks q.mu
	case h.state == holdUnlocking || h.state == holdDowngrading:
		q.mu.Unlock()
		return ErrLockReleased // another call is under way
	case h.ended() && h.err == nil:
		// Ended while no release was under way (the key went after a
		// failed Unlock, which may have deleted it): finish it, as
		// released. Otherwise the owner of a release that ended is
		// finishing it.
		claim := h.claimFinish()
		q.mu.Unlock()
		if !claim {
			return ErrLockReleased
		}
		q.finishNow(ctx, h)
		return nil
	case match != nil && !match(h.mode) && !h.modeUnknown:
		q.mu.Unlock()
		return errorf("%w: %s of a hold in mode %s", ErrLockReleased, op, h.mode)
	}
	ended := false
	if h.intact() {
		if lost := q.unwatchedLoss(h); lost != nil {
			ended = h.endWith(lost)
		}
	}
	if h.ended() {
		if !h.claimFinish() {
			// The owner of its release ended it and is finishing it.
			q.mu.Unlock()
			return ErrLockReleased
		}
		// A loss known before Unlock stands, whatever becomes of a
		// delete: report it at once rather than wait for etcd, which may
		// be out of reach. The key is gone, or goes with its lease; what
		// may be left (a max hold lease that has not run out) is left to
		// the background.
		err := h.err
		q.h, q.last = nil, h
		q.mu.Unlock()
		if ended {
			q.reportEnd(h, err)
		}
		if h.maxLease() == 0 || !q.s.releaser.add(func() bool { return q.step(h, true) }) {
			q.finishNow(ctx, h)
		}
		return err
	}
	if left := q.minHoldLeft(h); left > 0 {
		return q.holdOn(ctx, h, left, op) // unlocks q.mu
	}
	h.beginUnlock()
	q.mu.Unlock()
	return q.release(ctx, h, op)
}

// unlockNone is unlock when nothing is held, called with q.mu held,
// which it unlocks: a retry after an Unlock that left the release to the
// background waits for it, or says how it ended, once; otherwise
// ErrLockReleased.
func (q *queue) unlockNone(ctx context.Context, op string) error {
	l := q.last
	if l == nil || !l.owed {
		q.mu.Unlock()
		return ErrLockReleased
	}
	if !l.ended() {
		q.mu.Unlock()
		return q.awaitRelease(ctx, l, op)
	}
	l.owed = false
	err := q.relOf(l, op)
	q.mu.Unlock()
	return err
}

// release sends h's release, riding out errors that pass (a leader
// election, an overloaded or unreachable member: the attempt's outcome is
// unknown, and sending it again is safe) until etcd confirms it, ctx ends
// or the session ends. If ctx ends first, the session's releaser goes on
// with it, and release returns ctx's error.
func (q *queue) release(ctx context.Context, h *hold, op string) error {
	bctx, cancel := q.s.bound(ctx)
	defer cancel()
	backoff := minBackoff
	for {
		var err error
		if ctx.Err() == nil && q.s.Err() == nil {
			var done bool
			if done, err = q.attempt(bctx, h, op); done {
				return err
			}
		}
		switch {
		case q.s.Err() != nil:
			rel := q.endRelease(ctx, h, nil, true, op)
			if err != nil && errors.Is(rel, ErrSessionExpired) {
				rel = q.leftToLease(op, err) // with the last attempt's error
			}
			return rel
		case ctx.Err() != nil:
			return q.background(ctx, h, op, errorf("%s %s: %w; %w", op, q.key, ctx.Err(), errReleasePending))
		case !transient(err):
			// etcd refused it (a permission denied, say): no retry
			// will do better. The hold stays; Unlock may be called
			// again.
			q.mu.Lock()
			if h.refuse() {
				q.mu.Unlock()
				return errorf("%s %s: %w", op, q.key, err)
			}
			q.mu.Unlock()
			return q.endRelease(ctx, h, nil, false, op) // the loss watch saw the key go
		}
		q.mu.Lock()
		done := h.doneChan() // the pause ends when the hold does
		q.mu.Unlock()
		pauseOr(ctx, &backoff, done)
	}
}

// attempt sends one attempt at h's release unless the loss watch has seen
// the key go since the last. It reports whether the release has ended (it
// then finished h, and returns what Unlock returns), or returns the RPC's
// error: the attempt's outcome is unknown.
func (q *queue) attempt(ctx context.Context, h *hold, op string) (done bool, _ error) {
	return q.attemptWith(ctx, h, op, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.releaseTxn(ctx, h.rev, true)
	})
}

// attemptWith is attempt with the release's Txn sent by send.
func (q *queue) attemptWith(ctx context.Context, h *hold, op string, send func(context.Context) (*clientv3.TxnResponse, error)) (done bool, _ error) {
	q.mu.Lock()
	if h.ended() {
		q.mu.Unlock()
		return true, q.endRelease(ctx, h, nil, false, op)
	}
	first := h.sendAttempt()
	q.mu.Unlock()
	resp, err := send(ctx)
	q.mu.Lock()
	goneMid := h.attemptAnswered()
	q.mu.Unlock()
	switch {
	case err == nil && resp.Succeeded, err != nil && goneMid && q.set == nil:
		// Deleted (for a set, every key), or the loss watch saw the key
		// go meanwhile. (For a set, one key seen gone says nothing of
		// the others: only an answer ends its release.)
		return true, q.endRelease(ctx, h, nil, false, op)
	case err == nil && first:
		// No attempt of ours can have deleted the key (for a set, one
		// of its keys; the others are deleted now): it was gone before
		// the release began.
		lost := errorf("%w before %s: %w", ErrLockLost, op, q.set.goneInRelease(q, resp).whyKeyGone(ctx, h.maxLease()))
		return true, q.endRelease(ctx, h, lost, false, op)
	case err == nil:
		// An earlier attempt may have deleted it, or someone else did
		// (or its lease ended) before it arrived: etcd keeps nothing
		// that tells the two apart. Not known to be lost.
		return true, q.endRelease(ctx, h, nil, false, op)
	}
	return false, err
}

// relOf is what Unlock (op) returns for h's release, which has ended: nil
// when it released the key, h's loss when the key was gone before it began,
// and that the key went with the lease when the session ended first.
// Called with q.mu held.
func (q *queue) relOf(h *hold, op string) error {
	switch {
	case h.err != nil:
		return h.err
	case h.byLease:
		return q.leftToLease(op, nil)
	}
	return nil
}

// errReleasePending says the release goes on in the background.
var errReleasePending = errors.New("the release goes on in the background")

// leftToLease is what Unlock returns when the session ended before the
// release was confirmed (err, if not nil, is the last attempt's): the key
// goes with the session's lease.
func (q *queue) leftToLease(op string, err error) error {
	serr := q.s.Err()
	if err != nil {
		return errorf("%s %s: %v; the session ended, the key goes with its lease: %w", op, q.key, err, serr)
	}
	return errorf("%s %s: the session ended, the key goes with its lease: %w", op, q.key, serr)
}

// endRelease ends h, unless it has ended already (the loss watch, between
// attempts), with err as its Err (nil: released) and byLease saying that
// the session's end took the key, and finishes it. It returns what Unlock
// (op) returns for the release (relOf). Called by the owner of h's
// release.
func (q *queue) endRelease(ctx context.Context, h *hold, err error, byLease bool, op string) error {
	q.mu.Lock()
	now := h.endWith(err)
	if now {
		h.byLease = byLease
	}
	rel := q.relOf(h, op)
	claim := h.claimFinish()
	q.mu.Unlock()
	if now {
		q.reportEnd(h, err)
	}
	if claim {
		q.finishNow(ctx, h)
	}
	return rel
}

// background hands h's release to the session's releaser, and returns
// err: Unlock returns before the release is confirmed. The Mutex is then
// no longer held (Token is 0, IsOwner never holds); Done closes when the
// release ends; the next Lock of the session waits for it, and the next
// Unlock reports how it ended.
func (q *queue) background(ctx context.Context, h *hold, op string, err error) error {
	q.mu.Lock()
	if h.ended() {
		q.mu.Unlock()
		return q.endRelease(ctx, h, nil, false, op)
	}
	h.handOff()
	h.doneChan() // a retried Unlock waits on it
	if q.h == h {
		q.h, q.last = nil, h
	}
	q.mu.Unlock()
	if !q.s.releaser.add(func() bool { return q.step(h, false) }) {
		// The session has ended: the key goes with its lease.
		q.mu.Lock()
		h.owed = false
		q.mu.Unlock()
		return q.endRelease(ctx, h, nil, true, op)
	}
	return err
}

// awaitRelease waits for a release that the releaser sends to end, and
// returns what Unlock returns then, or ctx's error if ctx ends first.
func (q *queue) awaitRelease(ctx context.Context, h *hold, op string) error {
	select {
	case <-h.done:
	case <-ctx.Done():
		return errorf("%s %s: %w; %w", op, q.key, ctx.Err(), errReleasePending)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	h.owed = false
	return q.relOf(h, op)
}

// finishNow makes h, which has ended and whose finishing the caller
// claimed (claimFinish), no longer the queue's: it stops its loss watch,
// revokes its max hold lease and gives back the name, which lets the next
// Lock of the session and name go on.
func (q *queue) finishNow(ctx context.Context, h *hold) {
	q.mu.Lock()
	if q.h == h {
		q.h, q.last = nil, h
	}
	w := h.watch
	more := q.set.takeWatches(h)
	req := h.req
	q.mu.Unlock()
	if req != nil {
		req.stop()
	}
	if w != nil {
		q.s.watcher.stop(ctx, w)
	}
	for _, w := range more {
		q.s.watcher.stop(ctx, w)
	}
	q.revokeMaxHold(ctx, h)
	q.releaseNames()
}

// step is one round of the releaser for h: an attempt at its release, or
// its tidy-up after a loss. It reports whether h is done with. Every error
// is tried again, after the releaser's backoff, for as long as the session
// lives: no caller waits on it, and a lock left held would block every
// waiter while the session renews it.
func (q *queue) step(h *hold, tidy bool) bool {
	if q.s.Err() != nil {
		// The key goes with the lease (Close revokes a max hold lease,
		// or it runs out).
		if tidy {
			q.finishNow(context.Background(), h)
		} else {
			q.endRelease(context.Background(), h, nil, true, "Unlock")
		}
		return true
	}
	actx, cancel := context.WithTimeout(q.s.endCtx, cleanupTimeout)
	defer cancel()
	if tidy {
		// Tidy up after a loss: delete the key if it is still this
		// hold's (its max hold lease has not run out), then revoke that
		// lease.
		_, err := q.releaseTxn(actx, h.rev, false)
		if err == nil || q.s.Err() != nil {
			q.finishNow(actx, h)
			return true
		}
		return false
	}
	done, _ := q.attempt(actx, h, "Unlock")
	if !done && q.s.Err() != nil {
		q.endRelease(context.Background(), h, nil, true, "Unlock")
		return true
	}
	return done
}

// holdOn is Unlock of h before its minimum hold has passed (left more),
// called with q.mu held, which it unlocks: the releaser sends the release
// then. The Mutex no longer holds; nothing is owed to a later Unlock.
func (q *queue) holdOn(ctx context.Context, h *hold, left time.Duration, op string) error {
	h.holdOn()
	h.doneChan()
	q.h, q.last = nil, h
	q.mu.Unlock()
	until := time.Now().Add(left)
	if !q.s.releaser.addAt(until, func() bool { return q.stepMinHold(h, until) }) {
		// The session has ended: the key goes with its lease, and the
		// record keeps the minimum hold.
		return q.endRelease(ctx, h, nil, true, op)
	}
	return nil
}

// stepMinHold is one round of the releaser for h, whose Unlock came
// before its minimum hold passed at until: the release once until has
// come; before then (Close flushes the releaser) the rest moves onto a
// lease of its own with the key's delete (leaveToLease).
func (q *queue) stepMinHold(h *hold, until time.Time) bool {
	left := time.Until(until)
	if left <= 0 || q.s.Err() != nil {
		return q.step(h, false)
	}
	actx, cancel := context.WithTimeout(q.s.endCtx, cleanupTimeout)
	defer cancel()
	done, _ := q.attemptWith(actx, h, "Unlock", func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.leaveToLease(ctx, h.rev, left)
	})
	return done
}
