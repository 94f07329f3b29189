package etcdlock

import "errors"

// A hold's lifecycle. Its release has one owner at a time, and the
// hold's state says which:
//
//	      Downgrade ┌─────────────┐
//	  ┌────────────▶│ downgrading │ (its Put answered)
//	  │  ┌──────────┴─────────────┘
//	  │  ▼
//	held ──Unlock──▶ unlocking ──confirmed, or the key seen gone──▶ ended ──▶ finished
//	  ▲                 │   │                                         ▲
//	  │  error that     │   │ ctx ended before it was confirmed       │
//	  └─does not pass───┘   ▼                                         │
//	                    releasing (the session's releaser sends it) ──┘
//
// Unlock before a minimum hold has passed also moves a hold from held to
// releasing (holdOn): the releaser sends its release once it has.
//
// A hold also ends from held or downgrading when it is lost (the loss
// watch, the session's end, the max hold passing); it then stays the
// queue's until Unlock says so. A release is the delete of the hold's key
// guarded by its create revision: sent again and again, it can never
// delete another hold's key (etcd issue 22082), so it is sent until etcd
// confirms it, for as long as etcd is out of reach and the session lives,
// and never left undone: a lock whose release failed once must not stay
// held while its session renews it. Whoever ends a release also finishes
// the hold (finish): stops its watch, revokes its max hold lease and gives
// back the name, so that the next Lock of the session waits for the
// release. Exactly one caller claims the finishing (ended → finished).
//
// The attempts of a release have a state of their own (attemptState),
// which outlives an Unlock refused by etcd: once an attempt was sent, a
// vanished key may be the release's own doing, and is no longer evidence
// of a loss.
//
// Every change of a hold's state is one of the methods below, called with
// the hold's queue.mu held.
type holdState uint8

const (
	holdHeld        holdState = iota // acquired; no release under way
	holdDowngrading                  // held; a Downgrade's Put is under way: Unlock, RUnlock and Downgrade get ErrLockReleased
	holdUnlocking                    // an Unlock call sends the release
	holdReleasing                    // the session's releaser sends it: Unlock returned before it was confirmed
	holdEnded                        // released or lost (err); done is closed; its finishing not claimed yet
	holdFinished                     // ended, and its finishing claimed: it is no longer the queue's, or is being made so
)

// attemptState is where the attempts of a hold's release are.
type attemptState uint8

const (
	attemptNone         attemptState = iota // none sent: a vanished key is a loss
	attemptInFlight                         // one is in flight
	attemptGoneInFlight                     // one is in flight, and the loss watch saw the key go meanwhile
	attemptSent                             // some were sent, none is in flight
)

// held reports whether h is held: acquired, and no release under way (a
// Downgrade may be).
func (h *hold) held() bool { return h.state == holdHeld || h.state == holdDowngrading }

// intact reports whether h is held and no release attempt was ever sent:
// whether a vanished key is a loss.
func (h *hold) intact() bool { return h.held() && h.attempts == attemptNone }

// ended reports whether h has ended: released or lost.
func (h *hold) ended() bool { return h.state >= holdEnded }

// beginDowngrade moves h from held to downgrading.
func (h *hold) beginDowngrade() { h.state = holdDowngrading }

// endDowngrade moves h back to held once its Downgrade's Put is answered,
// unless it ended meanwhile.
func (h *hold) endDowngrade() {
	if h.state == holdDowngrading {
		h.state = holdHeld
	}
}

// beginUnlock moves h from held to unlocking: the Unlock call owns the
// release.
func (h *hold) beginUnlock() { h.state = holdUnlocking }

// refuse moves h back to held when etcd refused its release (an error
// that does not pass), if an Unlock still owned it; it reports whether it
// did. The attempts sent stay sent.
func (h *hold) refuse() bool {
	if h.state != holdUnlocking {
		return false
	}
	h.state = holdHeld
	return true
}

// handOff moves h from unlocking to releasing: the session's releaser
// owns the release, and the next Unlock is owed its outcome.
func (h *hold) handOff() { h.state, h.owed = holdReleasing, true }

// doneChan returns h's done channel, made on first use: by the first Done
// or Unlock.
func (h *hold) doneChan() chan struct{} {
	if h.done == nil {
		h.done = make(chan struct{})
	}
	return h.done
}

// holdOn moves h from held to releasing for a minimum hold: the
// session's releaser sends the release once the minimum hold has passed,
// and the Unlock that asked for it is owed nothing.
func (h *hold) holdOn() { h.state = holdReleasing }

// sendAttempt records that a release attempt is sent, and reports whether
// it is the first.
func (h *hold) sendAttempt() (first bool) {
	first = h.attempts == attemptNone
	h.attempts = attemptInFlight
	return first
}

// attemptAnswered records that the attempt in flight was answered (or
// failed), and reports whether the loss watch saw the key go meanwhile.
func (h *hold) attemptAnswered() (goneMid bool) {
	goneMid = h.attempts == attemptGoneInFlight
	h.attempts = attemptSent
	return goneMid
}

// seenGone is what the key's vanishing (cause: why, as the loss watch or
// the session found) does to h. It reports whether h ended now, and with
// what error: then the caller calls reportEnd, once it has released
// queue.mu.
func (h *hold) seenGone(cause error) (ended bool, _ error) {
	if h.ended() {
		return false, nil
	}
	// The session's end (its lease is gone, or it gave up on it) during
	// a release is no loss: the release's owner sees the session end,
	// and the key goes with the lease.
	byLease := errors.Is(cause, ErrSessionExpired)
	var err error
	switch {
	case h.intact():
		err = errorf("%w: %w", ErrLockLost, cause)
	case h.held():
		// Between the attempts of a failed Unlock: one may have
		// deleted the key. The hold has ended, not known to be lost;
		// the next Unlock finishes it.
	case byLease:
		return false, nil
	case h.attempts == attemptInFlight || h.attempts == attemptGoneInFlight:
		// The attempt's answer tells what happened; should its RPC
		// fail, the release ends as released.
		h.attempts = attemptGoneInFlight
		return false, nil
	case h.attempts == attemptNone && !h.owed && errors.Is(cause, errMaxHold):
		// An Unlock that a minimum hold holds back (holdOn; a handOff
		// is owed to the next Unlock): the holder has let go, and the
		// max hold passing takes nothing from it. Its key goes with the
		// max hold lease, which etcd ends no sooner than the minimum
		// hold, or with the release: that tells.
		return false, nil
	case h.attempts == attemptNone:
		// Gone before the release's first attempt.
		err = errorf("%w before Unlock: %w", ErrLockLost, cause)
	}
	return h.endWith(err), err
}

// endWith ends h with err (nil: not lost), unless it has ended already,
// and reports whether it ended now: then the caller calls reportEnd, once
// it has released queue.mu.
func (h *hold) endWith(err error) bool {
	if h.ended() {
		return false
	}
	h.state, h.err = holdEnded, err
	if h.done != nil {
		close(h.done)
	}
	return true
}

// claimFinish moves h, which has ended, to finished, and reports whether
// this caller claimed the finishing: then it calls finishNow.
func (h *hold) claimFinish() bool {
	if h.state != holdEnded {
		return false
	}
	h.state = holdFinished
	return true
}
