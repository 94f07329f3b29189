package bench

import (
	"context"
	"fmt"
	"slices"

	"github.com/etcdlock/etcdlock"
)

// The MultiMutex scenarios: one hold over two names. Ours is a MultiMutex,
// whose one Txn puts both keys; the way to do it without one, with either
// library, is a Mutex per name, locked in sorted order (one global order
// of names keeps callers from deadlocking) and unlocked in reverse.
//
//   - multi-2-uncontended, multi-2-contend-8: our MultiMutex against
//     etcd's Mutexes locked in sorted order, alone and with 8 contenders
//     for the same two names (half of them naming them in the other
//     order, which a MultiMutex allows);
//   - pair-2-uncontended, pair-2-contend-8: our Mutexes locked in sorted
//     order, compared with our MultiMutex.
var multiScenarios = []Scenario{
	{
		Name: "multi-2-uncontended", Unit: "Lock+Unlock of 2 names", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(0.6), RPCsEqual(2)},
		Baseline: "etcd Mutexes in sorted order",
		Run: uncontendedOf("multi-2-uncontended", func(s Session, name string) func(context.Context) error {
			m := newMulti(s, twoNames(name, 0), true)
			return func(ctx context.Context) error { return lockUnlock(ctx, m) }
		}),
	},
	{
		Name: "multi-2-contend-8", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(0.3)},
		Baseline: "etcd Mutexes in sorted order",
		Run:      contendWith("multi-2-contend-8", 8, 1, multiOf(true)),
	},
	{
		Name: "pair-2-uncontended", Unit: "Lock+Unlock of 2 names", Short: true, N: 100, ShortN: 20,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"multi-2-uncontended", Etcdlock.Name},
		Baseline: "etcdlock MultiMutex",
		Run: uncontendedOf("pair-2-uncontended", func(s Session, name string) func(context.Context) error {
			m := newMulti(s, twoNames(name, 0), false)
			return func(ctx context.Context) error { return lockUnlock(ctx, m) }
		}),
	},
	{
		Name: "pair-2-contend-8", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"multi-2-contend-8", Etcdlock.Name},
		Baseline: "etcdlock MultiMutex",
		Run:      contendWith("pair-2-contend-8", 8, 1, multiOf(false)),
	},
}

func init() { Scenarios = append(Scenarios, multiScenarios...) }

// twoNames returns the two names of a scenario on name, in one order or
// the other.
func twoNames(name string, order int) []string {
	names := []string{name + "/a", name + "/b"}
	if order%2 == 1 {
		slices.Reverse(names)
	}
	return names
}

// multiOf returns the newLock of a contention scenario: each contender's
// hold over the two names, half of them naming them in the other order.
func multiOf(multi bool) func(s Session, name string) Mutex {
	n := 0
	return func(s Session, name string) Mutex {
		n++
		return newMulti(s, twoNames(name, n), multi)
	}
}

// newMulti returns one hold over names for s: our MultiMutex when multi
// is set and s is ours, else a Mutex per name locked in sorted order.
func newMulti(s Session, names []string, multi bool) Mutex {
	if ours, ok := s.(etcdlockSession); ok && multi {
		return etcdlockMulti{etcdlock.NewMultiMutex(ours.Session, names)}
	}
	sorted := slices.Sorted(slices.Values(names))
	ms := make(sortedMutexes, len(sorted))
	for i, n := range sorted {
		ms[i] = s.NewMutex(n)
	}
	return ms
}

type etcdlockMulti struct{ *etcdlock.MultiMutex }

func (m etcdlockMulti) TryLock(ctx context.Context) error {
	return lockedErr(m.MultiMutex.TryLock(ctx), etcdlock.ErrLocked)
}

// sortedMutexes are Mutexes locked one after the other, in the order of
// their names, and unlocked in reverse. A failed Lock unlocks the ones it
// took.
type sortedMutexes []Mutex

func (ms sortedMutexes) Lock(ctx context.Context) error {
	return ms.take(ctx, Mutex.Lock)
}

func (ms sortedMutexes) TryLock(ctx context.Context) error {
	return ms.take(ctx, Mutex.TryLock)
}

func (ms sortedMutexes) take(ctx context.Context, lock func(Mutex, context.Context) error) error {
	for i, m := range ms {
		if err := lock(m, ctx); err != nil {
			if uerr := ms[:i].Unlock(context.WithoutCancel(ctx)); uerr != nil {
				return fmt.Errorf("%w; unlocking the names taken: %w", err, uerr)
			}
			return err
		}
	}
	return nil
}

func (ms sortedMutexes) Unlock(ctx context.Context) error {
	var first error
	for i := len(ms) - 1; i >= 0; i-- {
		if err := ms[i].Unlock(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}
