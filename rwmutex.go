package etcdlock

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// An RWMutex is a fair distributed reader/writer lock on etcd. Readers and
// writers queue together in the order their keys were created (their
// create revision), as in sync.RWMutex: a reader behind a waiting writer
// waits for it, so writers do not starve. A writer holds when nothing is
// ahead of it, exactly like a Mutex (and it is one to every other client:
// etcd's concurrency.Mutex and `etcdctl lock` exclude it and are excluded
// by it). A reader holds when only readers are ahead of it. It shares the
// Mutex's guarantees: a waiter notices at once that its own lease ended
// (and is never admitted without its key); the holder is told first that
// its hold was lost (Done, Err); Token and IsOwner fence a hold.
//
// Each waiter watches one key: a writer the key just ahead, a reader the
// last writer ahead. A writer's release wakes exactly the holds it admits
// (all the readers up to the next writer, or that writer); a reader's
// release wakes at most the writer just behind it.
//
// The key is name/<lease ID in hex>, like a Mutex's; a write lock's value
// is empty, a read lock's "etcdlock/1 shared". etcd's recipe RWMutex uses
// name/read/ and name/write/ keys: the two do not interoperate.
//
// An RWMutex is safe for concurrent use, with one hold at a time per
// value, session and name: concurrent RLocks through one Session and name
// take turns, as in a Mutex. Use a Session per concurrent reader, or one
// RLock under a local sync.RWMutex. A read lock cannot be upgraded: Lock
// while this RWMutex holds a read lock returns ErrUpgrade.
//
// Under a read lock, IsOwner guards reads; guard writes only under a write
// lock.
type RWMutex struct{ queue }

// shared is the mode of a read lock.
var shared = KeyMode{Shared: true}

// NewRWMutex returns an RWMutex for the lock called name, taken through
// session s. Names and options are checked as NewMutex's are.
func NewRWMutex(s *Session, name string, opts ...MutexOption) *RWMutex {
	m := new(RWMutex)
	m.init(s, name, KindRWMutexWrite, opts)
	return m
}

// Lock blocks until the write lock is held, ctx ends, or the session ends,
// as Mutex.Lock does. It returns ErrUpgrade at once, with no RPC, while
// this RWMutex holds a read lock: a writer cannot be admitted while its
// own read lock is held, and the read lock cannot become a write lock in
// place without overtaking the writers queued behind it. RUnlock first.
func (m *RWMutex) Lock(ctx context.Context) error { return m.lock(ctx, KeyMode{}, true) }

// TryLock takes the write lock if no one holds the lock or waits for it,
// and otherwise returns ErrLocked at once, as Mutex.TryLock does.
func (m *RWMutex) TryLock(ctx context.Context) error { return m.lock(ctx, KeyMode{}, false) }

// Unlock releases the write lock, as Mutex.Unlock does. It returns
// ErrLockReleased, and the hold stays, if this RWMutex holds a read lock.
func (m *RWMutex) Unlock(ctx context.Context) error {
	return m.unlock(ctx, KeyMode.Exclusive, "Unlock")
}

// RLock blocks until a read lock is held, ctx ends, or the session ends:
// until no writer is ahead of it. It sets no deadline of its own, and on
// failure leaves no key, as Mutex.Lock.
func (m *RWMutex) RLock(ctx context.Context) error { return m.lock(ctx, shared, true) }

// TryRLock takes a read lock if no writer holds the lock or waits for it,
// and otherwise returns ErrLocked at once without joining the queue, as
// Mutex.TryLock does. A held lock costs one read-only RPC (more with over
// 64 readers holding).
func (m *RWMutex) TryRLock(ctx context.Context) error { return m.lock(ctx, shared, false) }

// RUnlock releases the read lock, as Mutex.Unlock does. It returns
// ErrLockReleased, and the hold stays, if this RWMutex holds the write
// lock.
func (m *RWMutex) RUnlock(ctx context.Context) error {
	return m.unlock(ctx, func(k KeyMode) bool { return k.Shared }, "RUnlock")
}

// Do takes the write lock, runs fn, and releases it, as Mutex.Do does.
func (m *RWMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return m.do(ctx, KeyMode{}, fn)
}

// RDo takes a read lock, runs fn, and releases it, as Mutex.Do does.
func (m *RWMutex) RDo(ctx context.Context, fn func(ctx context.Context) error) error {
	return m.do(ctx, shared, fn)
}

// Downgrade turns this RWMutex's write lock into a read lock without
// leaving the queue: the key keeps its create revision, so the hold keeps
// its place and Token, and no writer queued behind it can get in between.
// Readers queued behind it, up to the next writer, are admitted at once. It is the only change of a
// key's mode in place, and it only makes the key admit more.
//
// It returns ErrLockReleased if the RWMutex holds no write lock (or an
// Unlock or Downgrade is under way), and an error matching ErrLockLost if
// the hold had ended: release it then, as after any loss. If the RPC fails,
// the lock may already be shared: stop writing, then call Downgrade again
// or release it (Unlock and RUnlock are both accepted then).
func (m *RWMutex) Downgrade(ctx context.Context) error {
	m.mu.Lock()
	h := m.h
	if h != nil && (h.mode.Exclusive() || h.modeUnknown) {
		// A loss already known, as Unlock and Proclaim know it: the
		// loss watch's, or the session's end or the max hold passing,
		// which need no watch.
		var lost error
		switch {
		case h.ended():
			lost = h.err // nil: ended after a failed Unlock, no loss
		case h.intact():
			lost = m.unwatchedLoss(h)
		}
		if lost != nil {
			m.mu.Unlock()
			return lost
		}
	}
	if h == nil || h.state != holdHeld || (!h.mode.Exclusive() && !h.modeUnknown) {
		m.mu.Unlock()
		return errorf("%w: Downgrade without a write lock", ErrLockReleased)
	}
	h.beginDowngrade() // a concurrent Unlock or RUnlock gets ErrLockReleased
	m.mu.Unlock()

	// WithIgnoreLease keeps the key's lease: the session's, or the
	// WithMaxHold one.
	resp, err := m.s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", h.rev)).
		Then(clientv3.OpPut(m.key, m.value(shared), clientv3.WithIgnoreLease())).
		Commit()
	m.mu.Lock()
	defer m.mu.Unlock()
	h.endDowngrade()
	switch {
	case err != nil:
		h.modeUnknown = true
		return errorf("downgrade %s: %w", m.key, err)
	case !resp.Succeeded:
		return errorf("%w before Downgrade: key %s is gone", ErrLockLost, m.key)
	}
	h.mode, h.modeUnknown = shared, false
	return nil
}
