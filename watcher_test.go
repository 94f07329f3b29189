package etcdlock_test

import (
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWaitWithoutConnection: on a client with no gRPC connection of its
// own there is no session stream: a waiter watches its blockers through
// the client's Watcher. A reader is admitted by its writer's Downgrade (a
// Put on the key it watches), a writer by the deletion of each key ahead
// in turn, and neither before.
func TestWaitWithoutConnection(t *testing.T) {
	real := newClient(t)
	cli := clientv3.NewCtxClient(t.Context())
	t.Cleanup(func() { cli.Close() })
	cli.KV, cli.Lease, cli.Watcher = real.KV, real.Lease, real.Watcher
	name := lockName(t)

	holder := etcdlock.NewRWMutex(newSession(t, real), name)
	require.NoError(t, holder.Lock(t.Context()))
	r := etcdlock.NewRWMutex(newSession(t, cli), name)
	rw := startQ(t.Context(), r, r.RLock)
	require.Equal(t, []string{holder.Key()}, rw.waitIdle(t))
	m := etcdlock.NewMutex(newSession(t, cli), name)
	mw := startWaiter(t.Context(), m)
	require.Equal(t, r.Key(), mw.waitIdle(t))

	require.NoError(t, holder.Downgrade(t.Context()))
	require.NoError(t, rw.result(t, 5*time.Second), "reader not admitted by the Downgrade")
	mw.assertWaiting(t)

	require.NoError(t, r.RUnlock(t.Context()))
	require.Equal(t, holder.Key(), mw.waitIdle(t), "the writer watches the read lock left ahead")
	mw.assertWaiting(t)
	require.NoError(t, holder.RUnlock(t.Context()))
	require.NoError(t, mw.result(t, 5*time.Second))
	require.NoError(t, m.Unlock(t.Context()))
}
