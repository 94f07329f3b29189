package etcdlock

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A hold is one acquisition (Lock, RLock, Acquire), until its release or
// loss. (Its fields are ordered to fit a 112-byte allocation: a program may
// hold thousands.)
type hold struct {
	rev  int64   // create revision of the key: the token
	mode KeyMode // what the key asks for; guarded by queue.mu (Downgrade changes it)
	hdr  header  // of the response that showed the lock was ours

	limit *holdLimit // set when WithMaxHold re-attached the key to a lease of its own

	// Guarded by queue.mu.
	done     chan struct{} // closed when the hold ends; made by the first Done or Unlock
	err      error         // ErrLockLost after an involuntary end
	watch    *keyWatch     // the loss watch; nil until Done asks for it
	state    holdState     // see holdstate.go, as is attempts
	attempts attemptState  // where the attempts of its release are
	// owed: Unlock returned before the release ended (handOff); the next
	// Unlock waits for it, or reports how it ended. It spans the
	// releasing and ended states: the report is owed until an Unlock
	// takes it.
	owed        bool
	modeUnknown bool // a Downgrade's outcome is unknown: Unlock and RUnlock both release
	byLease     bool // the release ended with the session: its key goes with the lease

	kind  Kind          // as acquired, for Hooks; set only when the session has events
	since time.Duration // monotime of the acquisition: of the answer that admitted it (take), or of take's return when the session has events

	req *holdRequest // the watch of release requests, once ReleaseRequested asked; guarded by queue.mu
}

// header is a response's header, kept by value: a held lock keeps one,
// and etcd's message (with the protobuf runtime's state) costs 80 bytes of
// heap where its fields cost 32.
type header struct {
	cluster, member, term uint64
	rev                   int64
}

// headerOf returns hdr's fields; the zero header for nil.
func headerOf(hdr *pb.ResponseHeader) header {
	if hdr == nil {
		return header{}
	}
	return header{cluster: hdr.ClusterId, member: hdr.MemberId, term: hdr.RaftTerm, rev: hdr.Revision}
}

// proto returns the header as etcd's message, a new one each call.
func (h header) proto() *pb.ResponseHeader {
	return &pb.ResponseHeader{ClusterId: h.cluster, MemberId: h.member, Revision: h.rev, RaftTerm: h.term}
}

// holdLimit is the lease of its own that WithMaxHold gives a hold's key.
type holdLimit struct {
	lease    clientv3.LeaseID
	deadline time.Time   // the hold surely ends by then; Done closes before
	timer    *time.Timer // ends the hold then, once Done watches it; guarded by sessionWatcher.mu
}

// maxLease returns the WithMaxHold lease of h's key, or 0.
func (h *hold) maxLease() clientv3.LeaseID {
	if h.limit == nil {
		return 0
	}
	return h.limit.lease
}

// maxDeadline returns when the WithMaxHold lease of h's key surely ends,
// or the zero time.
func (h *hold) maxDeadline() time.Time {
	if h.limit == nil {
		return time.Time{}
	}
	return h.limit.deadline
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed when the current hold ends, for any reason:
// Unlock, or loss (the key was deleted, the session's lease expired or was
// revoked, the session ended, or the WithMaxHold limit passed). When
// nothing is held, Done returns the channel of the last hold, or a closed
// channel if there was none.
//
// The first call of a hold starts watching the key, from the revision at
// which the hold was admitted, on the watch stream the session shares
// among its holds (see sessionWatcher): no goroutine and no read per hold;
// the plain Lock/Unlock path opens no watch. When the key goes, the watch
// asks etcd whether its lease still exists, so that Err tells a revoked or
// expired lease ("lease ... was revoked or expired"; the session ends with
// it) from a deleted key. Loss by lease expiry is reported before etcd can
// give the lock to anyone else: the session counts its lease's life from
// when each renewal was sent and ends a margin before it runs out.
func (q *queue) Done() <-chan struct{} {
	q.mu.Lock()
	h := q.recent()
	if h == nil || h.ended() && h.done == nil {
		q.mu.Unlock()
		return closedChan
	}
	h.doneChan()
	var ended bool
	var err error
	if h.watch == nil && !h.ended() {
		// finish stops the watch; the session's end ends it, and the
		// hold with it.
		if h.watch = q.s.watcher.watchHold(q, h, true); h.watch == nil || !q.set.watchHold(h) {
			ended, err = h.seenGone(q.s.Err()) // the session has ended
		}
	}
	done := h.done
	q.mu.Unlock()
	if ended {
		q.reportEnd(h, err)
	}
	return done
}

// recent returns the current hold, or the one that ended last, or nil.
// Called with q.mu held.
func (q *queue) recent() *hold {
	if q.h != nil {
		return q.h
	}
	return q.last
}

// Err returns nil while a hold lasts and after a plain release (Unlock,
// RUnlock, Release), and an error matching ErrLockLost once a hold ended
// involuntarily (until the next hold is taken). The end of the session and
// the WithMaxHold limit are always reported; a deleted key only once Done
// has been called for the hold (Do calls it, and Unlock reports it too).
// Once Unlock has begun, Err reports only the loss Unlock reports.
func (q *queue) Err() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.recent()
	if h == nil {
		return nil
	}
	switch {
	case h.ended():
		return h.err
	case !h.intact():
		// A release has begun: what happens to the key now is no
		// loss, unless the release finds it was (Unlock tells).
		return nil
	}
	return q.unwatchedLoss(h)
}

// unwatchedLoss returns the losses of h that need no watch to be known: the
// session's end, the max hold passing. Called with q.mu held.
func (q *queue) unwatchedLoss(h *hold) error {
	if err := q.s.Err(); err != nil {
		return errorf("%w: %w", ErrLockLost, err)
	}
	if q.maxHoldPassed(h) {
		return errorf("%w: %w", ErrLockLost, errMaxHold)
	}
	return nil
}

// maxHoldPassed reports whether h's WithMaxHold limit has passed as its
// holder is told: a margin before etcd ends the lease.
func (q *queue) maxHoldPassed(h *hold) bool {
	return !h.maxDeadline().IsZero() && time.Now().After(h.maxDeadline().Add(-q.s.expiryMargin()))
}

// lose ends h as lost, from the loss watch (cause: why the key went), or
// tells the owner of its release that the key is gone (seenGone). The
// watch is not stopped: it is the caller.
func (q *queue) lose(h *hold, cause error) {
	q = q.owner() // a part of a set: the set's lead owns the hold
	q.mu.Lock()
	ended, err := h.seenGone(cause)
	releasing := h.state == holdReleasing || h.ended() && h.owed
	q.mu.Unlock()
	if ended {
		q.reportEnd(h, err)
	}
	if ended {
		q.sweepOthers(h)
	}
	if releasing {
		q.s.releaser.signal() // it finishes the hold
	}
}

// reportEnd tells the session's hooks and logger that h ended with err
// (nil: released). Called once per hold, by whoever ended it, without
// q.mu held: the hooks may call q's methods.
func (q *queue) reportEnd(h *hold, err error) {
	ev := q.s.ev
	if ev == nil {
		return
	}
	q.mu.Lock()
	mode := h.mode
	q.mu.Unlock()
	ev.holdDone(HoldDoneInfo{
		LockInfo: LockInfo{Kind: h.kind, Name: q.label(), Mode: mode},
		Token:    h.rev,
		Key:      q.owner().key,
		Held:     monotime() - h.since,
		End:      q.s.holdEnd(err),
		Err:      err,
	})
}

// holdGone says why h's key is gone, for the loss watch: the lease it was
// bound to ended (then, for the session's lease, the session ends now
// rather than at its next renewal), or someone deleted it. A deletion once
// a release attempt was sent may be the release's own: it is not looked
// into, the release tells. Before the first (an Unlock that a minimum
// hold holds back) it cannot be, and is looked into as for a hold still
// held. For a part of a set, q is the part whose key went.
func (q *queue) holdGone(ctx context.Context, h *hold) error {
	o := q.owner()
	o.mu.Lock()
	sent := h.attempts != attemptNone
	o.mu.Unlock()
	if sent {
		return errorf("key %s was %w", q.key, errDeleted)
	}
	return q.whyKeyGone(ctx, h.maxLease())
}

// whyKeyGone says why this queue's key is gone, asking etcd whether the lease
// it was bound to still exists: the session's lease, or maxLease when not
// 0. If the session's lease is gone, the session ends now (rather than at
// its next renewal) and its error is returned: "lease ... was revoked or
// expired". Else the key was deleted. It costs one RPC, on the loss path
// only.
func (q *queue) whyKeyGone(ctx context.Context, maxLease clientv3.LeaseID) error {
	lease := q.s.Lease()
	if maxLease != 0 {
		lease = maxLease
	}
	resp, err := q.s.cli.TimeToLive(ctx, lease)
	switch {
	case err != nil:
		return errorf("key %s is gone (lease check failed: %v)", q.key, err)
	case resp.TTL >= 0: // 0 is a live lease with under 1s left
		return errorf("key %s was %w", q.key, errDeleted)
	case maxLease != 0:
		return errorf("max hold lease %x was %w", maxLease, errRevokedOrExpired)
	}
	q.s.lost()
	return q.s.Err()
}

// Causes of a loss, told apart by HoldEnd.
var (
	// errMaxHold is the cause of a loss by WithMaxHold.
	errMaxHold = errors.New("max hold time passed")
	// errDeleted ends "key ... was deleted": someone deleted the key.
	errDeleted = errors.New("deleted")
	// errRevokedOrExpired ends "max hold lease ... was revoked or expired".
	errRevokedOrExpired = errors.New("revoked or expired")
)

// monoEpoch is the start of monotime's clock.
var monoEpoch = time.Now()

// monotime returns the time on the monotonic clock, in 8 bytes: a hold
// keeps it smaller than a time.Time.
func monotime() time.Duration { return time.Since(monoEpoch) }
