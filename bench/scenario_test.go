package bench

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestScenarios runs every kind of scenario, small, for every
// implementation (the concurrency package's too), so that the benchmarks'
// harness is checked (with -race in CI) without running the benchmarks.
func TestScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, impl := range AllImpls {
		if !slices.Contains(withCompat, impl.Name) {
			continue // the floor is no lock
		}
		t.Run(impl.Name, func(t *testing.T) {
			r, err := uncontended(t.Context(), env, impl, 3, nil)
			require.NoError(t, err)
			require.EqualValues(t, 3, r.Ops)
			require.Positive(t, r.Elapsed)
			// Every Mutex takes one write to lock and one to unlock.
			require.Equal(t, 2.0, r.RPCsPerOp())
			require.Equal(t, 2.0, r.RevsPerOp())

			r, err = tryLockHeld(t.Context(), env, impl, 3, nil)
			require.NoError(t, err)
			require.EqualValues(t, 3, r.Ops)
			if impl.Name != Etcd.Name {
				// etcdlock's queue: one read, no write.
				require.Equal(t, 1.0, r.RPCsPerOp())
				require.Equal(t, 0.0, r.RevsPerOp())
			}

			r, err = contend(3)(t.Context(), env, impl, 6, nil)
			require.NoError(t, err)
			require.EqualValues(t, 6, r.Ops)
			// Every acquisition puts a key and deletes it.
			require.InDelta(t, 2.0, r.RevsPerOp(), 0.5)

			r, err = fifo(12)(t.Context(), env, impl, 1, nil)
			require.NoError(t, err)
			require.EqualValues(t, 12, r.Ops)
			require.Equal(t, 1.0, r.RevsPerOp(), "a handoff deletes one key")
			require.NotNil(t, r.Queue)
			require.GreaterOrEqual(t, r.Queue.Goroutines, 1.0, "a waiter has at least the goroutine in Lock")
		})
	}
}

// TestWaitersScenario runs the waiters-… scenario small, for both
// implementations, and checks that what it reads from the etcd member is
// there and makes sense (no timing is checked).
func TestWaitersScenario(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	const w, clients = 20, 4
	for _, impl := range Impls {
		t.Run(impl.Name, func(t *testing.T) {
			r, err := waiters("waiters-test", w, clients)(t.Context(), env, impl, 1, nil)
			require.NoError(t, err)
			require.EqualValues(t, w, r.Ops)
			require.NotNil(t, r.Queue)
			require.NotNil(t, r.Server)
			require.EqualValues(t, w, r.Server.Waiters)
			require.True(t, r.Server.GC, "the member collects its garbage when asked (pprof on)")
			require.Positive(t, r.Server.Streams, "the waiters watch")
			if impl.Name == Etcd.Name {
				require.LessOrEqual(t, r.Server.Streams, float64(clients), "etcd's client shares one watch stream")
			}
			for what, x := range map[string]float64{
				"server heap": r.Server.Heap, "server goroutines": r.Server.Goroutines,
				"client heap": r.Queue.ClientHeap, "client stack": r.Queue.Stack, "client goroutines": r.Queue.Goroutines,
			} {
				require.False(t, math.IsNaN(x) || math.IsInf(x, 0), "%s per waiter: %v", what, x)
			}
			t.Logf("server: %d streams, %.0f B and %.2f goroutines per waiter; client: %.0f B heap, %.2f goroutines per waiter",
				int(r.Server.Streams), r.Server.Heap, r.Server.Goroutines, r.Queue.ClientHeap, r.Queue.Goroutines)
			require.GreaterOrEqual(t, r.Queue.Goroutines, 1.0, "a waiter has at least the goroutine in Lock")

			s := Summarize([]Result{r, r})
			require.Equal(t, *r.Server, *s.Server)
			sum := *r.Add(r).Server.add(nil)
			require.EqualValues(t, 2*w, sum.Waiters)
			sum.Waiters = w
			require.Equal(t, *r.Server, sum, "the average of two equal costs")
		})
	}
	for _, name := range []string{"waiters-8-clients-1000", "waiters-own-client-1000", "waiters-8-clients-10000", "waiters-own-client-10000"} {
		_, ok := Lookup(name)
		require.True(t, ok, name)
	}
	// A target on a figure that was not measured is missed, not a panic.
	require.False(t, ServerHeapAtMost(1.2).Met(Summary{}, Summary{}))
	require.False(t, ClientGoroutinesAtMost(1).Met(Summary{}, Summary{}))
}

// TestRWSemScenarios runs the RWMutex and Semaphore scenarios, small, for
// the implementations each runs for.
func TestRWSemScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, name := range []string{"rw-uncontended-read", "rw-uncontended-write", "sem-uncontended"} {
		sc, ok := Lookup(name)
		require.True(t, ok)
		for _, impl := range Impls {
			if !sc.RunsFor(impl.Name) {
				continue
			}
			r, err := sc.Run(t.Context(), env, impl, 3, nil)
			require.NoError(t, err, "%s %s", name, impl.Name)
			require.EqualValues(t, 3, r.Ops)
			if impl.Name == Etcdlock.Name {
				require.Equal(t, 2.0, r.RPCsPerOp(), "%s: one write to lock, one to unlock", name)
			}
		}
	}
	for _, impl := range Impls {
		r, err := rwContend(4, 1)(t.Context(), env, impl, 10, nil)
		require.NoError(t, err, impl.Name)
		require.EqualValues(t, 10, r.Ops)
	}
	for _, impl := range Impls {
		r, err := rwReaders(12)(t.Context(), env, impl, 2, nil)
		require.NoError(t, err, impl.Name)
		require.EqualValues(t, 2, r.Ops, "one operation per queue: all readers admitted")
		// The window opens after the writer's Unlock (its revision counts,
		// its RPC does not) and closes while the last reader holds. The
		// readers' checks may all come before it opens: their RPCs are
		// not asserted.
		require.GreaterOrEqual(t, r.RevsPerOp(), 1.0)
	}
	sc, _ := Lookup("rw-readers-50")
	require.Equal(t, []Ref{{"rw-readers-50", Etcd.Name}, {"fifo-50", Etcdlock.Name}}, sc.Refs())
	sc, _ = Lookup("sem-4x16")
	require.Equal(t, []string{Etcdlock.Name}, sc.Impls)
	r, err := contendWith("sem-test", 6, 3, func(s Session, name string) Mutex {
		return semMutex{s.NewSemaphore(name, 3), 1}
	})(t.Context(), env, Etcdlock, 20, nil)
	require.NoError(t, err)
	require.EqualValues(t, 20, r.Ops)

	r, err = semFIFO(12, 3)(t.Context(), env, Etcdlock, 1, nil)
	require.NoError(t, err)
	require.EqualValues(t, 12, r.Ops)
	// A handoff deletes one key, but the window closes while up to 3
	// waiters hold: up to 2 of them have not deleted theirs yet.
	require.InDelta(t, 1.0, r.RevsPerOp(), 2.0/12)
	// A release is one RPC and wakes at most capacity waiters, one check
	// each; waiters here release in the order they happen to run, so some
	// wakes are spurious (releasing the oldest holder wakes none).
	require.LessOrEqual(t, r.RPCsPerOp(), 1.0+3)
	require.NotNil(t, r.Queue)
}

// TestRWContendDetectsOverlap checks that the RWMutex and Semaphore
// contention scenarios fail a lock that lets in more than they admit.
func TestRWContendDetectsOverlap(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	// Holders stay inside until caught: as all 6 come in, a writer is
	// inside with another.
	env.hold = stayInside
	_, err = rwContend(4, 2)(t.Context(), env, noLock, 400, nil)
	require.ErrorContains(t, err, "a writer is inside with another holder")

	// Two holders stay inside: the third is one too many.
	env.hold = stayInside
	_, err = contendWith("sem-overlap", 6, 2, func(s Session, name string) Mutex {
		return semMutex{s.NewSemaphore(name, 2), 1}
	})(t.Context(), env, noLock, 400, nil)
	require.ErrorContains(t, err, "mutual exclusion violated")
}

// TestContendDetectsOverlap checks that the contention scenario fails a
// lock that lets everyone in.
func TestContendDetectsOverlap(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	env.hold = stayInside
	_, err = contend(4)(t.Context(), env, noLock, 400, nil)
	require.ErrorContains(t, err, "mutual exclusion violated")
}

// stayInside is a hold (see Env.hold) under which holders stay inside the
// critical section until the run fails, which cancels their ctx. A broken
// lock then lets an intruder in while they are inside, every time: not
// only when the scheduler happens to interleave them, and before the
// others can end the window without it (holders that go straight on can
// make all its acquisitions while a writer has yet to run). Against a
// working lock no intruder comes, and the holders give up after a minute
// with an error of their own.
func stayInside(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Minute):
		return errors.New("bench: no intruder came while holders stayed inside")
	}
}

// noLock is a broken implementation whose Lock never waits.
var noLock = Impl{
	Name: "nolock",
	NewSession: func(context.Context, *clientv3.Client) (Session, error) {
		return noLockSession{}, nil
	},
}

type noLockSession struct{}

func (noLockSession) Lease() clientv3.LeaseID   { return 1 }
func (noLockSession) NewMutex(string) Mutex     { return noLockMutex{} }
func (noLockSession) NewRWMutex(string) RWMutex { return noLockMutex{} }
func (noLockSession) NewSemaphore(string, int64) Semaphore {
	return noLockMutex{}
}
func (noLockSession) Close() error { return nil }

type noLockMutex struct{}

func (noLockMutex) Lock(context.Context) error    { return nil }
func (noLockMutex) TryLock(context.Context) error { return nil }
func (noLockMutex) Unlock(context.Context) error  { return nil }
func (noLockMutex) RLock(context.Context) error   { return nil }
func (noLockMutex) RUnlock(context.Context) error { return nil }
func (noLockMutex) Acquire(context.Context, int64) error {
	return nil
}
func (noLockMutex) Release(context.Context) error { return nil }

func TestCheckOrder(t *testing.T) {
	keys := []string{"l/h", "l/a", "l/b", "l/c"}
	require.NoError(t, checkOrder([]string{"l/a", "l/b", "l/c"}, keys))
	require.ErrorContains(t, checkOrder([]string{"l/a", "l/c", "l/b"}, keys), "FIFO order violated")
	require.ErrorContains(t, checkOrder([]string{"l/a", "l/b"}, keys), "2 waiters got the lock, want 3")
	// With several holders at once, the order recorded is not the order
	// of admission: only that each waiter got it once is checked.
	require.NoError(t, checkOrderWithin([]string{"l/c", "l/a", "l/b"}, keys, 2))
	require.ErrorContains(t, checkOrderWithin([]string{"l/a", "l/a", "l/c"}, keys, 2), "not the queue's")
	require.ErrorContains(t, checkOrderWithin([]string{"l/a", "l/c"}, keys, 2), "2 waiters got the lock, want 3")
}

// TestCompatScenarios: the concurrency package runs in the scenarios of a
// Mutex and of an Election, beside etcdlock's own API, and in none that
// needs what etcd's API lacks (its sessions have no RWMutex or Semaphore).
func TestCompatScenarios(t *testing.T) {
	var ran []string
	for _, sc := range append(slices.Clone(Scenarios), ScaleScenarios...) {
		if sc.RunsFor(Compat.Name) {
			require.True(t, sc.RunsFor(Etcdlock.Name), sc.Name)
			ran = append(ran, sc.Name)
		}
	}
	require.Equal(t, []string{"uncontended", "trylock-held", "contend-4", "contend-16", "fifo-50", "fifo-300", "fifo-1000",
		"elect-uncontended", "elect-handoff-4", "elect-observe-10-p50", "elect-observe-10-p99",
		"many-names-4", "many-names-16", "many-names-64", "many-names-256",
		"many-names-16-sessions", "many-names-64-sessions", "many-names-256-sessions"}, ran)
}

// TestFloorReferences runs the references a FIFO handoff is compared with
// (a bare write, a bare chain of handoffs with and without the waiter's
// read) small, and checks each makes exactly the requests it stands for.
func TestFloorReferences(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	r, err := writeScenario.Run(t.Context(), env, Floor, 3, nil)
	require.NoError(t, err)
	require.EqualValues(t, 3, r.Ops)
	require.Equal(t, 1.0, r.RPCsPerOp(), "a Put each")
	require.Equal(t, 1.0, r.RevsPerOp())

	const w = 6
	for _, read := range []bool{true, false} {
		r, err := handoffFloor(w, read)(t.Context(), env, Floor, 1, nil)
		require.NoError(t, err)
		require.EqualValues(t, w, r.Ops)
		// The first key's delete opens the chain; each link then deletes
		// its key, after reading it when read is set (one member: the
		// serializable read is never made again).
		require.EqualValues(t, w+1, r.Revs)
		rpcs := int64(w + 1)
		if read {
			rpcs += w
		}
		require.Equal(t, rpcs, r.RPCs-r.KeepAlives)
	}
}
