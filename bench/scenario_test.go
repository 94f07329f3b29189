package bench

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestScenarios runs every kind of scenario, small, for both
// implementations, so that the benchmarks' harness is checked (with -race
// in CI) without running the benchmarks.
func TestScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, impl := range Impls {
		t.Run(impl.Name, func(t *testing.T) {
			r, err := uncontended(t.Context(), env, impl, 3, nil)
			require.NoError(t, err)
			require.EqualValues(t, 3, r.Ops)
			require.Positive(t, r.Elapsed)
			// Both Mutexes take one write to lock and one to unlock.
			require.Equal(t, 2.0, r.RPCsPerOp())
			require.Equal(t, 2.0, r.RevsPerOp())

			r, err = tryLockHeld(t.Context(), env, impl, 3, nil)
			require.NoError(t, err)
			require.EqualValues(t, 3, r.Ops)

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

// TestContendDetectsOverlap checks that the contention scenario fails a
// lock that lets everyone in.
func TestContendDetectsOverlap(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	_, err = contend(4)(t.Context(), env, noLock, 400, nil)
	require.ErrorContains(t, err, "mutual exclusion violated")
}

// noLock is a broken implementation whose Lock never waits.
var noLock = Impl{
	Name: "nolock",
	NewSession: func(context.Context, *clientv3.Client) (Session, error) {
		return noLockSession{}, nil
	},
}

type noLockSession struct{}

func (noLockSession) Lease() clientv3.LeaseID { return 1 }
func (noLockSession) NewMutex(string) Mutex   { return noLockMutex{} }
func (noLockSession) Close() error            { return nil }

type noLockMutex struct{}

func (noLockMutex) Lock(context.Context) error    { return nil }
func (noLockMutex) TryLock(context.Context) error { return nil }
func (noLockMutex) Unlock(context.Context) error  { return nil }

func TestCheckOrder(t *testing.T) {
	keys := []string{"l/h", "l/a", "l/b", "l/c"}
	require.NoError(t, checkOrder([]string{"l/a", "l/b", "l/c"}, keys))
	require.ErrorContains(t, checkOrder([]string{"l/a", "l/c", "l/b"}, keys), "FIFO order violated")
	require.ErrorContains(t, checkOrder([]string{"l/a", "l/b"}, keys), "2 waiters got the lock, want 3")
}
