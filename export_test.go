package etcdlock

import (
	"context"
	"time"
)

// SetTestHookWait makes m call f, with the key it watches, each time it has
// set up its watches and blocks waiting for its turn.
func SetTestHookWait(m *Mutex, f func(pred string)) {
	m.testHookWait = func(keys []string) { f(keys[0]) }
}

// SetTestHookWaitKeys makes l (a Mutex, RWMutex or Semaphore) call f, with
// the keys it watches (its blockers, or the lock's prefix when it watches
// all of it), each time it has set up its watches and blocks.
func SetTestHookWaitKeys(l interface{ self() *queue }, f func(keys []string)) {
	l.self().testHookWait = f
}

// Hooked is what SetTestHookWaitKeys accepts: a Mutex, RWMutex or
// Semaphore.
type Hooked = interface{ self() *queue }

// SetInspectPage makes InspectLock and ListLocks read n keys a range, until
// restore is called. Not for parallel tests.
func SetInspectPage(n int64) (restore func()) {
	old := inspectPage
	inspectPage = n
	return func() { inspectPage = old }
}

// SessionGiveUp returns when s gives up its lease, if no renewal is
// confirmed before: the end of what etcd confirmed, less the margin.
func SessionGiveUp(s *Session) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline.Add(-s.expiryMargin())
}

// self makes a MultiMutex Hooked: its hooks are its lead part's, which
// every part's waiter calls.
func (m *MultiMutex) self() *queue { return &m.q }

// SawGoneMidRelease reports whether the loss watch of the hold that l
// releases saw its key (a key of a set) go while a release attempt was in
// flight.
func SawGoneMidRelease(l interface{ self() *queue }) bool {
	q := l.self()
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, h := range []*hold{q.h, q.last} {
		if h != nil && h.attempts == attemptGoneInFlight {
			return true
		}
	}
	return false
}

// WithTestHookReturned makes Lead call f once fn has returned and the
// term's end is decided, before it stops watching the term for a loss or
// a request: f may make one come then.
func WithTestHookReturned(f func(fctx context.Context, e *Election)) LeadOption {
	return func(o *leadOptions) error {
		o.testHookReturned = f
		return nil
	}
}

// InSet reports whether a queue key's value is a MultiMutex's.
func InSet(value []byte) bool {
	_, ok := setNext(value)
	return ok
}

// SetNext returns the name after the lock of a MultiMutex's key, read
// from its value, round its set.
func SetNext(value []byte) (string, bool) { return setNext(value) }

// SetReleasesInFlight sets how many of s's releases go to etcd alone at
// once (releasesInFlight); with 0, every release goes in a batch. Call it
// before s releases anything.
func SetReleasesInFlight(s *Session, n int) {
	s.batch.mu.Lock()
	s.batch.limit = n
	s.batch.mu.Unlock()
}

// ReleasesWaiting returns how many of s's releases wait for a batch.
func ReleasesWaiting(s *Session) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}

// BackgroundRunning returns how many goroutines s runs to finish what a
// caller whose ctx ended left (writeOrHandOff).
func BackgroundRunning(s *Session) int { return int(s.bgN.Load()) }

// Holders is holdersOf, for the tests that judge a queue read from etcd
// (the explorer's invariant, the contract's checks) by the same rule.
func Holders(queue []KeyMode) int { return holdersOf(queue) }
