package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
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
	// Impls names the implementations the scenario runs for; nil: those
	// of Impls (etcdlock and etcd).
	Impls []string
	// Versus, when set, is the result that ratios and targets compare ours
	// with, instead of the other implementation in this scenario: for
	// primitives etcd does not have, one of our own scenarios.
	Versus *Ref
	// Baseline names "theirs" in the tables; default "etcd Mutex".
	Baseline string
}

// A Ref names one implementation's results in one scenario.
type Ref struct{ Scenario, Impl string }

// Refs returns every result that sc's results for ours are compared with:
// Theirs, then those its targets name.
func (sc Scenario) Refs() []Ref {
	refs := []Ref{sc.Theirs()}
	for _, t := range sc.Targets {
		if t.Versus != nil && !slices.Contains(refs, *t.Versus) {
			refs = append(refs, *t.Versus)
		}
	}
	return refs
}

// RunsFor reports whether sc runs for the implementation called impl.
func (sc Scenario) RunsFor(impl string) bool {
	if sc.Impls == nil {
		return slices.ContainsFunc(Impls, func(i Impl) bool { return i.Name == impl })
	}
	return slices.Contains(sc.Impls, impl)
}

// Theirs returns what sc's results for ours are compared with.
func (sc Scenario) Theirs() Ref {
	if sc.Versus != nil {
		return *sc.Versus
	}
	return Ref{sc.Name, Etcd.Name}
}

// Scenarios are all the scenarios, in the order of the tables.
var Scenarios = []Scenario{
	{
		Name: "uncontended", Unit: "Lock+Unlock", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(1.0), RPCsEqual(2)},
		Impls:   withCompat,
		Run:     uncontended,
	},
	{
		Name: "trylock-held", Unit: "TryLock", Short: true, N: 200, ShortN: 40,
		Targets: []Target{RatioAtMost(0.25), RPCsEqual(1), RevsEqual(0)},
		Impls:   withCompat,
		Run:     tryLockHeld,
	},
	{
		Name: "contend-4", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(0.15)},
		Impls:   withCompat,
		Run:     contend(4),
	},
	{
		Name: "contend-16", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets: []Target{RatioAtMost(0.15)},
		Impls:   withCompat,
		Run:     contend(16),
	},
	{
		Name: "fifo-50", Unit: "handoff", Short: true, N: 1, ShortN: 1,
		Targets: []Target{RatioAtMost(0.6), RPCsAtMost(2), RatioVersusAtMost(Ref{"write", Floor.Name}, 1.3),
			RatioVersusAtMost(Ref{"handoff-floor-50", Floor.Name}, 1.1)},
		Impls: withCompat,
		Run:   fifo(50),
	},
	{
		Name: "fifo-300", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets: []Target{RatioAtMost(0.75), RPCsAtMost(2)},
		Impls:   withCompat,
		Run:     fifo(300),
	},
	{
		Name: "fifo-1000", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets: []Target{RatioAtMost(0.8), RPCsAtMost(2), ConstantMemory(1.5)},
		Impls:   withCompat,
		Run:     fifo(1000),
	},
	{
		// Issue 18's targets: etcd's clients share one watch stream each,
		// and the server's cost per waiter follows.
		Name: "waiters-8-clients-1000", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets: waitersTargets(8),
		Run:     waiters("waiters-8-clients-1000", 1000, 8),
	},
	{
		Name: "waiters-own-client-1000", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets: waitersTargets(1000),
		Run:     waiters("waiters-own-client-1000", 1000, 1000),
	},
	{
		Name: "rw-uncontended-read", Unit: "RLock+RUnlock", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(1.0), RPCsEqual(2)},
		Baseline: "etcd recipe RWMutex",
		Run: uncontendedOf("rw-uncontended-read", func(s Session, name string) func(context.Context) error {
			m := s.NewRWMutex(name)
			return pair("RLock", m.RLock, "RUnlock", m.RUnlock)
		}),
	},
	{
		Name: "rw-uncontended-write", Unit: "Lock+Unlock", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(1.0), RPCsEqual(2)},
		Baseline: "etcd recipe RWMutex",
		Run: uncontendedOf("rw-uncontended-write", func(s Session, name string) func(context.Context) error {
			m := s.NewRWMutex(name)
			return pair("Lock", m.Lock, "Unlock", m.Unlock)
		}),
	},
	{
		Name: "rw-16r2w", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(0.2)},
		Baseline: "etcd recipe RWMutex",
		Run:      rwContend(16, 2),
	},
	{
		// The target: all readers in within twice the time of one
		// Mutex handoff (an Unlock and the next waiter's check).
		Name: "rw-readers-50", Unit: "50 readers admitted", Short: true, N: 5, ShortN: 1,
		Targets:  []Target{RatioVersusAtMost(Ref{"fifo-50", Etcdlock.Name}, 2.0)},
		Baseline: "etcd recipe RWMutex",
		Run:      rwReaders(50),
	},
	{
		Name: "sem-uncontended", Unit: "Acquire+Release", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(1.05), RPCsEqual(2)},
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"uncontended", Etcdlock.Name},
		Baseline: "etcdlock Mutex",
		Run: uncontendedOf("sem-uncontended", func(s Session, name string) func(context.Context) error {
			m := semMutex{s.NewSemaphore(name, 4), 1}
			return pair("Acquire", m.Lock, "Release", m.Unlock)
		}),
	},
	{
		Name: "sem-4x16", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(1.0)},
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"contend-16", Etcdlock.Name},
		Baseline: "etcdlock Mutex (contend-16)",
		Run: contendWith("sem-4x16", 16, 4, func(s Session, name string) Mutex {
			return semMutex{s.NewSemaphore(name, 4), 1}
		}),
	},
	{
		Name: "sem-fifo-100", Unit: "handoff", Short: true, N: 1, ShortN: 1,
		Targets:  []Target{RPCsAtMost(2), ConstantMemory(1.5)},
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"fifo-50", Etcdlock.Name},
		Baseline: "etcdlock Mutex (fifo-50)",
		Run:      semFIFO(100, 4),
	},
	{
		Name: "sem-fifo-1000", Unit: "handoff", Short: false, N: 1, ShortN: 1,
		Targets:  []Target{RPCsAtMost(2), ConstantMemory(1.5)},
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"sem-fifo-100", Etcdlock.Name},
		Baseline: "etcdlock Semaphore (sem-fifo-100)",
		Run:      semFIFO(1000, 4),
	},
}

// waitersTargets are the goals of the waiters-… scenarios on clients
// clients: a watch stream per client at most, and per waiter no more than
// etcd's Mutex costs, give or take a fifth.
func waitersTargets(clients int) []Target {
	return []Target{
		ServerStreamsAtMost(float64(clients)), ServerHeapAtMost(1.2), ServerGoroutinesAtMost(1.2),
		ClientHeapAtMost(1.2), ClientGoroutinesAtMost(1),
	}
}

// pair returns one iteration of an uncontended scenario: lock, then unlock.
func pair(lockOp string, lock func(context.Context) error, unlockOp string, unlock func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := lock(ctx); err != nil {
			return fmt.Errorf("bench: %s: %w", lockOp, err)
		}
		if err := unlock(ctx); err != nil {
			return fmt.Errorf("bench: %s: %w", unlockOp, err)
		}
		return nil
	}
}

// Lookup returns the scenario called name, in Scenarios or ScaleScenarios.
func Lookup(name string) (Scenario, bool) {
	for _, sc := range slices.Concat(Scenarios, ScaleScenarios) {
		if sc.Name == name {
			return sc, true
		}
	}
	return Scenario{}, false
}

// uncontended measures Lock then Unlock by one session that no one else
// competes with.
var uncontended = uncontendedOf("uncontended", func(s Session, name string) func(context.Context) error {
	m := s.NewMutex(name)
	return func(ctx context.Context) error { return lockUnlock(ctx, m) }
})

// uncontendedOf returns the scenario called label in which one session
// that no one else competes with runs the iteration that newOp returns,
// for a lock of its own.
func uncontendedOf(label string, newOp func(s Session, name string) func(context.Context) error) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
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
		op := newOp(ss[0], env.lockName(label, impl))

		// One round outside the window warms the connection up.
		if err := op(ctx); err != nil {
			return Result{}, err
		}
		mt := newMeter(env, &cs.rpcs, timer)
		if err := mt.start(ctx); err != nil {
			return Result{}, err
		}
		for range n {
			if err := op(ctx); err != nil {
				return Result{}, err
			}
		}
		if err := mt.stop(ctx, int64(n)); err != nil {
			return Result{}, err
		}
		return mt.result(), nil
	}
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
	return contendWith(fmt.Sprintf("contend-%d", k), k, 1, Session.NewMutex)
}

// contendWith is contend for the lock called label, taken with newLock,
// which admits up to capacity holders at once: more fail the run, and with
// a capacity above 1 so does never having more than one inside.
func contendWith(label string, k int, capacity int64, newLock func(s Session, name string) Mutex) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
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

		name := env.lockName(label, impl)
		win := newWindow(env, newMeter(env, &cs.rpcs, timer), k, n)
		var (
			inside    atomic.Int64 // holders inside the critical section
			maxInside atomic.Int64 // the most seen inside at once
		)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		failed := &failure{cancel: cancel}
		fail := failed.fail
		var wg sync.WaitGroup
		for _, s := range ss {
			m := newLock(s, name)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !win.over() {
					if err := m.Lock(ctx); err != nil {
						fail(fmt.Errorf("bench: Lock: %w", err))
						return
					}
					in := inside.Add(1)
					if in > capacity {
						fail(fmt.Errorf("bench: mutual exclusion violated: %d holders inside at once, capacity %d", in, capacity))
						return
					}
					for m := maxInside.Load(); in > m && !maxInside.CompareAndSwap(m, in); m = maxInside.Load() {
					}
					err := win.step(ctx)
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
		if err := failed.first(); err != nil {
			return Result{}, err
		}
		if capacity > 1 && maxInside.Load() < 2 {
			return Result{}, fmt.Errorf("bench: never more than one holder inside, capacity %d", capacity)
		}
		return win.mt.result(), nil
	}
}

// rwContend returns the scenario of readers and writers, each with its own
// client and session, that loop RLock/RUnlock and Lock/Unlock as fast as
// they can; an acquisition is either. The first readers+writers
// acquisitions warm up; the window spans the next n. A writer inside with
// anyone else fails the run.
func rwContend(readers, writers int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		k := readers + writers
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

		name := env.lockName(fmt.Sprintf("rw-%dr%dw", readers, writers), impl)
		win := newWindow(env, newMeter(env, &cs.rpcs, timer), k, n)
		var rInside, wInside atomic.Int64
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		failed := &failure{cancel: cancel}
		fail := failed.fail
		var wg sync.WaitGroup
		for i, s := range ss {
			m := s.NewRWMutex(name)
			writer := i < writers
			lock, unlock, own, other := m.RLock, m.RUnlock, &rInside, &wInside
			if writer {
				lock, unlock, own, other = m.Lock, m.Unlock, &wInside, &rInside
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !win.over() {
					if err := lock(ctx); err != nil {
						fail(fmt.Errorf("bench: lock: %w", err))
						return
					}
					in := own.Add(1)
					if other.Load() != 0 || (writer && in != 1) {
						fail(errors.New("bench: a writer is inside with another holder"))
					}
					err := win.step(ctx)
					own.Add(-1)
					if err != nil {
						fail(err)
					}
					// The recipe's calls take no ctx: every contender
					// unlocks and keeps going until the window is over, so
					// that none is left waiting.
					if err := unlock(ctx); err != nil {
						fail(fmt.Errorf("bench: unlock: %w", err))
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := failed.first(); err != nil {
			return Result{}, err
		}
		return win.mt.result(), nil
	}
}

// A window measures n acquisitions of a contention scenario after k that
// warm up: the meter starts in the k-th acquisition and stops in the
// (k+n)-th, both inside the critical section. It is safe for concurrent
// use by the contenders.
type window struct {
	mt         *meter
	warm, last int64
	seq        atomic.Int64  // acquisitions so far
	started    chan struct{} // closed once the meter started
	hold       func(context.Context) error
}

func newWindow(env *Env, mt *meter, k, n int) *window {
	return &window{mt: mt, warm: int64(k), last: int64(k + n), started: make(chan struct{}), hold: env.hold}
}

// over reports whether the window's last acquisition has been made.
func (w *window) over() bool { return w.seq.Load() >= w.last }

// step counts one acquisition, made inside the critical section, and
// starts or stops the meter when it is the warm or the last one.
func (w *window) step(ctx context.Context) error {
	switch w.seq.Add(1) {
	case w.warm:
		err := w.mt.start(ctx)
		close(w.started)
		return err
	case w.last:
		// With holders inside at once, the last acquisition can come
		// before the warm one has started the meter.
		<-w.started
		return w.mt.stop(ctx, w.last-w.warm)
	default:
		if w.hold != nil {
			return w.hold(ctx)
		}
		runtime.Gosched() // give an intruder time to show up
		return nil
	}
}

// A failure keeps the first error of a scenario's goroutines, and cancels
// their context at it, so that the others stop.
type failure struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	err    error
}

// fail records err if it is the first, and cancels.
func (f *failure) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.cancel()
}

// first returns the first error recorded, or nil.
func (f *failure) first() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
