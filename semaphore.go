package etcdlock

import (
	"context"
)

// A Semaphore is a fair distributed weighted semaphore on etcd, like
// golang.org/x/sync/semaphore.Weighted across processes: holders take n of
// capacity permits, and a hold is admitted while the permits held, its own
// included, fit the capacity. It shares the Mutex's queue and guarantees:
// waiters are admitted strictly in the order their keys were created
// (their create revision); a waiter notices at once that its own lease
// ended; the holder is told first that its hold was lost (Done, Err); and
// Token and IsOwner fence a hold.
//
// Strict FIFO means head of line: a waiter for n blocks later waiters for
// fewer, even when those would fit, as x/sync's semaphore does. That keeps
// heavy waiters from starving.
//
// The key is name/<lease ID in hex>, like a Mutex's, and its value is
// "etcdlock/1 permits n of capacity". Capacity is per client: a permit is
// admitted only if the permits ahead of it plus its own fit the smallest
// capacity among itself and every key ahead, so while a client holds, the
// permits held in all are at most its own capacity, and a rolling change of
// capacity is safe in both directions. A key of any other primitive on the
// same name (a Mutex, an RWMutex, etcd's Mutex) excludes every permit, and
// the reverse.
//
// A waiter watches its "window": the nearest keys ahead whose permits,
// with its own, exceed the capacity. Releasing the oldest holder wakes
// exactly the waiters it admits; any release wakes at most capacity
// waiters, whatever the queue's length.
//
// A Semaphore is safe for concurrent use. It has one hold at a time per
// value, session and name: while it holds, Acquire from another goroutine
// waits and TryAcquire returns ErrLocked even when permits are left. Use a
// Session per concurrent holder.
type Semaphore struct {
	queue
	capacity int64
}

// NewSemaphore returns a Semaphore of capacity permits for the lock called
// name, taken through session s. A capacity below 1 is reported by
// Acquire, TryAcquire and Do, as ErrInvalidOption, like invalid options;
// the name is checked as NewMutex's is.
func NewSemaphore(s *Session, name string, capacity int64, opts ...MutexOption) *Semaphore {
	sem := &Semaphore{capacity: capacity}
	if capacity < 1 {
		// Reported after any invalid option given.
		opts = append(opts[:len(opts):len(opts)], func(*mutexOptions) error {
			return errorf("%w: capacity %d, want at least 1", ErrInvalidOption, capacity)
		})
	}
	sem.init(s, name, KindSemaphore, opts)
	return sem
}

// Acquire blocks until n permits are held, ctx ends, or the session ends.
// It returns ErrInvalidWeight at once, with no RPC, for n below 1 or above
// the capacity. It sets no deadline of its own; on failure it leaves no key
// under the lock's prefix and returns what Mutex.Lock returns.
func (s *Semaphore) Acquire(ctx context.Context, n int64) error {
	mode, err := s.mode(n)
	if err != nil {
		return err
	}
	return s.lock(ctx, mode, true)
}

// TryAcquire takes n permits if they are free and no one waits ahead, and
// otherwise returns ErrLocked at once without joining the queue, as
// Mutex.TryLock does.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) error {
	mode, err := s.mode(n)
	if err != nil {
		return err
	}
	return s.lock(ctx, mode, false)
}

// Release gives the permits back. It returns what Mutex.Unlock returns:
// ErrLockReleased when the Semaphore holds none.
func (s *Semaphore) Release(ctx context.Context) error { return s.unlock(ctx, nil, "Release") }

// Do acquires n permits, runs fn, and releases them, as Mutex.Do does.
func (s *Semaphore) Do(ctx context.Context, n int64, fn func(ctx context.Context) error) error {
	mode, err := s.mode(n)
	if err != nil {
		return err
	}
	return s.do(ctx, mode, fn)
}

// mode returns the mode of a hold of n permits, or why there is none.
func (s *Semaphore) mode(n int64) (KeyMode, error) {
	if err := s.validate(); err != nil {
		return KeyMode{}, err
	}
	if n < 1 || n > s.capacity {
		return KeyMode{}, errorf("%w: %d of capacity %d", ErrInvalidWeight, n, s.capacity)
	}
	return KeyMode{Weight: n, Capacity: s.capacity}, nil
}
