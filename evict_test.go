package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEvictHandsOverAndFences (issue 40): an operator's Evict of the
// holder admits the next in line; the evicted holder learns its hold is
// lost; and once the next holder has written through a fence, the
// evicted one's fenced write is refused, while its process, which nobody
// stopped, still believes in nothing but its token.
func TestEvictHandsOverAndFences(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name, fence := lockName(t), lockName(t)+"-fence"
	ctx := t.Context()
	old := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, old.Lock(ctx))
	next := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), name))
	next.waitIdle(t)

	q, err := etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	holder := q.Holders()[0]
	require.Equal(t, old.Key(), holder.Key)
	require.Equal(t, old.Token(), holder.Token)
	require.NoError(t, etcdlock.Evict(ctx, cli, name, holder.Key, holder.Token))

	require.NoError(t, next.result(t, 30*time.Second), "the next in line is admitted")
	require.Greater(t, next.m.Token(), holder.Token)
	select {
	case <-old.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the evicted holder was not told")
	}
	require.ErrorIs(t, old.Err(), etcdlock.ErrLockLost)

	_, err = etcdlock.FencedWrite(ctx, cli, fence, next.m.Token(), clientv3.OpPut(fence+"/data", "next"))
	require.NoError(t, err)
	_, err = etcdlock.FencedWrite(ctx, cli, fence, holder.Token, clientv3.OpPut(fence+"/data", "evicted"))
	require.ErrorIs(t, err, etcdlock.ErrStaleToken, "the evicted holder's late write")
	resp, err := cli.Get(ctx, fence+"/data")
	require.NoError(t, err)
	require.Equal(t, "next", string(resp.Kvs[0].Value))

	// Evicted once: its key is gone, and another try finds nothing.
	err = etcdlock.Evict(ctx, cli, name, holder.Key, holder.Token)
	require.ErrorIs(t, err, etcdlock.ErrNotInQueue)
	// The guard: the current holder's key with another token stays.
	err = etcdlock.Evict(ctx, cli, name, next.m.Key(), holder.Token)
	require.ErrorIs(t, err, etcdlock.ErrNotInQueue)
	require.NoError(t, next.m.Unlock(ctx), "still held")
	require.ErrorIs(t, old.Unlock(ctx), etcdlock.ErrLockLost)
}

// TestEvictWaiter: a waiter evicted leaves the queue with ErrLockLost, and
// the holder is untouched.
func TestEvictWaiter(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	h := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, h.Lock(ctx))
	w := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), name))
	w.waitIdle(t)
	q, err := etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Len(t, q.Waiters(), 1)
	require.NoError(t, etcdlock.Evict(ctx, cli, name, q.Waiters()[0].Key, q.Waiters()[0].Token))
	require.ErrorIs(t, w.result(t, 30*time.Second), etcdlock.ErrLockLost)
	resp, err := cli.Txn(ctx).If(h.IsOwner()).Commit()
	require.NoError(t, err)
	require.True(t, resp.Succeeded, "the holder still holds")
	require.NoError(t, h.Unlock(ctx))
}

// TestEvictKeepsLockDelay: a hold evicted is a hold that ended without
// Unlock: its lock delay keeps the lock free, as after a crash, and the
// next waiter is admitted only after it.
func TestEvictKeepsLockDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	const delay = 2 * time.Second
	old := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithLockDelay(delay))
	require.NoError(t, old.Lock(ctx))
	w := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithLockDelay(delay)))
	w.waitIdle(t)
	evicted := time.Now()
	require.NoError(t, etcdlock.Evict(ctx, cli, name, old.Key(), old.Token()))
	q, err := etcdlock.InspectLock(ctx, cli, name)
	require.NoError(t, err)
	require.Len(t, q.Delays, 1, "the evicted hold's delay is pending")
	require.NoError(t, w.result(t, 30*time.Second))
	require.GreaterOrEqual(t, time.Since(evicted), delay, "admitted only once the delay ran out")
	require.NoError(t, w.m.Unlock(ctx))
}

// TestEvictInvalid: what Evict refuses before any RPC.
func TestEvictInvalid(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // no RPC is made
	for _, tc := range []struct {
		name, key string
		token     int64
		want      error
	}{
		{"", "x/1", 1, etcdlock.ErrInvalidName},
		{"a", "b/1", 1, etcdlock.ErrInvalidName},
		{"a", "a/", 1, etcdlock.ErrInvalidName},
		{"a", "a/b/1", 1, etcdlock.ErrInvalidName},
		{"a", "a/1", 0, etcdlock.ErrInvalidOption},
	} {
		err := etcdlock.Evict(ctx, cli, tc.name, tc.key, tc.token)
		require.ErrorIs(t, err, tc.want, "%+v", tc)
		require.False(t, errors.Is(err, context.Canceled), "%+v: no RPC", tc)
	}
}
