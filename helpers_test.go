package etcdlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// newClient returns a client of the shared etcd (or of c when given),
// closed at the end of the test.
func newClient(t *testing.T, c ...*etcdtest.Cluster) *clientv3.Client {
	t.Helper()
	cl := cluster
	if len(c) > 0 {
		cl = c[0]
	}
	return cl.Client(t)
}

// newSession returns a session on cli, closed at the end of the test.
func newSession(t *testing.T, cli *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// cutSession returns a session on cli, a client the test cuts off from
// etcd, orphaned at the end of the test: cut off, it cannot revoke its
// lease, and Close would try for as long as its TTL.
func cutSession(t *testing.T, cli *clientv3.Client, opts ...etcdlock.SessionOption) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli, opts...)
	require.NoError(t, err)
	t.Cleanup(s.Orphan)
	return s
}

// lockName returns a lock name no other test uses.
func lockName(t *testing.T) string { return "test/" + t.Name() }

// waiter is a Mutex whose Lock runs in a goroutine: a qwaiter
// (queue_helpers_test.go) that keeps its Mutex, whose result and
// assertWaiting it has.
type waiter struct {
	*qwaiter
	m *etcdlock.Mutex
}

// startWaiter starts m.Lock(ctx) in a goroutine.
func startWaiter(ctx context.Context, m *etcdlock.Mutex) *waiter {
	return &waiter{qwaiter: startQ(ctx, m, m.Lock), m: m}
}

// waitIdle waits until w has set up its watches and blocks, and returns the
// key it watches: a Mutex's waiter watches the key just ahead of it. It
// fails if Lock returned first.
func (w *waiter) waitIdle(t *testing.T) string {
	t.Helper()
	return w.qwaiter.waitIdle(t)[0]
}

// keys returns the keys under name + "/" in etcd, oldest first.
func keys(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	resp, err := cli.Get(t.Context(), name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	require.NoError(t, err)
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// A meeting makes n goroutines be inside a lock at one moment, for
// tests that must see holders overlap without leaving it to scheduling:
// each of the n arrives inside and waits until all have; others may wait
// for the meeting before they start.
type meeting struct {
	n       int64
	arrived atomic.Int64
	all     chan struct{} // closed when the n-th arrives
}

func newMeeting(n int) *meeting { return &meeting{n: int64(n), all: make(chan struct{})} }

// arrive counts the caller in and waits until all n are in, or ctx ends.
func (m *meeting) arrive(ctx context.Context) error {
	if m.arrived.Add(1) == m.n {
		close(m.all)
	}
	return m.await(ctx)
}

// await waits until all n are in, or ctx ends.
func (m *meeting) await(ctx context.Context) error {
	select {
	case <-m.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d met: %w", m.arrived.Load(), m.n, ctx.Err())
	}
}

// watchDeletion watches key, as it is now, for its deletion. The returned
// wait blocks until etcd deletes it and returns when it saw that; it fails
// the test if etcd has not within d. Tests of what follows a holder's
// death bound the library's part from that moment: when etcd deletes an
// expired lease's keys is etcd's affair (its lessor looks for expired
// leases twice a second, then revokes them through raft).
func watchDeletion(t *testing.T, cli *clientv3.Client, key string) (wait func(d time.Duration) time.Time) {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "%s is not in etcd", key)
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	deletions := cli.Watch(ctx, key, clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterPut())
	return func(d time.Duration) time.Time {
		t.Helper()
		defer cancel()
		select {
		case wr, ok := <-deletions:
			require.True(t, ok, "the watch of %s ended", key)
			require.NoError(t, wr.Err())
			require.NotEmpty(t, wr.Events)
			return time.Now()
		case <-time.After(d):
			t.Fatalf("etcd did not delete %s within %v", key, d)
			return time.Time{}
		}
	}
}

// startCompactor compacts etcd at its current revision every few
// milliseconds until the returned stop is called; stop returns how many
// compactions succeeded.
func startCompactor(t *testing.T, cli *clientv3.Client) (stop func() int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	var compactions atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			resp, err := cli.Get(ctx, "compact-probe")
			if err == nil {
				if _, err := cli.Compact(ctx, resp.Header.Revision); err == nil {
					compactions.Add(1)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(3 * time.Millisecond):
			}
		}
	}()
	return func() int64 {
		cancel()
		wg.Wait()
		return compactions.Load()
	}
}

// authCluster starts a one-member etcd with authentication on: user
// "alice" (password "alice-pw") has role "locker", which may read and
// write the keys of the lock name; "bob" ("bob-pw") has no role; "root"
// ("root-pw") may do anything.
func authCluster(t *testing.T, name string) *etcdtest.Cluster {
	t.Helper()
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	ctx := t.Context()
	_, err := root.RoleAdd(ctx, "locker")
	require.NoError(t, err)
	_, err = root.RoleGrantPermission(ctx, "locker", name+"/", clientv3.GetPrefixRangeEnd(name+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
	require.NoError(t, err)
	for _, u := range []string{"alice", "bob"} {
		_, err = root.UserAdd(ctx, u, u+"-pw")
		require.NoError(t, err)
	}
	_, err = root.UserGrantRole(ctx, "alice", "locker")
	require.NoError(t, err)
	require.NoError(t, etcdtest.EnableAuth(ctx, root, "root-pw"))
	return c
}
