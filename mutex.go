package etcdlock

import "context"

// A Mutex is a fair distributed lock on etcd. Waiters queue in the order
// their keys were created (their create revision) and get the lock in that
// order; each waiter watches only the key just ahead of it, so a release
// wakes exactly one waiter.
//
// The key is name + "/" + the session's lease ID in hex, the layout of
// etcd's concurrency.Mutex and `etcdctl lock`, so both can share a lock name.
//
// A Mutex is safe for concurrent use, like sync.Mutex: while it is held,
// Lock from another goroutine waits and TryLock returns ErrLocked. Two
// Mutex values of one Session and name exclude each other too.
//
// Holding the lock is not, by itself, mutual exclusion: a holder that is
// paused or cut off longer than its TTL loses the lock while it still runs.
// Guard writes to etcd with IsOwner, and writes elsewhere with Token.
type Mutex struct{ queue }

// NewMutex returns a Mutex for the lock called name, taken through session
// s. The name is checked by Lock and TryLock, which return ErrInvalidName
// for an invalid name (see ErrInvalidName). Names may contain "/": a lock
// named "jobs/cleanup" never blocks one named "jobs" or the reverse.
//
// Invalid options are reported by Lock and TryLock, as ErrInvalidOption.
func NewMutex(s *Session, name string, opts ...MutexOption) *Mutex {
	m := new(Mutex)
	m.init(s, name, KindMutex, opts)
	return m
}

// Lock blocks until the lock is held, ctx ends, or the session ends.
//
// On failure Lock leaves no key under the lock's prefix (if etcd cannot be
// reached to remove it, or the session has ended, the key goes with the
// session's lease) and returns
// ctx's error (errors.Is(err, context.DeadlineExceeded) or
// context.Canceled), an error matching ErrSessionExpired, ErrInvalidName,
// or etcd's error. If the lock was granted just as ctx ended, it is released
// again and Lock returns ctx's error.
//
// Lock sets no deadline of its own. If ctx ends while the write that joins
// the queue is in flight, Lock waits for etcd's answer to that write so that
// it knows which key to remove, and then removes it: giving up on the write
// could leave a key that blocks the queue until the session ends. Both wait
// only while the session lives: the key is bound to the session's lease, so
// once the session has ended (at most its TTL after etcd was last reached)
// the key goes with the lease. If the write's answer had not come by then,
// Lock returns an error that says so, matching ErrSessionExpired and, if
// ctx has ended, ctx's error.
//
// While it waits, Lock rides out broken watches, leader elections and an
// overloaded etcd ("request timed out", "too many requests"): the write that
// joins the queue is sent again (it keeps the place an earlier attempt may
// have taken), the queue keeps its place, and only ctx or the session's end
// make it leave. A cluster out of space (etcd's NOSPACE alarm) is not
// ridden out: the write is refused until an operator frees space, and Lock
// returns etcd's error (rpctypes.ErrNoSpace) at once, leaving no key.
func (m *Mutex) Lock(ctx context.Context) error { return m.lock(ctx, KeyMode{}, true) }

// TryLock takes the lock if no one holds it or waits for it, and otherwise
// returns ErrLocked at once without joining the queue. A held lock costs one
// read-only RPC and writes nothing; a free one costs one read and one write.
// The write is guarded so that TryLock can never jump ahead of a waiter.
// The read is sent again after errors that pass (a leader election, a
// member out of reach), while ctx and the session last: "at once" means
// without waiting for the lock, not without waiting for etcd. An error on
// the write is returned. If ctx ends before the write's answer comes,
// TryLock returns ctx's error at once, and the session waits for the
// answer: a key the write put is removed then (or goes with the lease),
// and until then the session's next Lock of the name waits, its next Try
// returns ErrLocked. After failure nothing of this Mutex is left under the
// lock's prefix once that answer has come.
func (m *Mutex) TryLock(ctx context.Context) error { return m.lock(ctx, KeyMode{}, false) }

// Unlock releases the lock. It deletes the key only if it is still the key
// this hold created (same create revision), so it can never delete another
// holder's key, however often the delete is sent.
//
// It returns nil when the hold ended with this Unlock, ErrLockReleased if
// the Mutex is not held (Unlock before Lock, double Unlock), and
// ErrLockLost when the hold had ended before Unlock began: at once,
// without a round trip, when that was known (Done or Err had reported the
// loss, the session had ended, the WithMaxHold limit had passed), or when
// etcd answers the first delete sent that the key was gone (deleted, or
// its lease revoked or expired). After any of these the Mutex is not held.
//
// Unlock rides out errors that pass (a leader election, a dropped
// proposal, an overloaded or unreachable member), sending the delete again
// until etcd confirms it, ctx ends, or the session ends. A delete whose
// answer was lost may have been applied: when a later one finds the key
// gone, Unlock returns nil, as etcd keeps nothing that tells that from a
// deletion by someone else meanwhile. Likewise, if Done sees the key go
// once a delete was sent, the hold ends without a loss. If the session
// ends first, the key goes with its lease: Unlock ends the hold and returns
// an error matching ErrSessionExpired, not ErrLockLost.
//
// If ctx ends before etcd confirms the release, Unlock returns ctx's error
// (also when ctx had ended before the call) and the release goes on in the
// background while the session lives: the Mutex is no longer held (Token
// returns 0, IsOwner never holds), Done closes once the key is gone, the
// next Lock of the session on this name waits for the release (TryLock
// returns ErrLocked meanwhile), and the next Unlock waits for it and
// returns nil once it is done (an error matching ErrLockLost if the key
// went before the release reached etcd: deleted, or its max hold passed).
// So a caller that ignores Unlock's error, as
// defer m.Unlock(ctx) does, never keeps the lock for longer than etcd is
// out of reach.
//
// An error that does not pass (a permission denied) is returned as it is,
// and the Mutex stays held: Unlock may be called again.
//
// With WithMinHold, an Unlock before the minimum hold has passed returns
// nil at once, without an RPC (or the loss it knows of), and the session
// sends the delete when the minimum hold has passed; the Mutex is no
// longer held meanwhile, as above, and nothing is owed to a later Unlock.
func (m *Mutex) Unlock(ctx context.Context) error { return m.unlock(ctx, nil, "Unlock") }

// Do locks m, runs fn, and unlocks m. fn's ctx is cancelled the moment the
// hold is lost, with context.Cause matching ErrLockLost. If the hold was
// lost, Do's error matches ErrLockLost and also carries fn's error. If Lock
// fails, fn does not run and Do returns Lock's error. The error is one
// line; errors.Is matches each error it carries.
//
// Do unlocks as Unlock does, with ctx. If ctx has ended when fn returns,
// the release is still tried for up to 5s with a context of its own; if
// etcd has not confirmed it by then, Do returns, and the release goes on
// in the background (see Unlock), which is not an error of Do's.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return m.do(ctx, KeyMode{}, fn)
}
