package etcdlock_test

import (
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
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

// refuseWatch arms in to have etcd refuse the next create request of a
// watch on key: its range is made empty on the way, and etcd answers
// "created, cancelled", as it does for a permission denied. The channel is
// closed once the request went.
func refuseWatch(in *etcdtest.Injector, key string) <-chan struct{} {
	return in.At(func(r etcdtest.RPC) bool {
		req, ok := r.Req.(*pb.WatchRequest)
		return ok && req.GetCreateRequest() != nil && string(req.GetCreateRequest().Key) == key
	}, etcdtest.Action{Before: func(r etcdtest.RPC) {
		cr := r.Req.(*pb.WatchRequest).GetCreateRequest()
		cr.RangeEnd = append([]byte(nil), cr.Key...)
	}})
}

// TestRefusedWatch (issue 17, item 9): etcd refuses to make a watch. One
// rule for every watch of the session's stream: the stream stays, and so
// do the other watches on it, and the refused watch is made again after a
// pause (a blocker's by its waiter, which reads the queue first). Before,
// a refused blocker watch kept the stream but a refused hold or own-key
// watch made the session give its stream up, breaking every other watch
// on it. In each case a waiter of the same session on another lock has
// its blocker watched on the stream throughout, and must not be woken.
func TestRefusedWatch(t *testing.T) {
	t.Parallel()
	for _, which := range []string{"Hold", "Own", "Blocker"} {
		t.Run(which, func(t *testing.T) {
			t.Parallel()
			name := lockName(t)
			other := newClient(t)
			var in etcdtest.Injector
			s := newSession(t, cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()}))

			// The bystander: a waiter of the session on another lock.
			byHolder := etcdlock.NewMutex(newSession(t, other), name+"-by")
			require.NoError(t, byHolder.Lock(t.Context()))
			by := startWaiter(t.Context(), etcdlock.NewMutex(s, name+"-by"))
			by.waitIdle(t)

			holder := etcdlock.NewMutex(newSession(t, other), name)
			m := etcdlock.NewMutex(s, name)
			switch which {
			case "Hold":
				require.NoError(t, holder.Lock(t.Context()))
				require.NoError(t, holder.Unlock(t.Context()))
				require.NoError(t, m.Lock(t.Context()))
				refused := refuseWatch(&in, m.Key())
				done := m.Done()
				<-refused
				// The watch is made again: the loss is seen.
				_, err := other.Delete(t.Context(), m.Key())
				require.NoError(t, err)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("Done still open 10s after the key was deleted: the refused watch was not made again")
				}
				require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
			case "Own":
				require.NoError(t, holder.Lock(t.Context()))
				refused := refuseWatch(&in, m.Key())
				w := startWaiter(t.Context(), m)
				w.waitIdle(t)
				<-refused
				// The waiter's own key is watched again: its deletion
				// ends the wait.
				_, err := other.Delete(t.Context(), m.Key())
				require.NoError(t, err)
				require.ErrorIs(t, w.result(t, 10*time.Second), etcdlock.ErrLockLost)
			case "Blocker":
				require.NoError(t, holder.Lock(t.Context()))
				refused := refuseWatch(&in, holder.Key())
				w := startWaiter(t.Context(), m)
				<-refused
				require.Equal(t, holder.Key(), w.waitIdle(t))
				require.NoError(t, holder.Unlock(t.Context()))
				require.NoError(t, w.result(t, 10*time.Second))
				require.NoError(t, m.Unlock(t.Context()))
			}
			require.Equal(t, 1, in.Streams(etcdtest.MethodWatch), "the session gave its watch stream up")
			select {
			case k := <-by.idle:
				t.Fatalf("the bystander waiter watched %s again: its watch broke", k)
			default:
			}
			by.assertWaiting(t)
			require.NoError(t, byHolder.Unlock(t.Context()))
			require.NoError(t, by.result(t, 10*time.Second))
			require.NoError(t, by.m.Unlock(t.Context()))
		})
	}
}

// TestSessionsShareWatchStream: the watches of every session of a client,
// waiters' and holds', go on one Watch stream, and another client's on
// one of its own. Before, each session opened a stream of its own, and
// etcd paid for each (1000 waiting sessions on 8 clients kept 1000
// streams, and 3000 goroutines, on the server). A session that ends
// leaves the others' watches working; the stream's goroutines end with
// the last session of its client.
func TestSessionsShareWatchStream(t *testing.T) {
	const n = 5
	var in1, in2 etcdtest.Injector
	cli1 := cluster.Client(t, clientv3.Config{DialOptions: in1.DialOptions()})
	cli2 := cluster.Client(t, clientv3.Config{DialOptions: in2.DialOptions()})
	name := lockName(t)
	for _, cli := range []*clientv3.Client{cli1, cli2} {
		_, err := cli.Get(t.Context(), name) // the connections' goroutines run from here on
		require.NoError(t, err)
	}
	running := goleak.IgnoreCurrent()

	hs, err := etcdlock.NewSession(t.Context(), cli2)
	require.NoError(t, err)
	holder := etcdlock.NewMutex(hs, name)
	require.NoError(t, holder.Lock(t.Context()))
	held := holder.Done()
	var ss []*etcdlock.Session
	var ws []*waiter
	for i := range n {
		s, err := etcdlock.NewSession(t.Context(), []*clientv3.Client{cli1, cli2}[i%2])
		require.NoError(t, err)
		ss = append(ss, s)
		w := startWaiter(t.Context(), etcdlock.NewMutex(s, name))
		w.waitIdle(t)
		ws = append(ws, w)
	}
	require.Equal(t, 1, in1.Streams(etcdtest.MethodWatch), "watch streams of the first client's sessions")
	require.Equal(t, 1, in2.Streams(etcdtest.MethodWatch), "watch streams of the second client's sessions")

	// The first waiter's session ends: its place goes, and the waiter
	// behind it, on the same stream, now waits for the holder.
	require.NoError(t, ss[0].Close())
	require.ErrorIs(t, ws[0].result(t, 10*time.Second), etcdlock.ErrSessionClosed)
	require.Equal(t, holder.Key(), ws[1].waitIdle(t))
	require.NoError(t, holder.Unlock(t.Context()))
	require.True(t, closed(held))
	for i, w := range ws[1:] {
		require.NoError(t, w.result(t, 10*time.Second), "waiter %d", i+1)
		require.NoError(t, w.m.Unlock(t.Context()))
	}
	require.Equal(t, 1, in1.Streams(etcdtest.MethodWatch))
	require.Equal(t, 1, in2.Streams(etcdtest.MethodWatch))

	for _, s := range ss[1:] {
		require.NoError(t, s.Close())
	}
	require.NoError(t, hs.Close())
	require.NoError(t, leakcheck.Find(running), "the streams' goroutines outlived the clients' last sessions")
}
