package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/tuning"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	recipe "go.etcd.io/etcd/client/v3/experimental/recipes"
)

// ErrLocked is returned by a Mutex's TryLock, whatever the implementation,
// when the lock is held by another session. It wraps the implementation's
// own error.
var ErrLocked = errors.New("bench: lock is held by another session")

// An Impl is one of the mutex implementations compared. All use the key
// name/<lease ID in hex>, so a waiter of any can be seen queueing by
// reading that key.
type Impl struct {
	// Name is "etcdlock", "etcd" or "etcdlock-compat", as in benchmark
	// names and tables.
	Name string
	// NewSession grants a lease on cli and keeps it alive until Close.
	NewSession func(ctx context.Context, cli *clientv3.Client) (Session, error)
	// NewSessionTTL is NewSession with a lease TTL of ttl (whole seconds)
	// instead of the implementation's default.
	NewSessionTTL func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error)
}

// A Session is an implementation's session: a lease kept alive.
type Session interface {
	Lease() clientv3.LeaseID
	NewMutex(name string) Mutex
	// NewRWMutex returns the implementation's reader/writer lock: for etcd,
	// its experimental recipe.
	NewRWMutex(name string) RWMutex
	// NewSemaphore returns the implementation's weighted semaphore, or nil
	// when it has none (etcd): such scenarios name their Impls.
	NewSemaphore(name string, capacity int64) Semaphore
	Close() error
}

// An RWMutex is what the scenarios use of a reader/writer lock.
type RWMutex interface {
	Lock(ctx context.Context) error
	Unlock(ctx context.Context) error
	RLock(ctx context.Context) error
	RUnlock(ctx context.Context) error
}

// A Semaphore is what the scenarios use of a weighted semaphore.
type Semaphore interface {
	Acquire(ctx context.Context, n int64) error
	Release(ctx context.Context) error
}

// A Mutex is what the scenarios use of a mutex. TryLock returns an error
// matching ErrLocked when another session holds the lock.
type Mutex interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
}

// Etcdlock is this module's Mutex, with default session options.
var Etcdlock = Impl{
	Name: "etcdlock",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return etcdlockSession{s}, nil
	},
	NewSessionTTL: func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error) {
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithContext(ctx), etcdlock.WithTTL(ttl))
		if err != nil {
			return nil, err
		}
		return etcdlockSession{s}, nil
	},
}

// Unbatched is etcdlock whose sessions send every release alone, as before
// batches (batch.go): the many-names scenarios run it beside etcdlock, to
// measure what batches gain or cost in the same run.
var Unbatched = Impl{
	Name: "etcdlock-unbatched",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		ctx = tuning.WithReleasesInFlight(ctx, math.MaxInt32)
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return etcdlockSession{s}, nil
	},
}

// Etcd is etcd's concurrency.Mutex, with default session options.
var Etcd = Impl{
	Name: "etcd",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return etcdSession{s}, nil
	},
	NewSessionTTL: func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx), concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
		if err != nil {
			return nil, err
		}
		return etcdSession{s}, nil
	},
}

// Impls are the implementations compared, ours first: a scenario runs for
// both unless it names its own (Scenario.Impls).
var Impls = []Impl{Etcdlock, Etcd}

// AllImpls are every implementation a scenario may name: Impls, then
// Compat, then Floor (no lock: the many-names scenarios' floor), then
// Unbatched (etcdlock without batched releases), in the
// order the compare command and the benchmarks run them.
var AllImpls = []Impl{Etcdlock, Etcd, Compat, Floor, Unbatched}

type etcdlockSession struct{ *etcdlock.Session }

func (s etcdlockSession) NewMutex(name string) Mutex {
	return etcdlockMutex{etcdlock.NewMutex(s.Session, name)}
}

func (s etcdlockSession) NewRWMutex(name string) RWMutex {
	return etcdlock.NewRWMutex(s.Session, name)
}

func (s etcdlockSession) NewSemaphore(name string, capacity int64) Semaphore {
	return etcdlock.NewSemaphore(s.Session, name, capacity)
}

type etcdlockMutex struct{ *etcdlock.Mutex }

func (m etcdlockMutex) TryLock(ctx context.Context) error {
	return lockedErr(m.Mutex.TryLock(ctx), etcdlock.ErrLocked)
}

type etcdSession struct{ *concurrency.Session }

func (s etcdSession) NewMutex(name string) Mutex {
	return etcdMutex{concurrency.NewMutex(s.Session, name)}
}

func (s etcdSession) NewRWMutex(name string) RWMutex {
	return etcdRWMutex{recipe.NewRWMutex(s.Session, name)}
}

// NewSemaphore returns nil: etcd has no semaphore.
func (s etcdSession) NewSemaphore(string, int64) Semaphore { return nil }

// etcdRWMutex is etcd's recipe RWMutex. It takes no ctx and cannot be
// cancelled: use it only in runs that end normally.
type etcdRWMutex struct{ m *recipe.RWMutex }

func (m etcdRWMutex) Lock(context.Context) error    { return m.m.Lock() }
func (m etcdRWMutex) Unlock(context.Context) error  { return m.m.Unlock() }
func (m etcdRWMutex) RLock(context.Context) error   { return m.m.RLock() }
func (m etcdRWMutex) RUnlock(context.Context) error { return m.m.RUnlock() }

// semMutex is n permits of a Semaphore used as a Mutex, for the harness
// of the Mutex scenarios.
type semMutex struct {
	s Semaphore
	n int64
}

func (m semMutex) Lock(ctx context.Context) error   { return m.s.Acquire(ctx, m.n) }
func (m semMutex) Unlock(ctx context.Context) error { return m.s.Release(ctx) }
func (m semMutex) TryLock(ctx context.Context) error {
	s, ok := m.s.(interface {
		TryAcquire(context.Context, int64) error
	})
	if !ok {
		return errors.New("bench: this Semaphore has no TryAcquire")
	}
	return lockedErr(s.TryAcquire(ctx, m.n), etcdlock.ErrLocked)
}

// rwWriter is an RWMutex's write lock used as a Mutex, and rwReader its
// read lock, for the harness of the FIFO scenarios. Neither has TryLock.
type (
	rwWriter struct{ m RWMutex }
	rwReader struct{ m RWMutex }
)

var errNoTryLock = errors.New("bench: no TryLock on an RWMutex used as a Mutex")

func (l rwWriter) Lock(ctx context.Context) error   { return l.m.Lock(ctx) }
func (l rwWriter) Unlock(ctx context.Context) error { return l.m.Unlock(ctx) }
func (rwWriter) TryLock(context.Context) error      { return errNoTryLock }
func (l rwReader) Lock(ctx context.Context) error   { return l.m.RLock(ctx) }
func (l rwReader) Unlock(ctx context.Context) error { return l.m.RUnlock(ctx) }
func (rwReader) TryLock(context.Context) error      { return errNoTryLock }

type etcdMutex struct{ *concurrency.Mutex }

func (m etcdMutex) TryLock(ctx context.Context) error {
	return lockedErr(m.Mutex.TryLock(ctx), concurrency.ErrLocked)
}

// lockedErr wraps err with ErrLocked when it is the implementation's own
// "locked" error.
func lockedErr(err, implLocked error) error {
	if errors.Is(err, implLocked) {
		return fmt.Errorf("%w: %w", ErrLocked, err)
	}
	return err
}

// waiterKey is the key a Mutex of the session with the given lease puts
// for the lock called name, in both implementations.
func waiterKey(name string, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, int64(lease))
}
