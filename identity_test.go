package etcdlock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// value returns the value of key in etcd.
func value(t *testing.T, cli *clientv3.Client, key string) string {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	return string(resp.Kvs[0].Value)
}

// TestIdentityRoundTrip: WithIdentity puts the identity after the mode's
// line in the Put that joins the queue, at no extra RPC, for every
// primitive; InspectLock reads it back, and etcd's Mutex still queues
// behind the key.
func TestIdentityRoundTrip(t *testing.T) {
	const id = "host-a pid 42 job nightly\nqueued 2026-11-22T12:00:00Z"
	for _, c := range []struct {
		name  string
		l     newLocker
		value string
	}{
		{"Mutex", mutexL, "\n" + id},
		{"Write", writeL, "\n" + id},
		{"Read", readL, "etcdlock/1 shared\n" + id},
		{"Semaphore", semL(2, 5), "etcdlock/1 permits 2 of 5\n" + id},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rpcs etcdtest.RPCCounter
			cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
			name := lockName(t)
			l := c.l(newSession(t, cli), name, etcdlock.WithIdentity(id))
			before := rpcs.Total()
			require.NoError(t, l.Lock(t.Context()))
			require.EqualValues(t, 1, rpcs.Total()-before, "uncontended: one RPC, identity included")
			require.Equal(t, c.value, value(t, cli, l.Key()))

			q, err := etcdlock.InspectLock(t.Context(), cli, name)
			require.NoError(t, err)
			require.Len(t, q.Holders(), 1)
			require.Equal(t, id, q.Holders()[0].Identity)
			require.Equal(t, etcdlock.ParseKeyMode([]byte(c.value)), q.Holders()[0].Mode)

			// etcd's session on a client of its own: its lease keepalive
			// stream opens in the background, and would be counted as an
			// RPC of the Unlock below if it opened meanwhile.
			es, err := concurrency.NewSession(newClient(t))
			require.NoError(t, err)
			defer es.Close()
			require.ErrorIs(t, concurrency.NewMutex(es, name).TryLock(t.Context()), concurrency.ErrLocked)

			before = rpcs.Total()
			require.NoError(t, l.Unlock(t.Context()))
			require.EqualValues(t, 1, rpcs.Total()-before)
		})
	}
}

// TestNoIdentityEmptyValue: without WithIdentity a Mutex's key has etcd's
// empty value, and an uncontended Lock and Unlock stay two RPCs.
func TestNoIdentityEmptyValue(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	m := etcdlock.NewMutex(newSession(t, cli), lockName(t))
	before := rpcs.Total()
	require.NoError(t, m.Lock(t.Context()))
	n := rpcs.Total() - before
	require.Equal(t, "", value(t, cli, m.Key()))
	before = rpcs.Total()
	require.NoError(t, m.Unlock(t.Context()))
	require.EqualValues(t, 2, n+rpcs.Total()-before)

	q, err := etcdlock.InspectLock(t.Context(), cli, lockName(t))
	require.NoError(t, err)
	require.Empty(t, q.Keys)
}

// TestIdentityKeptInPlace: the writes that change a held key in place,
// WithMaxHold's move to a lease of its own and Downgrade's change of mode,
// keep the identity.
func TestIdentityKeptInPlace(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s := newSession(t, cli)
	m := etcdlock.NewRWMutex(s, name, etcdlock.WithIdentity("me"), etcdlock.WithMaxHold(time.Minute))
	require.NoError(t, m.Lock(t.Context()))
	resp, err := cli.Get(t.Context(), m.Key())
	require.NoError(t, err)
	require.NotEqual(t, int64(s.Lease()), resp.Kvs[0].Lease, "moved to the max hold lease")
	require.Equal(t, "\nme", string(resp.Kvs[0].Value))
	require.NoError(t, m.Downgrade(t.Context()))
	require.Equal(t, "etcdlock/1 shared\nme", value(t, cli, m.Key()))
	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Equal(t, "me", q.Holders()[0].Identity)
	require.True(t, q.Holders()[0].Mode.Shared)
	require.NoError(t, m.RUnlock(t.Context()))
}

// TestIdentityTooLong: an identity above MaxIdentityLen is an invalid
// option, reported by Lock before any RPC.
func TestIdentityTooLong(t *testing.T) {
	cli := newClient(t)
	m := etcdlock.NewMutex(newSession(t, cli), lockName(t), etcdlock.WithIdentity(strings.Repeat("x", etcdlock.MaxIdentityLen+1)))
	require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrInvalidOption)
	require.Empty(t, keys(t, cli, lockName(t)))
	ok := etcdlock.NewMutex(newSession(t, cli), lockName(t), etcdlock.WithIdentity(strings.Repeat("x", etcdlock.MaxIdentityLen)))
	require.NoError(t, ok.Lock(t.Context()))
	require.NoError(t, ok.Unlock(t.Context()))
}
