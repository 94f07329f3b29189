package main

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// TestRunLockDelay: a holder whose session ends with the lock held
// leaves a pending delay, which status shows; run --lock-delay waits it
// out (the holder's 2s, not its own 1s) and, exiting cleanly, leaves
// none.
func TestRunLockDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(2*time.Second))
	require.NoError(t, m.Lock(t.Context()))
	ended := time.Now()
	require.NoError(t, s.Close())

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "lock delay: "+m.Key()+" ended without a release; its 2s delay begins with the next lock")

	r = runProc(t, nil, "run", ep(), "--lock-delay", "1s", name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	require.GreaterOrEqual(t, time.Since(ended), 2*time.Second)

	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		Delays []delayJSON `json:"lock_delays"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Empty(t, st.Delays)
	require.Contains(t, r.stdout, `"holder": null`)
}

// TestStatusWaitingForDelay: a waiter kept out by a delay that has begun
// shows as waiting, with the delay's time left; the lock is held by
// nobody.
func TestStatusWaitingForDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(time.Hour))
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, s.Close())
	ws, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { ws.Close() })
	w := etcdlock.NewMutex(ws, name, etcdlock.WithLockDelay(time.Second))
	locked := make(chan error, 1)
	go func() { locked <- w.Lock(t.Context()) }()
	var q *etcdlock.LockQueue
	require.Eventually(t, func() bool {
		q, err = etcdlock.InspectLock(t.Context(), cli, name)
		return err == nil && len(q.Waiters()) == 1 && len(q.Delays) == 1 && q.Delays[0].Started
	}, 10*time.Second, 10*time.Millisecond)

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "is held by nobody, 1 waiting for a lock delay")
	require.Contains(t, r.stdout, w.Key())
	require.Regexp(t, `lock delay: `+m.Key()+` ended without a release; the lock stays free \d+s more \(of 3600s\)`, r.stdout)
	// ls settles who holds as status does: nobody (issue 30: it showed
	// the waiter holding).
	r = runProc(t, nil, "ls", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, regexp.QuoteMeta(name)+`\s+nobody \(a lock delay\)\s+-\s+1\n`, r.stdout)
	r = runProc(t, nil, "ls", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var ls lsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Len(t, ls.Locks, 1)
	require.Empty(t, ls.Locks[0].Holders)
	require.Equal(t, 1, ls.Locks[0].Waiters)

	_, err = cli.Revoke(t.Context(), q.Delays[0].Lease)
	require.NoError(t, err)
	select {
	case err := <-locked:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("not admitted 30s after the delay ended")
	}
	require.NoError(t, w.Unlock(t.Context()))
}

// TestStatusPlainMutexInDelay: a Mutex that takes no lock delay holds
// while another Mutex's delay is pending (it ignores the delay, as etcd's
// Mutex does), and status says it may hold rather than that nobody holds
// (issue 41: it showed the lock held by nobody, the holder waiting).
func TestStatusPlainMutexInDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(time.Hour))
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, s.Close()) // ended without Unlock: the delay is pending
	ps, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { ps.Close() })
	plain := etcdlock.NewMutex(ps, name)
	require.NoError(t, plain.TryLock(t.Context()), "a Mutex without a lock delay ignores the pending one")

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "waiting for a lock delay that has not begun, unless the first in line takes no lock delay and holds")
	require.Contains(t, r.stdout, plain.Key())
	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Len(t, st.Waiters, 1)
	require.Equal(t, plain.Key(), st.Waiters[0].Key)
	require.True(t, st.Waiters[0].MayHold)
	require.NoError(t, plain.Unlock(t.Context()))
}

// TestRunMinHold: run --min-hold keeps the lock taken after CMD and
// etcdlock have exited, until the minimum hold has passed since the lock
// was taken: status shows what keeps it, a --try run finds it held, and
// a waiting run gets it no sooner.
func TestRunMinHold(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	started := time.Now() // before the first run took the lock
	r := runProc(t, nil, "run", "--try", "--min-hold", "6s", ep(), name, "--", "sh", "-c", `echo "$ETCDLOCK_KEY"`)
	require.Equal(t, 0, r.code, r.stderr)
	key := strings.TrimSpace(r.stdout)

	r = runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "minimum hold: "+key+" (minimum hold 6s) is gone, released before its minimum hold ended")
	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		Delays []delayJSON `json:"lock_delays"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Len(t, st.Delays, 1)
	require.Equal(t, 6.0, st.Delays[0].MinHold)
	require.True(t, st.Delays[0].Started, "on a lease the first run left")

	r = runProc(t, nil, "run", "--try", "--min-hold", "6s", ep(), name, "--", "true")
	require.Equal(t, exitHeld, r.code, r.stderr)
	r = runProc(t, nil, "run", "--min-hold", "6s", ep(), name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	require.GreaterOrEqual(t, time.Since(started), 6*time.Second)
}

// TestRunMinHoldUsage: --min-hold is an exclusive lock's, within bounds.
func TestRunMinHoldUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--min-hold", "0.5ms"},
		{"--min-hold", "25h"},
		{"--min-hold", "1s", "--shared"},
		{"--min-hold", "1s", "--permits", "1", "--of", "2"},
		{"--min-hold", "1s", "-n", "2"},
		{"--min-hold", "1s", "--also", "other"},
	} {
		r := runProc(t, nil, append(append([]string{"run", ep()}, args...), lockName(t), "--", "true")...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "--min-hold", "%v", args)
	}
}
