package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// TestMinHoldMaxHoldEarlyUnlock: a Do (which watches its hold) with a
// max hold as short as allowed beside its minimum hold, whose fn returns
// at once, is a clean release: the max hold, which the holder kept to, is no loss when
// the release waits out the minimum hold, and the lock is free once the
// minimum hold has passed, with no record left to wait out again.
func TestMinHoldMaxHoldEarlyUnlock(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	ends := make(chan etcdlock.HoldDoneInfo, 4)
	s := newSession(t, cli, etcdlock.WithHooks(etcdlock.Hooks{HoldDone: func(i etcdlock.HoldDoneInfo) { ends <- i }}))
	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(testMinHold), etcdlock.WithMaxHold(testMinHold+2*time.Second))
	asked := time.Now()
	require.NoError(t, m.Do(t.Context(), func(context.Context) error { return nil }), "fn returned at once")
	var end etcdlock.HoldDoneInfo
	select {
	case end = <-ends:
	case <-time.After(30 * time.Second):
		t.Fatal("no HoldDone")
	}
	require.Equal(t, etcdlock.Released, end.End, "a hold unlocked at once is released, not lost: %v", end.Err)
	require.NoError(t, end.Err)
	require.GreaterOrEqual(t, time.Since(asked), testMinHold, "released no sooner than the minimum hold")
	require.Empty(t, keys(t, cli, name))
	require.Empty(t, delayRecords(t, cli, name), "a clean release leaves no record to wait out again")
}

// TestMinHoldLeaseRevokedDuringHoldBack: the session's lease revoked
// while an early Unlock's release waits out the minimum hold takes the
// key with it: the loss watch tells the hold's end as for a hold still
// held, the lease's (not a deleted key), and the session learns at once
// that its lease is gone.
func TestMinHoldLeaseRevokedDuringHoldBack(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	ends := make(chan etcdlock.HoldDoneInfo, 4)
	s := newSession(t, cli, etcdlock.WithHooks(etcdlock.Hooks{HoldDone: func(i etcdlock.HoldDoneInfo) { ends <- i }}))
	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(testMinHold))
	require.NoError(t, m.Lock(t.Context()))
	m.Done() // the loss watch
	require.NoError(t, m.Unlock(t.Context()))
	require.Equal(t, []string{m.Key()}, keys(t, cli, name), "held back")
	_, err := cli.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	var end etcdlock.HoldDoneInfo
	select {
	case end = <-ends:
	case <-time.After(30 * time.Second):
		t.Fatal("no HoldDone")
	}
	require.NotEqual(t, etcdlock.LostKeyDeleted, end.End, "nobody deleted the key: %v", end.Err)
	// The loss watch asks etcd why the key went, and the answer ends
	// the session before the hold's end is reported.
	select {
	case <-s.Done():
	default:
		t.Fatal("the session did not learn that its lease is gone")
	}
}
