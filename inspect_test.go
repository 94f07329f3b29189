package etcdlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
)

// queueKeys returns the keys of q, in its order.
func queueKeys(q *etcdlock.LockQueue) []string {
	var ks []string
	for _, k := range q.Keys {
		ks = append(ks, k.Key)
	}
	return ks
}

// TestInspectMutexQueue: a Mutex holder, an etcd concurrency.Mutex waiter
// and a Mutex waiter, each shown in line order with its token, lease TTL
// and identity; a nested lock's key is not part of the queue.
func TestInspectMutexQueue(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	holder := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithIdentity("host-a pid 1"))
	require.NoError(t, holder.Lock(ctx))

	es, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
	require.NoError(t, err)
	t.Cleanup(func() { es.Close() })
	theirs := concurrency.NewMutex(es, name)
	theirsDone := make(chan error, 1)
	go func() { theirsDone <- theirs.Lock(ctx) }()
	// A nested lock's key, between the waiters: after theirs, which,
	// as etcd's Mutex, would otherwise wait for it to go too.
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	nested := etcdlock.NewMutex(newSession(t, cli), name+"/sub")
	require.NoError(t, nested.Lock(ctx))
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 3 }, 10*time.Second, 5*time.Millisecond)
	w := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithIdentity("worker 2")))
	w.waitIdle(t)

	q, err := etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Equal(t, name, q.Name)
	require.Equal(t, []string{holder.Key(), theirs.Key(), w.m.Key()}, queueKeys(q))
	require.Len(t, q.Holders(), 1)
	require.Len(t, q.Waiters(), 2)
	h := q.Holders()[0]
	require.True(t, h.Holds)
	require.Equal(t, holder.Token(), h.Token)
	require.Equal(t, "host-a pid 1", h.Identity)
	require.Equal(t, "\nhost-a pid 1", string(h.Value))
	require.True(t, h.Mode.Exclusive())
	require.NoError(t, h.LeaseErr)
	require.EqualValues(t, 15, h.GrantedTTL)
	require.LessOrEqual(t, h.TTL, int64(15))

	e := q.Waiters()[0]
	require.False(t, e.Holds)
	require.Equal(t, es.Lease(), e.Lease)
	require.Equal(t, "", e.Identity, "etcd's Mutex records none")
	require.Empty(t, e.Value)
	require.EqualValues(t, 30, e.GrantedTTL)
	require.Equal(t, "worker 2", q.Waiters()[1].Identity)

	// The revision is the one every key was read at.
	resp, err := cli.Get(ctx, theirs.Key())
	require.NoError(t, err)
	require.Equal(t, resp.Kvs[0].CreateRevision, e.Token)
	require.GreaterOrEqual(t, resp.Header.Revision, q.Revision)
	require.Greater(t, q.Revision, q.Waiters()[1].Token-1)

	// Only the holder's lease, from the member's own copy.
	q2, err := etcdlock.InspectLock(ctx, cli, name, etcdlock.HolderLeasesOnly(), etcdlock.Serializable())
	require.NoError(t, err)
	require.Equal(t, queueKeys(q), queueKeys(q2))
	require.NoError(t, q2.Holders()[0].LeaseErr)
	require.EqualValues(t, 15, q2.Holders()[0].GrantedTTL)
	for _, k := range q2.Waiters() {
		require.Error(t, k.LeaseErr)
		require.Zero(t, k.GrantedTTL)
	}

	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, <-theirsDone)
	require.NoError(t, theirs.Unlock(ctx))
	require.NoError(t, w.result(t, 10*time.Second))
	require.NoError(t, w.m.Unlock(ctx))
	require.NoError(t, nested.Unlock(ctx))
	q, err = etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Empty(t, q.Keys)
	require.Empty(t, q.Holders())
	require.Empty(t, q.Waiters())
}

// TestInspectModes: readers that hold together, a writer and a reader
// behind it that wait; a Semaphore's permits that fit and one that waits.
// Holds follows each primitive's grant rule.
func TestInspectModes(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t) + "/rw"
	r1 := etcdlock.NewRWMutex(newSession(t, cli), name, etcdlock.WithIdentity("reader 1"))
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, r1.RLock(ctx))
	require.NoError(t, r2.RLock(ctx))
	wm := etcdlock.NewRWMutex(newSession(t, cli), name, etcdlock.WithIdentity("writer"))
	ww := wlocker(ctx, wm)
	ww.waitIdle(t)
	r3 := etcdlock.NewRWMutex(newSession(t, cli), name)
	wr3 := rlocker(ctx, r3)
	wr3.waitIdle(t)

	q, err := etcdlock.InspectLock(ctx, cli, name, etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.Equal(t, []string{r1.Key(), r2.Key(), wm.Key(), r3.Key()}, queueKeys(q))
	require.Len(t, q.Holders(), 2)
	for i, want := range []struct {
		holds    bool
		mode     string
		identity string
	}{{true, "shared", "reader 1"}, {true, "shared", ""}, {false, "exclusive", "writer"}, {false, "shared", ""}} {
		k := q.Keys[i]
		require.Equal(t, want.holds, k.Holds, k.Key)
		require.Equal(t, want.mode, k.Mode.String(), k.Key)
		require.Equal(t, want.identity, k.Identity, k.Key)
		require.Error(t, k.LeaseErr, "WithoutLeases reads no lease")
	}
	require.Equal(t, "etcdlock/1 shared\nreader 1", string(q.Keys[0].Value))

	sname := lockName(t) + "/sem"
	s1 := etcdlock.NewSemaphore(newSession(t, cli), sname, 3, etcdlock.WithIdentity("sem 1"))
	s2 := etcdlock.NewSemaphore(newSession(t, cli), sname, 3)
	s3 := etcdlock.NewSemaphore(newSession(t, cli), sname, 3, etcdlock.WithIdentity("sem 3"))
	require.NoError(t, s1.Acquire(ctx, 2))
	require.NoError(t, s2.Acquire(ctx, 1))
	ws3 := startQ(ctx, s3, func(ctx context.Context) error { return s3.Acquire(ctx, 2) })
	ws3.waitIdle(t)
	q, err = etcdlock.InspectLock(ctx, cli, sname)
	require.NoError(t, err)
	require.Equal(t, []string{s1.Key(), s2.Key(), s3.Key()}, queueKeys(q))
	require.Len(t, q.Holders(), 2)
	require.Equal(t, etcdlock.KeyMode{Weight: 2, Capacity: 3}, q.Keys[0].Mode)
	require.Equal(t, "sem 1", q.Keys[0].Identity)
	require.Equal(t, "", q.Keys[1].Identity)
	require.Equal(t, "sem 3", q.Keys[2].Identity)
	require.False(t, q.Keys[2].Holds)
	for _, k := range q.Keys {
		require.NoError(t, k.LeaseErr)
		require.EqualValues(t, 15, k.GrantedTTL)
	}

	require.NoError(t, s1.Release(ctx))
	require.NoError(t, ws3.result(t, 10*time.Second))
	require.NoError(t, s2.Release(ctx))
	require.NoError(t, s3.Release(ctx))
	require.NoError(t, r1.RUnlock(ctx))
	require.NoError(t, r2.RUnlock(ctx))
	require.NoError(t, ww.result(t, 10*time.Second))
	require.NoError(t, wm.Unlock(ctx))
	require.NoError(t, wr3.result(t, 10*time.Second))
	require.NoError(t, r3.RUnlock(ctx))
}

// TestInspectElection: the leader is the holder, and its Value is its
// proposal, not an identity; a candidate with a proposal of several lines
// has none either.
func TestInspectElection(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t)
	leader := etcdlock.NewElection(newSession(t, cli), name)
	require.NoError(t, leader.Campaign(ctx, "10.0.0.1:8080"))
	cand := etcdlock.NewElection(newSession(t, cli), name)
	w := campaign(ctx, cand, "line 1\nline 2")
	w.waitIdle(t)

	q, err := etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Equal(t, []string{leader.Key(), cand.Key()}, queueKeys(q))
	require.Len(t, q.Holders(), 1)
	require.Equal(t, "10.0.0.1:8080", string(q.Holders()[0].Value))
	require.Equal(t, leader.Token(), q.Holders()[0].Token)
	require.Equal(t, "line 1\nline 2", string(q.Waiters()[0].Value))
	for _, k := range q.Keys {
		require.Equal(t, "", k.Identity, k.Key)
		require.True(t, k.Mode.Exclusive())
	}
	require.NoError(t, leader.Resign(ctx))
	require.NoError(t, w.result(t, 10*time.Second))
	require.NoError(t, cand.Resign(ctx))
}

// rangeHook runs f after the first Range RPC that answers with More set.
type rangeHook struct {
	f     func()
	fired atomic.Bool
}

func (h *rangeHook) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if r, ok := reply.(*pb.RangeResponse); ok && err == nil && r.More && h.fired.CompareAndSwap(false, true) {
			h.f()
		}
		return err
	})}
}

// TestInspectPagesAtOneRevision: a queue longer than a page, with nested
// locks' keys among its keys, is read page by page at one revision: keys
// deleted and added after the first page do not show.
func TestInspectPagesAtOneRevision(t *testing.T) {
	defer etcdlock.SetInspectPage(3)()
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t)
	// The keys have no lease: remove them, or a rerun (-count) finds them.
	t.Cleanup(func() { _, _ = cli.Delete(context.Background(), name+"/", clientv3.WithPrefix()) })
	var want []string
	for i := range 7 {
		k := fmt.Sprintf("%s/%x", name, 0x100+i)
		_, err := cli.Put(ctx, k, "")
		require.NoError(t, err)
		want = append(want, k)
		_, err = cli.Put(ctx, fmt.Sprintf("%s/sub%d/%x", name, i, 0x200+i), "")
		require.NoError(t, err)
	}
	hook := &rangeHook{f: func() {
		_, err := cli.Delete(ctx, want[6])
		require.NoError(t, err)
		_, err = cli.Put(ctx, name+"/999", "")
		require.NoError(t, err)
	}}
	icli := cluster.Client(t, clientv3.Config{DialOptions: hook.DialOptions()})
	q, err := etcdlock.InspectLock(ctx, icli, name)
	require.NoError(t, err)
	require.True(t, hook.fired.Load(), "the queue spans pages")
	require.Equal(t, want, queueKeys(q), "the queue at the first page's revision")
	require.Len(t, q.Holders(), 1)
	for _, k := range q.Keys {
		require.Zero(t, k.Lease)
		require.Error(t, k.LeaseErr, "no lease")
	}

	// That revision can be read again; the current one has moved on.
	old := q.Revision
	q, err = etcdlock.InspectLock(ctx, cli, name, etcdlock.AtRevision(old))
	require.NoError(t, err)
	require.Equal(t, old, q.Revision)
	require.Equal(t, want, queueKeys(q))
	q, err = etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Equal(t, append(want[:6:6], name+"/999"), queueKeys(q))

	_, err = cli.Compact(ctx, q.Revision)
	require.NoError(t, err)
	_, err = etcdlock.InspectLock(ctx, cli, name, etcdlock.AtRevision(old))
	require.ErrorIs(t, err, rpctypes.ErrCompacted)

	_, err = etcdlock.InspectLock(ctx, cli, "")
	require.ErrorIs(t, err, etcdlock.ErrInvalidName)
}

// TestListLocks: every lock under a prefix, nested ones apart, with its
// holders and waiters, across pages; keys that are no lock's are skipped.
func TestListLocks(t *testing.T) {
	defer etcdlock.SetInspectPage(2)()
	cli := newClient(t)
	ctx := t.Context()
	pfx := lockName(t) + "/"
	a := etcdlock.NewMutex(newSession(t, cli), pfx+"a", etcdlock.WithIdentity("a's holder"))
	require.NoError(t, a.Lock(ctx))
	wa := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), pfx+"a"))
	wa.waitIdle(t)
	ab := etcdlock.NewMutex(newSession(t, cli), pfx+"a/b")
	require.NoError(t, ab.Lock(ctx))
	r1 := etcdlock.NewRWMutex(newSession(t, cli), pfx+"rw")
	r2 := etcdlock.NewRWMutex(newSession(t, cli), pfx+"rw", etcdlock.WithIdentity("r2"))
	require.NoError(t, r1.RLock(ctx))
	require.NoError(t, r2.RLock(ctx))
	// No lock's keys: the prefix's own child without a name, a trailing "/".
	_, err := cli.Put(ctx, pfx+"c/", "")
	require.NoError(t, err)
	_, err = cli.Put(ctx, lockName(t)+"x/1", "") // a name outside the prefix
	require.NoError(t, err)

	l, err := etcdlock.ListLocks(ctx, cli, pfx)
	require.NoError(t, err)
	require.NotZero(t, l.Revision)
	var names []string
	for _, s := range l.Locks {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{pfx + "a", pfx + "a/b", pfx + "rw"}, names)
	require.Len(t, l.Locks[0].Holders, 1)
	require.Equal(t, a.Key(), l.Locks[0].Holders[0].Key)
	require.Equal(t, a.Token(), l.Locks[0].Holders[0].Token)
	require.Equal(t, "a's holder", l.Locks[0].Holders[0].Identity)
	require.Equal(t, 1, l.Locks[0].Waiters)
	require.Equal(t, ab.Key(), l.Locks[1].Holders[0].Key)
	require.Zero(t, l.Locks[1].Waiters)
	require.Len(t, l.Locks[2].Holders, 2)
	require.Equal(t, []string{r1.Key(), r2.Key()}, []string{l.Locks[2].Holders[0].Key, l.Locks[2].Holders[1].Key})
	require.Equal(t, "r2", l.Locks[2].Holders[1].Identity)

	// Without the trailing "/", the prefix also finds the name outside it.
	l, err = etcdlock.ListLocks(ctx, cli, lockName(t))
	require.NoError(t, err)
	require.Len(t, l.Locks, 4)
	require.Equal(t, lockName(t)+"x", l.Locks[3].Name)

	require.NoError(t, a.Unlock(ctx))
	require.NoError(t, wa.result(t, 10*time.Second))
	require.NoError(t, wa.m.Unlock(ctx))
	require.NoError(t, ab.Unlock(ctx))
	require.NoError(t, r1.RUnlock(ctx))
	require.NoError(t, r2.RUnlock(ctx))
}

// TestLockOfKey: the lock a key is of, by the rule InspectLock and
// ListLocks count keys with.
func TestLockOfKey(t *testing.T) {
	for key, want := range map[string]string{
		"jobs/backup/694d": "jobs/backup",
		"a/b":              "a",
		"a/b/c":            "a/b", // a key of the nested lock a/b
		"a":                "",    // no "/"
		"a/":               "",    // ends in "/"
		"/a":               "",    // no name before its only "/"
		"a//b":             "a/",
		"/my-lock//694d":   "/my-lock/",
		// The library's own keys are no lock's (issue 30: ls --watch
		// listed them).
		"__etcdlock/release/a/694d": "",
		"__etcdlock/delay/a/694d":   "",
		"__etcdlock/694d":           "",
		"__etcdlockx/694d":          "__etcdlockx",
	} {
		name, ok := etcdlock.LockOfKey(key)
		require.Equal(t, want != "", ok, key)
		require.Equal(t, want, name, key)
	}
}
