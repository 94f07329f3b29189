package etcdlock_test

import (
	"time"

	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leftover puts the key of s's locks on name with value v, bound to s's
// lease, as a cleanup that could not reach etcd leaves it, and returns its
// create revision.
func leftover(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, key, v string) int64 {
	t.Helper()
	resp, err := cli.Put(t.Context(), key, v, clientv3.WithLease(s.Lease()))
	require.NoError(t, err)
	return resp.Header.Revision
}

// TestLeftoverSameModeKeepsPlace: this session's own key, left in the
// Mutex's mode, is reused at its place in one RPC, by Lock and TryLock.
func TestLeftoverSameModeKeepsPlace(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)

	rev := leftover(t, cli, s, m.Key(), "")
	before := rpcs.Total()
	require.NoError(t, m.Lock(t.Context()))
	// The Txn that finds our key, and the one that keeps it (place: the
	// second is asked only in this rare case, so that every other Lock's
	// request stays half the size).
	require.EqualValues(t, 2, rpcs.Total()-before, "Lock on our own leftover: two RPCs")
	require.Equal(t, rev, m.Token(), "the leftover keeps its place")
	require.NoError(t, m.Unlock(t.Context()))

	// TryLock takes our leftover at its place even with a waiter behind
	// it: the waiter waits for that key anyway.
	rev = leftover(t, cli, s, m.Key(), "")
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	require.Equal(t, m.Key(), w.waitIdle(t))
	require.NoError(t, m.TryLock(t.Context()))
	require.Equal(t, rev, m.Token())
	w.assertWaiting(t)
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.NoError(t, w.m.Unlock(t.Context()))
}

// TestLeftoverOfOtherModeIsReplaced: a key of this session left in another
// mode is never Put in the Mutex's mode at its place (Invariant K: readers
// behind a read key may hold, and a writer must not appear among them); it
// is removed and a new key placed.
func TestLeftoverOfOtherModeIsReplaced(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)

	rev := leftover(t, cli, s, m.Key(), "etcdlock/1 shared")
	require.NoError(t, m.Lock(t.Context()))
	require.Greater(t, m.Token(), rev, "a new key, not the leftover")
	resp, err := cli.Get(t.Context(), m.Key())
	require.NoError(t, err)
	require.Empty(t, string(resp.Kvs[0].Value))
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name))

	rev = leftover(t, cli, s, m.Key(), "etcdlock/1 permits 1 of 2")
	require.NoError(t, m.TryLock(t.Context()))
	require.Greater(t, m.Token(), rev, "a new key, not the leftover")
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name))
}
