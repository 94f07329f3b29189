package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// MemCost is what one held lock or one waiter costs the client process:
// the growth of the heap (after a GC), of the goroutine stacks and of the
// number of goroutines, divided by the number of units added. It is
// measured over the units added after a first few (the warm-up: streams,
// maps and pools that come once per client or session), split in two
// halves; Growth is the heap per unit of the second half over that of the
// first: about 1 when a unit's cost does not depend on how many there are.
type MemCost struct {
	Units      int64
	Heap       float64
	Stack      float64
	Goroutines float64
	Growth     float64
}

// memWarmup is how many units are added before the first snapshot.
const memWarmup = 16

// MemHeld measures n locks (distinct names) held by one session of impl
// on one client, and, with done, the cost of watching each for loss: Done
// called on each (etcdlock only; etcd's Mutex has no Done). If
// afterWarmup is not nil, it is called once the units are added, before
// they are released: the benchmark writes a heap profile there.
func MemHeld(ctx context.Context, env *Env, impl Impl, n int, done bool, afterWarmup func()) (MemCost, error) {
	cs, err := env.newClients(1, env.singleMember())
	if err != nil {
		return MemCost{}, err
	}
	defer cs.close()
	ss, err := newSessions(ctx, impl, cs.clis, 1)
	if err != nil {
		return MemCost{}, err
	}
	defer closeSessions(ss)
	pfx := env.lockName("mem-held", impl)
	var (
		mu    sync.Mutex // guards locks
		locks []Mutex
	)
	defer func() {
		forEach(len(locks), func(i int) { locks[i].Unlock(context.WithoutCancel(ctx)) })
	}()
	add := func(from, to int) error {
		errs := make([]error, to-from)
		forEach(to-from, func(i int) {
			m := ss[0].NewMutex(fmt.Sprintf("%s/%06d", pfx, from+i))
			if errs[i] = m.Lock(ctx); errs[i] != nil {
				return
			}
			mu.Lock()
			locks = append(locks, m)
			mu.Unlock()
			if done {
				d, ok := m.(interface{ Done() <-chan struct{} })
				if !ok {
					errs[i] = errors.New("bench: this Mutex has no Done")
					return
				}
				d.Done()
			}
		})
		return errors.Join(errs...)
	}
	// A held lock's watch is set up in the background; wait until the
	// members' watchers are steady before each snapshot.
	settle := func() error { return env.settleWatchers(ctx, &cs.rpcs, noFailure) }
	return measureUnits(n, add, settle, afterWarmup)
}

// MemWaiting measures n waiters of impl queued behind a holder: one
// session holds n locks (distinct names) and one other session, on
// another client, waits for each of them. A waiter is the goroutine
// blocked in Lock and what the Mutex keeps while it waits; the sessions
// and clients are in the warm-up.
func MemWaiting(ctx context.Context, env *Env, impl Impl, n int, afterWarmup func()) (MemCost, error) {
	cs, err := env.newClients(2, env.singleMember())
	if err != nil {
		return MemCost{}, err
	}
	defer cs.close()
	ss, err := newSessions(ctx, impl, cs.clis, 2)
	if err != nil {
		return MemCost{}, err
	}
	defer closeSessions(ss)
	holder, waiter := ss[0], ss[1]
	pfx := env.lockName("mem-waiting", impl)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var (
		errMu    sync.Mutex // guards firstErr
		firstErr error      // of a waiter
	)
	failed := func() error {
		errMu.Lock()
		defer errMu.Unlock()
		return firstErr
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	var (
		mu    sync.Mutex // guards held
		held  []Mutex
		total int
	)
	defer func() {
		forEach(len(held), func(i int) { held[i].Unlock(context.WithoutCancel(ctx)) })
	}()
	add := func(from, to int) error {
		errs := make([]error, to-from)
		forEach(to-from, func(i int) {
			m := holder.NewMutex(fmt.Sprintf("%s/%06d", pfx, from+i))
			if errs[i] = m.Lock(ctx); errs[i] == nil {
				mu.Lock()
				held = append(held, m)
				mu.Unlock()
			}
		})
		if err := errors.Join(errs...); err != nil {
			return err
		}
		for i := from; i < to; i++ {
			m := waiter.NewMutex(fmt.Sprintf("%s/%06d", pfx, i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := m.Lock(wctx)
				if wctx.Err() != nil {
					return // the run is over
				}
				if err == nil {
					err = errors.New("bench: a waiter got a lock that is held")
				}
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
			}()
		}
		total = to
		// Every waiter's key is in, and the waiters are idle.
		err := poll(ctx, pollInterval, func() (bool, error) {
			if err := failed(); err != nil {
				return false, err
			}
			k, err := env.countKeys(ctx, pfx)
			return k == int64(2*total), err
		})
		if err != nil {
			return err
		}
		return env.settleWatchers(ctx, &cs.rpcs, failed)
	}
	return measureUnits(n, add, func() error { return nil }, afterWarmup)
}

// measureUnits adds memWarmup units, then n in two halves, taking a
// snapshot after each, and turns them into costs per unit. add(from, to)
// adds units from to to-1; settle waits until they are idle.
func measureUnits(n int, add func(from, to int) error, settle func() error, afterAll func()) (MemCost, error) {
	first := n / 2
	bounds := []int{memWarmup, memWarmup + first, memWarmup + n}
	var snaps []memSnapshot
	from := 0
	for _, to := range bounds {
		if err := add(from, to); err != nil {
			return MemCost{}, err
		}
		if err := settle(); err != nil {
			return MemCost{}, err
		}
		snaps = append(snaps, takeMemSnapshot())
		from = to
	}
	if afterAll != nil {
		afterAll()
	}
	m0, m1, m2 := snaps[0], snaps[1], snaps[2]
	c := MemCost{
		Units:      int64(n),
		Heap:       float64(m2.heap-m0.heap) / float64(n),
		Stack:      float64(m2.stack-m0.stack) / float64(n),
		Goroutines: float64(m2.goroutines-m0.goroutines) / float64(n),
	}
	early := float64(m1.heap-m0.heap) / float64(first)
	late := float64(m2.heap-m1.heap) / float64(n-first)
	if early > 0 {
		c.Growth = late / early
	}
	return c, nil
}

// pollInterval is how often the memory scenarios look at etcd's state.
const pollInterval = 20 * time.Millisecond

func noFailure() error { return nil }
