package etcdlockgocron_test

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/stretchr/testify/require"
)

// TestLockerIdentity (issue 40): a Locker's lock records its replica's
// identity, and a skipped tick says which replica holds, or that the
// minimum hold of a run that ended keeps the tick out: no longer the
// same "held by another session" for both.
func TestLockerIdentity(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cli := cluster.Client(t)
	name := lockName(t)
	prefix := etcdlockgocron.WithPrefix(name + "/")
	// Lock waits for etcd at most the minimum hold: a loaded machine's.
	const minHold = 5 * time.Second
	newLocker := func(opts ...etcdlockgocron.Option) *etcdlockgocron.Locker {
		l, err := etcdlockgocron.NewLocker(cli, minHold, append(opts, prefix)...)
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := newLocker(etcdlockgocron.WithIdentity("replica-a")), newLocker(etcdlockgocron.WithIdentity("replica-b"))

	lock, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked)
	require.Contains(t, err.Error(), `held by replica "replica-a" (since `)
	require.Contains(t, err.Error(), fmt.Sprintf("for its run and at least its minimum hold of %v: ", minHold))

	// What etcdlock status reads: etcdlock run's fields, and who wrote
	// them.
	q, err := etcdlock.InspectLock(ctx, cli, name+"/job")
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(q.Holders()[0].Identity), &rec))
	host, _ := os.Hostname()
	require.Equal(t, "etcdlockgocron", rec["by"])
	require.Equal(t, "replica-a", rec["name"])
	require.Equal(t, host, rec["host"])
	require.EqualValues(t, os.Getpid(), rec["pid"])
	queued, err := time.Parse(time.RFC3339Nano, rec["queued"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), queued, time.Minute)

	// The replica stops within its minimum hold: its key goes with its
	// session, and the record of its hold keeps the tick out.
	require.NoError(t, lock.Unlock(ctx))
	require.NoError(t, a.Close())
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked)
	require.Contains(t, err.Error(), "kept out by the minimum hold of a run that ended (")
	require.Contains(t, err.Error(), fmt.Sprintf("of %v left)", minHold))
}

// TestDefaultIdentity: without WithIdentity a replica is "HOST:PID", in a
// Locker's records and as an Elector's value when it is given none.
func TestDefaultIdentity(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	cli := cluster.Client(t)
	host, _ := os.Hostname()
	want := fmt.Sprintf("%s:%d", host, os.Getpid())

	name := lockName(t)
	l, err := etcdlockgocron.NewLocker(cli, 5*time.Second, etcdlockgocron.WithPrefix(name+"/"))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	lock, err := l.Lock(ctx, "job")
	require.NoError(t, err)
	q, err := etcdlock.InspectLock(ctx, cli, name+"/job")
	require.NoError(t, err)
	require.Contains(t, q.Holders()[0].Identity, `"name":"`+want+`"`)
	require.NoError(t, lock.Unlock(ctx))

	e, err := etcdlockgocron.NewElector(cli, name+"/leader", "", etcdlockgocron.WithTakeoverDelay(0))
	require.NoError(t, err)
	t.Cleanup(func() { e.Close() })
	require.Eventually(t, func() bool { return e.IsLeader(ctx) == nil }, 30*time.Second, 10*time.Millisecond)
	leader, err := etcdlock.CurrentLeader(ctx, cli, name+"/leader")
	require.NoError(t, err)
	require.Equal(t, want, string(leader.Value))

	_, err = etcdlockgocron.NewLocker(cli, 5*time.Second, etcdlockgocron.WithIdentity(strings.Repeat("x", etcdlock.MaxIdentityLen+1)))
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
}
