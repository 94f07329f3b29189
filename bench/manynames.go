package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
)

// The many-names scenarios model what most services do with a lock: a lock
// per entity (an order, an account, a file), many distinct names locked and
// unlocked at once by one process, none of them contended. g goroutines
// each loop Lock then Unlock, and every cycle takes a name that nobody has
// used before, with a Mutex made for it: a request handler locks the entity
// its request is about, and the next request is, in the common case, about
// another one. A fixed name per goroutine would model g entities locked over
// and over, and would hide what a name leaves behind once unlocked (on the
// client, in a session's notes; on the server, a deleted key's index entry
// until compaction), which a service with millions of entities pays.
//
//   - many-names-4, many-names-16, many-names-64, many-names-256: the g
//     goroutines share one Session, on one client (at 4, as many releases
//     are in flight as a Session sends alone: no batch forms, batch.go);
//   - many-names-16-sessions, …-64-sessions, …-256-sessions: each
//     goroutine has a Session of its own, all on the same one client, as a
//     service that makes a session per worker does. The sessions share the
//     client's connection and streams, so what differs from the rows above
//     is the sessions alone.
//
// Each runs for etcdlock, etcd's Mutex, the concurrency package, Floor (a
// Put of the key with the session's lease, then its Delete, the least any
// lock on etcd writes per cycle) and Unbatched (etcdlock sending every
// release alone).
//
// An iteration (the n of Run) is g cycles: the goroutines take cycles from
// one count until n*g are done, and every figure is per cycle (one
// Lock+Unlock). Each goroutine makes one cycle before the window, which
// warms the connection and the sessions up. After the window, no key may
// be left under the scenario's names: every Unlock deleted its key.
var manyNamesScenarios = []Scenario{
	manyNamesScenario(4, false, false),
	manyNamesScenario(16, false, true),
	manyNamesScenario(64, false, false),
	manyNamesScenario(256, false, false),
	manyNamesScenario(16, true, true),
	manyNamesScenario(64, true, false),
	manyNamesScenario(256, true, false),
}

func init() { Scenarios = append(Scenarios, manyNamesScenarios...) }

// withFloor is Scenario.Impls for the many-names scenarios.
var withFloor = []string{Etcdlock.Name, Etcd.Name, Compat.Name, Floor.Name, Unbatched.Name}

// ManyNamesUnit is the Unit of the many-names scenarios: one cycle.
const ManyNamesUnit = "Lock+Unlock of a name"

// manyNamesScenario returns the scenario of g goroutines on one session
// or, with ownSessions, on a session each. Under -short (short) only the
// smallest run.
func manyNamesScenario(g int, ownSessions, short bool) Scenario {
	name := fmt.Sprintf("many-names-%d", g)
	if ownSessions {
		name += "-sessions"
	}
	// About 3000 cycles a round, at least 10 per goroutine: a second or
	// two on one member.
	n := max(3000/g, 10)
	// Where a session's releases go in batches (batch.go), below etcd's
	// time by a tenth; elsewhere level.
	ratio := 1.0
	if g >= 64 && !ownSessions {
		ratio = 0.9
	}
	return Scenario{
		Name: name, Unit: ManyNamesUnit, Short: short, N: n, ShortN: 2,
		Targets: []Target{RatioAtMost(ratio), RPCsAtMost(2), RevsAtMost(2)},
		Impls:   withFloor,
		Run:     manyNames(name, g, ownSessions),
	}
}

// manyNames returns the scenario called label: g goroutines, each
// looping Lock+Unlock on fresh names, on one session or (ownSessions) on
// a session each, all on one client.
func manyNames(label string, g int, ownSessions bool) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		cs, err := env.newClients(1, env.singleMember())
		if err != nil {
			return Result{}, err
		}
		defer cs.close()
		sessions := 1
		if ownSessions {
			sessions = g
		}
		ss, err := newSessions(ctx, impl, cs.clis, sessions)
		if err != nil {
			return Result{}, err
		}
		defer closeSessions(ss)

		prefix := env.lockName(label, impl)
		cycles := int64(n) * int64(g)
		var taken atomic.Int64 // cycles of the window taken so far
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		failed := &failure{cancel: cancel}
		fail := failed.fail
		start := make(chan struct{})
		var warm, wg sync.WaitGroup
		for i := range g {
			s := ss[i%len(ss)]
			// Goroutine i's names are prefix/i/0, prefix/i/1, …
			base := prefix + "/" + strconv.Itoa(i) + "/"
			cycle := func(c int64) error {
				return lockUnlock(ctx, s.NewMutex(base+strconv.FormatInt(c, 10)))
			}
			warm.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := cycle(0)
				warm.Done()
				if err != nil {
					fail(err)
					return
				}
				select {
				case <-start:
				case <-ctx.Done():
					return
				}
				for c := int64(1); taken.Add(1) <= cycles; c++ {
					if err := cycle(c); err != nil {
						fail(err)
						return
					}
				}
			}()
		}
		warm.Wait()
		mt := newMeter(env, &cs.rpcs, timer)
		if err := mt.start(ctx); err != nil {
			fail(err)
		}
		close(start)
		wg.Wait()
		if err := failed.first(); err != nil {
			return Result{}, err
		}
		if err := mt.stop(ctx, cycles); err != nil {
			return Result{}, err
		}
		left, err := env.countKeys(ctx, prefix)
		if err != nil {
			return Result{}, err
		}
		if left != 0 {
			return Result{}, fmt.Errorf("bench: %d keys left under %s after every Unlock", left, prefix)
		}
		return mt.result(), nil
	}
}
