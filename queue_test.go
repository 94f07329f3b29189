package etcdlock_test

import (
	"time"

	"testing"

	"github.com/etcdlock/etcdlock"
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

// TestLeftoverSameModeIsReplaced: a key of this session's found under its
// lease in the Mutex's mode (a cleanup that could not reach etcd left it,
// or a process that used the lease before) is not taken over at its
// place with its token: Lock and TryLock remove it and take a new key
// (issue 38). A waiter behind it is admitted first.
func TestLeftoverSameModeIsReplaced(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)

	rev := leftover(t, cli, s, m.Key(), "")
	require.NoError(t, m.Lock(t.Context()))
	require.Greater(t, m.Token(), rev, "a new key, not the leftover")
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name))

	// A waiter behind the leftover is next once it goes: TryLock finds
	// the lock held.
	rev = leftover(t, cli, s, m.Key(), "")
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	require.Equal(t, m.Key(), w.waitIdle(t))
	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, w.result(t, 10*time.Second))
	require.Greater(t, w.m.Token(), rev)
	require.NoError(t, w.m.Unlock(t.Context()))
	require.NoError(t, m.TryLock(t.Context()))
	require.Greater(t, m.Token(), w.m.Token())
	require.NoError(t, m.Unlock(t.Context()))
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
