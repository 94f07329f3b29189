package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Scenario is one measured situation, run the same way for every Impl on
// the same cluster.
type Scenario struct {
	Name string
	// Unit is what one operation is.
	Unit string
	// Short reports whether the scenario runs under -short (in CI).
	Short bool
	// N and ShortN are the n that the compare command passes to Run in
	// each round, normally and under -short.
	N, ShortN int
	// Targets are the goals for this library against etcd's Mutex.
	Targets []Target
	// Run measures n iterations of the scenario for impl. An iteration is
	// one operation, except in the FIFO scenarios, where it is one queue
	// drained (a handoff per waiter). timer, when not nil, is started and
	// stopped around what is measured. Run returns an error when the
	// lock misbehaved: two holders at once, or waiters served out of order.
	Run func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error)
}

// Scenarios are all the scenarios, in the order of the tables.
var Scenarios = []Scenario{
	{
		Name: "uncontended", Unit: "Lock+Unlock", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(1.0), RPCsEqual(2)},
		Run:     uncontended,
	},
	{
		Name: "trylock-held", Unit: "TryLock", Short: true, N: 200, ShortN: 40,
		Targets: []Target{RatioAtMost(0.25), RPCsEqual(1), RevsEqual(0)},
		Run:     tryLockHeld,
	},
	{
		Name: "contend-4", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(0.15)},
		Run:     contend(4),
	},
	{
		Name: "contend-16", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(0.15)},
		Run:     contend(16),
	},
	{
		Name: "fifo-50", Unit: "handoff", Short: true, N: 1, ShortN: 1,
		Targets: []Target{RatioAtMost(0.6), RPCsAtMost(2)},
		Run:     fifo(50),
	},
	{
		Name: "fifo-1000", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets: []Target{RatioAtMost(0.8), RPCsAtMost(2), ConstantMemory(1.5)},
		Run:     fifo(1000),
	},
}

// Lookup returns the scenario called name.
func Lookup(name string) (Scenario, bool) {
	for _, sc := range Scenarios {
		if sc.Name == name {
			return sc, true
		}
	}
	return Scenario{}, false
}

// uncontended measures Lock then Unlock by one session that no one else
// competes with.
func uncontended(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
	cs, err := env.newClients(1, env.singleMember())
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	ss, err := newSessions(ctx, impl, cs.clis, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeSessions(ss)
	m := ss[0].NewMutex(env.lockName("uncontended", impl))

	// One round outside the window warms the connection up.
	if err := lockUnlock(ctx, m); err != nil {
		return Result{}, err
	}
	mt := newMeter(env, &cs.rpcs, timer)
	if err := mt.start(ctx); err != nil {
		return Result{}, err
	}
	for range n {
		if err := lockUnlock(ctx, m); err != nil {
			return Result{}, err
		}
	}
	if err := mt.stop(ctx, int64(n)); err != nil {
		return Result{}, err
	}
	return mt.result(), nil
}

func lockUnlock(ctx context.Context, m Mutex) error {
	if err := m.Lock(ctx); err != nil {
		return fmt.Errorf("bench: Lock: %w", err)
	}
	if err := m.Unlock(ctx); err != nil {
		return fmt.Errorf("bench: Unlock: %w", err)
	}
	return nil
}

// tryLockHeld measures TryLock on a lock that another session, on another
// client, holds throughout.
func tryLockHeld(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
	cs, err := env.newClients(2, env.singleMember())
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	// The holder's client is the second one, on another member on three
	// members; only the first one's RPCs matter, but both are counted and
	// the holder makes none but keepalives in the window.
	ss, err := newSessions(ctx, impl, []*clientv3.Client{cs.clis[1], cs.clis[0]}, 2)
	if err != nil {
		return Result{}, err
	}
	defer closeSessions(ss)
	name := env.lockName("trylock-held", impl)
	holder, m := ss[0].NewMutex(name), ss[1].NewMutex(name)
	if err := holder.Lock(ctx); err != nil {
		return Result{}, fmt.Errorf("bench: holder Lock: %w", err)
	}
	try := func() error {
		if err := m.TryLock(ctx); !errors.Is(err, ErrLocked) {
			return fmt.Errorf("bench: TryLock on a held lock returned %v, want ErrLocked", err)
		}
		return nil
	}
	if err := try(); err != nil {
		return Result{}, err
	}
	mt := newMeter(env, &cs.rpcs, timer)
	if err := mt.start(ctx); err != nil {
		return Result{}, err
	}
	for range n {
		if err := try(); err != nil {
			return Result{}, err
		}
	}
	if err := mt.stop(ctx, int64(n)); err != nil {
		return Result{}, err
	}
	if err := holder.Unlock(ctx); err != nil {
		return Result{}, fmt.Errorf("bench: holder Unlock: %w", err)
	}
	return mt.result(), nil
}

// contend returns the scenario of k contenders, each with its own client
// and session, that take the lock in turns as fast as they can. The first k
// acquisitions warm up and are not measured; the window then spans n
// handoffs, from inside one hold to inside the n-th next one.
//
// On the side, each holder counts itself in and out: if a holder finds
// another inside, the run fails.
func contend(k int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		cs, err := env.newClients(k, 0)
		if err != nil {
			return Result{}, err
		}
		defer cs.close()
		ss, err := newSessions(ctx, impl, cs.clis, k)
		if err != nil {
			return Result{}, err
		}
		defer closeSessions(ss)

		name := env.lockName(fmt.Sprintf("contend-%d", k), impl)
		mt := newMeter(env, &cs.rpcs, timer)
		warm, last := int64(k), int64(k+n)
		var (
			inside atomic.Int64 // holders inside the critical section
			seq    atomic.Int64 // acquisitions so far
		)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var (
			mu       sync.Mutex
			firstErr error
		)
		fail := func(err error) {
			mu.Lock()
			if firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
			cancel()
		}
		var wg sync.WaitGroup
		for _, s := range ss {
			m := s.NewMutex(name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for seq.Load() < last {
					if err := m.Lock(ctx); err != nil {
						fail(fmt.Errorf("bench: Lock: %w", err))
						return
					}
					if in := inside.Add(1); in != 1 {
						fail(fmt.Errorf("bench: mutual exclusion violated: %d holders inside at once", in))
						return
					}
					var err error
					switch seq.Add(1) {
					case warm:
						err = mt.start(ctx)
					case last:
						err = mt.stop(ctx, int64(n))
					default:
						runtime.Gosched() // give an intruder time to show up
					}
					inside.Add(-1)
					if err != nil {
						fail(err)
						return
					}
					if err := m.Unlock(ctx); err != nil {
						fail(fmt.Errorf("bench: Unlock: %w", err))
						return
					}
				}
			}()
		}
		wg.Wait()
		if firstErr != nil {
			return Result{}, firstErr
		}
		return mt.result(), nil
	}
}
