package etcdlock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// recorder keeps every event of the Hooks it returns, for tests to count.
type recorder struct {
	mu       sync.Mutex
	starts   []etcdlock.AcquireStartInfo
	dones    []etcdlock.AcquireDoneInfo
	holds    []etcdlock.HoldDoneInfo
	renewals []etcdlock.RenewDoneInfo
	sessions []etcdlock.SessionDoneInfo
	changed  chan struct{} // signalled after each event; capacity 1
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

// add records an event with f, under r.mu, and signals it.
func (r *recorder) add(f func()) {
	r.mu.Lock()
	f()
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) hooks() etcdlock.Hooks {
	return etcdlock.Hooks{
		AcquireStart: func(i etcdlock.AcquireStartInfo) { r.add(func() { r.starts = append(r.starts, i) }) },
		AcquireDone:  func(i etcdlock.AcquireDoneInfo) { r.add(func() { r.dones = append(r.dones, i) }) },
		HoldDone:     func(i etcdlock.HoldDoneInfo) { r.add(func() { r.holds = append(r.holds, i) }) },
		RenewDone:    func(i etcdlock.RenewDoneInfo) { r.add(func() { r.renewals = append(r.renewals, i) }) },
		SessionDone:  func(i etcdlock.SessionDoneInfo) { r.add(func() { r.sessions = append(r.sessions, i) }) },
	}
}

// counts returns how many events of each sort r has: starts, dones,
// holds, sessions.
func (r *recorder) counts() [4]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return [4]int{len(r.starts), len(r.dones), len(r.holds), len(r.sessions)}
}

// lastDone, lastHold and lastSession return the newest event of their sort.
func (r *recorder) lastDone() etcdlock.AcquireDoneInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dones[len(r.dones)-1]
}

func (r *recorder) lastHold() etcdlock.HoldDoneInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holds[len(r.holds)-1]
}

func (r *recorder) lastSession() etcdlock.SessionDoneInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sessions[len(r.sessions)-1]
}

// waitFor waits until cond, called under r.mu, holds.
func (r *recorder) waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(within)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			t.Fatalf("no %s within %v", what, within)
		}
	}
}

// requireAcquired asserts the newest acquisition r saw was one start and
// one done, acquired, of kind on name, with token and key, each event
// carrying the call's ctx.
func (r *recorder) requireAcquired(t *testing.T, before [4]int, kind etcdlock.Kind, name string, token int64, key string) {
	t.Helper()
	require.Equal(t, [4]int{before[0] + 1, before[1] + 1, before[2], before[3]}, r.counts(), "one AcquireStart and one AcquireDone")
	d := r.lastDone()
	require.Equal(t, etcdlock.Acquired, d.Outcome)
	require.NoError(t, d.Err)
	require.Equal(t, kind, d.Kind)
	require.Equal(t, name, d.Name)
	require.Equal(t, token, d.Token)
	require.Equal(t, key, d.Key)
	require.Positive(t, d.Waited)
	r.mu.Lock()
	s := r.starts[len(r.starts)-1]
	r.mu.Unlock()
	require.Equal(t, d.LockInfo, s.LockInfo)
	require.Equal(t, d.Wait, s.Wait)
	require.Equal(t, callMark{}, s.Context.Value(callMark{}), "AcquireStart has the call's ctx")
	require.Equal(t, callMark{}, d.Context.Value(callMark{}), "AcquireDone has the call's ctx")
}

// callMark is a ctx value the hooks tests give their calls, so that the
// events can be shown to carry the call's ctx, not another.
type callMark struct{}

// marked returns ctx with callMark.
func marked(ctx context.Context) context.Context {
	return context.WithValue(ctx, callMark{}, callMark{})
}

// requireHoldDone asserts r saw exactly one more HoldDone than before,
// ending as end, of kind with token.
func (r *recorder) requireHoldDone(t *testing.T, before [4]int, kind etcdlock.Kind, token int64, end etcdlock.HoldEnd) {
	t.Helper()
	require.Equal(t, before[2]+1, r.counts()[2], "one HoldDone")
	h := r.lastHold()
	require.Equal(t, end, h.End, "%v", h.Err)
	require.Equal(t, kind, h.Kind)
	require.Equal(t, token, h.Token)
	require.Positive(t, h.Held)
	r.mu.Lock()
	acquired := slices.ContainsFunc(r.dones, func(d etcdlock.AcquireDoneInfo) bool {
		return d.Outcome == etcdlock.Acquired && d.Key == h.Key && d.Token == h.Token && d.LockInfo.Name == h.Name
	})
	r.mu.Unlock()
	require.True(t, acquired, "the HoldDone's Key and Token are its AcquireDone's")
	if end.Lost() {
		require.ErrorIs(t, h.Err, etcdlock.ErrLockLost)
	} else {
		require.NoError(t, h.Err)
	}
}

// TestHooksAcquireRelease: every acquisition of every primitive makes one
// AcquireStart and one AcquireDone with its kind, name and outcome, and
// every hold taken one HoldDone when released; nothing else fires.
func TestHooksAcquireRelease(t *testing.T) {
	cli := newClient(t)
	rec, second := newRecorder(), newRecorder()
	s := newSession(t, cli, etcdlock.WithHooks(rec.hooks()), etcdlock.WithHooks(second.hooks()))
	other := newSession(t, cli)
	ctx := marked(t.Context())

	t.Run("Mutex", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewMutex(s, name)
		c := rec.counts()
		require.NoError(t, m.Lock(ctx))
		rec.requireAcquired(t, c, etcdlock.KindMutex, name, m.Token(), m.Key())
		token := m.Token()
		c = rec.counts()
		require.NoError(t, m.Unlock(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindMutex, token, etcdlock.Released)
		require.ErrorIs(t, m.Unlock(ctx), etcdlock.ErrLockReleased)
		require.Equal(t, c[2]+1, rec.counts()[2], "a second Unlock ends nothing")

		// Busy, and a waiter whose ctx ends.
		o := etcdlock.NewMutex(other, name)
		require.NoError(t, o.Lock(ctx))
		c = rec.counts()
		require.ErrorIs(t, m.TryLock(ctx), etcdlock.ErrLocked)
		require.Equal(t, [4]int{c[0] + 1, c[1] + 1, c[2], c[3]}, rec.counts())
		d := rec.lastDone()
		require.Equal(t, etcdlock.AcquireBusy, d.Outcome)
		require.False(t, d.Wait)
		require.ErrorIs(t, d.Err, etcdlock.ErrLocked)
		require.Zero(t, d.Token)

		// The Lock waits at least 200ms: it is waiting before the pause
		// begins, and its ctx ends after it.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		w := startWaiter(wctx, m)
		w.waitIdle(t)
		time.Sleep(200 * time.Millisecond)
		cancel()
		require.ErrorIs(t, w.result(t, 10*time.Second), context.Canceled)
		d = rec.lastDone()
		require.Equal(t, etcdlock.AcquireCanceled, d.Outcome)
		require.True(t, d.Wait)
		require.GreaterOrEqual(t, d.Waited, 200*time.Millisecond)
		require.Equal(t, [4]int{c[0] + 2, c[1] + 2, c[2], c[3]}, rec.counts())
		require.NoError(t, o.Unlock(ctx))

		// Do: one acquisition, one release.
		c = rec.counts()
		require.NoError(t, m.Do(ctx, func(context.Context) error { return nil }))
		require.Equal(t, [4]int{c[0] + 1, c[1] + 1, c[2] + 1, c[3]}, rec.counts())
		require.Equal(t, etcdlock.Released, rec.lastHold().End)
		require.Equal(t, rec.counts(), second.counts(), "every WithHooks is called")
	})

	t.Run("RWMutex", func(t *testing.T) {
		name := lockName(t)
		m := etcdlock.NewRWMutex(s, name)
		c := rec.counts()
		require.NoError(t, m.RLock(ctx))
		rec.requireAcquired(t, c, etcdlock.KindRWMutexRead, name, m.Token(), m.Key())
		require.True(t, rec.lastDone().Mode.Shared)
		token := m.Token()
		c = rec.counts()
		require.NoError(t, m.RUnlock(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindRWMutexRead, token, etcdlock.Released)

		c = rec.counts()
		require.NoError(t, m.Lock(ctx))
		rec.requireAcquired(t, c, etcdlock.KindRWMutexWrite, name, m.Token(), m.Key())
		token = m.Token()
		require.NoError(t, m.Downgrade(ctx))
		c = rec.counts()
		require.NoError(t, m.RUnlock(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindRWMutexWrite, token, etcdlock.Released)
		require.True(t, rec.lastHold().Mode.Shared, "downgraded: a write hold now shared")
	})

	t.Run("Semaphore", func(t *testing.T) {
		name := lockName(t)
		sem := etcdlock.NewSemaphore(s, name, 3)
		c := rec.counts()
		require.NoError(t, sem.Acquire(ctx, 2))
		rec.requireAcquired(t, c, etcdlock.KindSemaphore, name, sem.Token(), sem.Key())
		require.Equal(t, etcdlock.KeyMode{Weight: 2, Capacity: 3}, rec.lastDone().Mode)
		token := sem.Token()
		c = rec.counts()
		require.NoError(t, sem.Release(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindSemaphore, token, etcdlock.Released)
	})

	t.Run("Election", func(t *testing.T) {
		name := lockName(t)
		e := etcdlock.NewElection(s, name)
		c := rec.counts()
		require.NoError(t, e.Campaign(ctx, "a"))
		rec.requireAcquired(t, c, etcdlock.KindElection, name, e.Token(), e.Key())
		token := e.Token()
		c = rec.counts()
		require.NoError(t, e.Campaign(ctx, "b"), "a leader's Campaign proclaims")
		require.Equal(t, c, rec.counts(), "proclaiming is no acquisition")
		require.NoError(t, e.Resign(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindElection, token, etcdlock.Released)
		require.NoError(t, e.Resign(ctx))
		require.Equal(t, c[2]+1, rec.counts()[2])
	})

	t.Run("MultiMutex", func(t *testing.T) {
		a, b := lockName(t)+"a", lockName(t)+"b"
		m := etcdlock.NewMultiMutex(s, []string{a, b})
		c := rec.counts()
		require.NoError(t, m.Lock(ctx))
		rec.requireAcquired(t, c, etcdlock.KindMultiMutex, a+","+b, m.Token(), m.Keys()[0])
		token := m.Token()
		c = rec.counts()
		require.NoError(t, m.Unlock(ctx))
		rec.requireHoldDone(t, c, etcdlock.KindMultiMutex, token, etcdlock.Released)
	})

	t.Run("InvalidCalls", func(t *testing.T) {
		// Calls refused before they begin are no acquisitions.
		c := rec.counts()
		require.ErrorIs(t, etcdlock.NewMutex(s, "").Lock(ctx), etcdlock.ErrInvalidName)
		require.ErrorIs(t, etcdlock.NewSemaphore(s, lockName(t), 1).Acquire(ctx, 2), etcdlock.ErrInvalidWeight)
		require.Equal(t, c, rec.counts())
	})
}

// TestHooksSessionEndsWaiter: a waiter whose session ends reports
// AcquireSessionEnded, and a Lock on an ended session too.
func TestHooksSessionEndsWaiter(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, holder.Lock(t.Context()))
	rec := newRecorder()
	s := newSession(t, cli, etcdlock.WithHooks(rec.hooks()))
	m := etcdlock.NewMutex(s, name)
	w := startWaiter(t.Context(), m)
	w.waitIdle(t)
	require.NoError(t, s.Close())
	require.ErrorIs(t, w.result(t, 5*time.Second), etcdlock.ErrSessionExpired)
	require.Equal(t, [4]int{1, 1, 0, 1}, rec.counts())
	require.Equal(t, etcdlock.AcquireSessionEnded, rec.lastDone().Outcome)
	require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrSessionExpired)
	require.Equal(t, [4]int{2, 2, 0, 1}, rec.counts())
	require.Equal(t, etcdlock.AcquireSessionEnded, rec.lastDone().Outcome)
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestHooksWaiterKeyDeleted: a waiter whose key someone deletes returns
// ErrLockLost, an acquisition that failed ("error"), and no hold.
func TestHooksWaiterKeyDeleted(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, holder.Lock(t.Context()))
	rec := newRecorder()
	m := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithHooks(rec.hooks())), name)
	w := startWaiter(t.Context(), m)
	w.waitIdle(t)
	_, err := cli.Delete(t.Context(), m.Key())
	require.NoError(t, err)
	require.ErrorIs(t, w.result(t, 5*time.Second), etcdlock.ErrLockLost)
	require.Equal(t, [4]int{1, 1, 0, 0}, rec.counts())
	d := rec.lastDone()
	require.Equal(t, etcdlock.AcquireFailed, d.Outcome)
	require.ErrorIs(t, d.Err, etcdlock.ErrLockLost)
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestHooksLoss: a hold lost (lease revoked, key deleted, session closed,
// max hold passed) makes exactly one HoldDone with its cause: when the
// loss watch sees it if Done was called, else at Unlock or the session's
// end, whichever comes first; an Unlock after a reported loss reports
// nothing more. The logger says it at Warn.
func TestHooksLoss(t *testing.T) {
	cases := []struct {
		name    string
		opts    []etcdlock.MutexOption
		end     func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, m *etcdlock.Mutex)
		want    etcdlock.HoldEnd
		session etcdlock.SessionEnd // 255: the session goes on
	}{
		{"LeaseRevoked", nil, func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, m *etcdlock.Mutex) {
			_, err := cli.Revoke(t.Context(), s.Lease())
			require.NoError(t, err)
		}, etcdlock.LostLease, etcdlock.SessionLeaseGone},
		{"KeyDeleted", nil, func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, m *etcdlock.Mutex) {
			resp, err := cli.Delete(t.Context(), m.Key())
			require.NoError(t, err)
			require.EqualValues(t, 1, resp.Deleted)
		}, etcdlock.LostKeyDeleted, 255},
		{"SessionClosed", nil, func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, m *etcdlock.Mutex) {
			require.NoError(t, s.Close())
		}, etcdlock.LostSessionClosed, etcdlock.SessionClosed},
		{"MaxHold", []etcdlock.MutexOption{etcdlock.WithMaxHold(time.Second)}, func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, m *etcdlock.Mutex) {
			select {
			case <-m.Done():
			case <-time.After(3 * time.Second):
				t.Fatal("max hold did not end the hold in 3s")
			}
		}, etcdlock.LostMaxHold, 255},
	}
	for _, tc := range cases {
		for _, watched := range []bool{true, false} {
			if tc.want == etcdlock.LostMaxHold && !watched {
				continue // without Done, the case would wait for the limit with no event to wait on
			}
			t.Run(fmt.Sprintf("%s/Done=%v", tc.name, watched), func(t *testing.T) {
				cli := newClient(t)
				rec := newRecorder()
				var logs lockedBuffer
				log := slog.New(slog.NewJSONHandler(&logs, nil))
				s := newSession(t, cli, etcdlock.WithTTL(30*time.Second), etcdlock.WithHooks(rec.hooks()), etcdlock.WithLogger(log))
				m := etcdlock.NewMutex(s, lockName(t), tc.opts...)
				require.NoError(t, m.Lock(t.Context()))
				token := m.Token()
				c := rec.counts()
				if watched {
					m.Done()
				}
				tc.end(t, cli, s, m)
				switch {
				case watched:
					rec.waitFor(t, "HoldDone", 5*time.Second, func() bool { return len(rec.holds) > c[2] })
				case tc.session == etcdlock.SessionClosed:
					require.Equal(t, c[2]+1, rec.counts()[2], "Close reports the holds it ends")
				case tc.session == 255:
					require.Equal(t, c[2], rec.counts()[2], "no HoldDone before anything looks at the hold")
				}
				// (A lease revoked ends the session at its next renewal,
				// which reports the hold: it may come at any moment.)
				require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
				rec.requireHoldDone(t, c, etcdlock.KindMutex, token, tc.want)
				if tc.session != 255 {
					rec.waitFor(t, "SessionDone", 5*time.Second, func() bool { return len(rec.sessions) > 0 })
					require.Equal(t, tc.session, rec.lastSession().Cause)
				}
				require.NoError(t, s.Close())
				require.Equal(t, c[2]+1, rec.counts()[2], "one HoldDone per hold")
				require.Equal(t, 1, rec.counts()[3], "one SessionDone per session")

				lost := logLines(t, &logs, "etcdlock: lock lost")
				require.Len(t, lost, 1, logs.String())
				wantLevel := "WARN"
				if tc.want == etcdlock.LostSessionClosed {
					wantLevel = "INFO" // the program's own doing
				}
				require.Equal(t, wantLevel, lost[0]["level"])
				require.Equal(t, tc.want.String(), lost[0]["cause"])
				require.Equal(t, lockName(t), lost[0]["name"])
				require.Equal(t, "mutex", lost[0]["kind"])
				require.Contains(t, lost[0]["error"], "lock was lost")
			})
		}
	}
}

// TestHooksCutOff cuts a holder off from etcd, as TestHolderLearnsFirst
// does: its renewals fail (RenewDone with an error, a Warn each), the
// session ends as not renewed, and the hold, watched, is lost with its
// lease, once, each said at Warn.
func TestHooksCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a client off for a lease TTL")
	}
	t.Parallel()
	px := etcdtest.NewProxy(t, endpoints[0])
	hcli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
	rec := newRecorder()
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	s := newSession(t, hcli, etcdlock.WithTTL(2*time.Second), etcdlock.WithHooks(rec.hooks()), etcdlock.WithLogger(log))
	defer s.Orphan() // cut off, it cannot revoke its lease
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	token := m.Token()
	c := rec.counts()
	m.Done()
	// One renewal before the cut.
	rec.waitFor(t, "renewal", 5*time.Second, func() bool { return len(rec.renewals) > 0 })
	px.Cut()
	rec.waitFor(t, "HoldDone", 10*time.Second, func() bool { return len(rec.holds) > c[2] })
	rec.requireHoldDone(t, c, etcdlock.KindMutex, token, etcdlock.LostLease)
	rec.waitFor(t, "SessionDone", 5*time.Second, func() bool { return len(rec.sessions) > 0 })
	require.Equal(t, 1, rec.counts()[3])
	require.Equal(t, etcdlock.SessionNotRenewed, rec.lastSession().Cause)
	require.ErrorIs(t, rec.lastSession().Err, etcdlock.ErrSessionExpired)

	rec.mu.Lock()
	renewals := rec.renewals
	rec.mu.Unlock()
	require.NoError(t, renewals[0].Err)
	require.Equal(t, 2*time.Second, renewals[0].TTL)
	require.Positive(t, renewals[0].Latency)
	require.Positive(t, renewals[0].Left)
	require.Equal(t, s.Lease(), renewals[0].Lease)
	failed := 0
	for _, r := range renewals {
		if r.Err != nil {
			failed++
			require.Zero(t, r.TTL)
		}
	}
	require.Positive(t, failed, "a renewal after the cut failed")

	require.Len(t, logLines(t, &logs, "etcdlock: lease renewal failed"), failed, logs.String())
	lost := logLines(t, &logs, "etcdlock: lock lost")
	require.Len(t, lost, 1, logs.String())
	require.Equal(t, "lease_ended", lost[0]["cause"])
	ended := logLines(t, &logs, "etcdlock: session ended")
	require.Len(t, ended, 1, logs.String())
	require.Equal(t, "WARN", ended[0]["level"])
	require.Equal(t, "not_renewed", ended[0]["cause"])
	require.Equal(t, fmt.Sprintf("%x", int64(s.Lease())), ended[0]["lease"])

	// The loss is known: Unlock says so without a round trip, through
	// the cut.
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.Equal(t, c[2]+1, rec.counts()[2], "one HoldDone per hold")
}

// TestHooksUnwatchedHoldsAtSessionEnd: holds nobody watched (no Done, no
// Unlock) are reported when their session ends, once each, so that the
// gauges of a program that closes a session with locks held come back to
// zero; an Unlock after that reports nothing more. For each way a session
// ends by the program's doing, and by its lease's end.
func TestHooksUnwatchedHoldsAtSessionEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, s *etcdlock.Session)
		want etcdlock.HoldEnd
	}{
		{"Close", func(t *testing.T, s *etcdlock.Session) { require.NoError(t, s.Close()) }, etcdlock.LostSessionClosed},
		{"Orphan", func(t *testing.T, s *etcdlock.Session) { s.Orphan() }, etcdlock.LostSessionClosed},
		{"LeaseRevoked", func(t *testing.T, s *etcdlock.Session) {
			_, err := newClient(t).Revoke(t.Context(), s.Lease())
			require.NoError(t, err)
			<-s.Done()
		}, etcdlock.LostLease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			rec := newRecorder()
			s := newSession(t, newClient(t), etcdlock.WithHooks(rec.hooks()))
			name := lockName(t)
			m := etcdlock.NewMutex(s, name+"/m")
			rw := etcdlock.NewRWMutex(s, name+"/rw")
			set := etcdlock.NewMultiMutex(s, []string{name + "/a", name + "/b"})
			watched := etcdlock.NewMutex(s, name+"/watched")
			require.NoError(t, m.Lock(ctx))
			require.NoError(t, rw.RLock(ctx))
			require.NoError(t, set.Lock(ctx))
			require.NoError(t, watched.Lock(ctx))
			watched.Done()
			c := rec.counts()

			tc.end(t, s)
			s.Close()
			require.Equal(t, c[2]+4, rec.counts()[2], "one HoldDone per hold, by the session's end")
			rec.mu.Lock()
			ends := map[string]etcdlock.HoldEnd{}
			for _, h := range rec.holds[c[2]:] {
				ends[h.Name] = h.End
				require.ErrorIs(t, h.Err, etcdlock.ErrLockLost)
			}
			rec.mu.Unlock()
			require.Equal(t, map[string]etcdlock.HoldEnd{
				name + "/m": tc.want, name + "/rw": tc.want, name + "/a," + name + "/b": tc.want, name + "/watched": tc.want,
			}, ends)

			require.Error(t, m.Unlock(ctx))
			require.Error(t, rw.RUnlock(ctx))
			require.Error(t, set.Unlock(ctx))
			require.Error(t, watched.Unlock(ctx))
			require.Equal(t, c[2]+4, rec.counts()[2], "an Unlock after the end reports nothing more")
		})
	}
}

// TestHooksHoldAdmittedAsSessionEnds: a hold admitted just as its session
// ends (here the session closes while AcquireDone runs, before the hold is
// the Mutex's) is reported too, by the time Lock returns: the session's
// end, which reports the holds nobody watched, may pass it by, and Lock
// then ends it itself. Before, only a later Unlock reported it.
func TestHooksHoldAdmittedAsSessionEnds(t *testing.T) {
	rec := newRecorder()
	closed := make(chan struct{})
	var s *etcdlock.Session
	s = newSession(t, newClient(t), etcdlock.WithHooks(rec.hooks()), etcdlock.WithHooks(etcdlock.Hooks{
		AcquireDone: func(etcdlock.AcquireDoneInfo) {
			go func() {
				s.Close()
				close(closed)
			}()
			<-closed
		},
	}))
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	require.Equal(t, 1, rec.counts()[2], "the hold is reported by the time Lock returns")
	h := rec.lastHold()
	require.Equal(t, etcdlock.LostSessionClosed, h.End)
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.Error(t, m.Unlock(t.Context()))
	require.Equal(t, 1, rec.counts()[2], "and once")
}

// TestHooksSessionEnd: each way a session ends makes one SessionDone
// with its cause; a lease found gone by a renewal is a RenewDone with an
// error matching ErrSessionExpired. Renewals report their TTL.
func TestHooksSessionEnd(t *testing.T) {
	cases := []struct {
		name string
		end  func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc)
		want etcdlock.SessionEnd
	}{
		{"Close", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc) {
			require.NoError(t, s.Close())
		}, etcdlock.SessionClosed},
		{"Orphan", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc) {
			s.Orphan()
		}, etcdlock.SessionClosed},
		{"Context", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc) {
			cancel()
		}, etcdlock.SessionContextEnded},
		{"ClientClosed", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc) {
			require.NoError(t, cli.Close())
		}, etcdlock.SessionClientClosed},
		{"LeaseRevoked", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, cancel context.CancelFunc) {
			_, err := newClient(t).Revoke(t.Context(), s.Lease())
			require.NoError(t, err)
		}, etcdlock.SessionLeaseGone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cli, err := cluster.NewClient(clientv3.Config{})
			require.NoError(t, err)
			defer cli.Close()
			rec := newRecorder()
			var logs lockedBuffer
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithTTL(aliveTTL), etcdlock.WithContext(ctx),
				etcdlock.WithHooks(rec.hooks()), etcdlock.WithLogger(log))
			require.NoError(t, err)
			defer s.Close()
			rec.waitFor(t, "renewal", 10*time.Second, func() bool { return len(rec.renewals) > 0 })
			tc.end(t, cli, s, cancel)
			rec.waitFor(t, "SessionDone", 5*time.Second, func() bool { return len(rec.sessions) > 0 })
			s.Close()
			s.Orphan()
			require.Equal(t, 1, rec.counts()[3], "one SessionDone")
			got := rec.lastSession()
			require.Equal(t, tc.want, got.Cause)
			require.Equal(t, s.Lease(), got.Lease)
			require.Equal(t, s.Err(), got.Err)

			rec.mu.Lock()
			renewals := rec.renewals
			rec.mu.Unlock()
			require.NoError(t, renewals[0].Err)
			require.Equal(t, aliveTTL, renewals[0].TTL)
			for _, r := range renewals[:len(renewals)-1] {
				require.NoError(t, r.Err, "renewals before the end succeed")
			}
			last := renewals[len(renewals)-1]
			if tc.want == etcdlock.SessionLeaseGone {
				// The next renewal found the lease gone.
				require.ErrorIs(t, last.Err, etcdlock.ErrSessionExpired)
				require.Zero(t, last.Left)
			} else if tc.want != etcdlock.SessionClientClosed {
				// (A closed client breaks the renewals' stream, which may
				// fail an attempt before the session learns why.)
				require.NoError(t, last.Err, "an attempt cut short by the end is not a failure")
			}

			ended := logLines(t, &logs, "etcdlock: session ended")
			require.Len(t, ended, 1, logs.String())
			require.Equal(t, tc.want.String(), ended[0]["cause"])
			wantLevel := "INFO"
			if tc.want == etcdlock.SessionLeaseGone {
				wantLevel = "WARN"
			}
			require.Equal(t, wantLevel, ended[0]["level"])
		})
	}
}

// TestHooksElectionLoss: an election lost (its key deleted) is a HoldDone
// of KindElection with its cause, logged as leadership lost; Lead, which
// watches, reports it at once.
func TestHooksElectionLoss(t *testing.T) {
	cli := newClient(t)
	rec := newRecorder()
	var logs lockedBuffer
	s := newSession(t, cli, etcdlock.WithHooks(rec.hooks()), etcdlock.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	name := lockName(t)
	e := etcdlock.NewElection(s, name)
	c := rec.counts()
	require.NoError(t, e.Campaign(marked(t.Context()), "v"))
	rec.requireAcquired(t, c, etcdlock.KindElection, name, e.Token(), e.Key())
	token := e.Token()
	c = rec.counts()
	e.Done()
	_, err := cli.Delete(t.Context(), e.Key())
	require.NoError(t, err)
	rec.waitFor(t, "HoldDone", 5*time.Second, func() bool { return len(rec.holds) > c[2] })
	rec.requireHoldDone(t, c, etcdlock.KindElection, token, etcdlock.LostKeyDeleted)
	require.ErrorIs(t, e.Resign(t.Context()), etcdlock.ErrLockLost)
	require.Equal(t, c[2]+1, rec.counts()[2])
	lost := logLines(t, &logs, "etcdlock: leadership lost")
	require.Len(t, lost, 1, logs.String())
	require.Equal(t, "election", lost[0]["kind"])
	require.Equal(t, "key_deleted", lost[0]["cause"])
}

// TestLoggerQuiet: locks taken and released and Close log nothing at
// Warn; the session's Close is one line at Info.
func TestLoggerQuiet(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	s, err := etcdlock.NewSession(t.Context(), newClient(t), etcdlock.WithLogger(log))
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, lockName(t))
	for range 3 {
		require.NoError(t, m.Lock(t.Context()))
		require.NoError(t, m.Unlock(t.Context()))
	}
	require.NoError(t, m.Do(t.Context(), func(context.Context) error { return nil }))
	require.NoError(t, s.Close())
	lines := logLines(t, &logs, "")
	require.Len(t, lines, 1, logs.String())
	require.Equal(t, "etcdlock: session ended", lines[0]["msg"])
	require.Equal(t, "INFO", lines[0]["level"])
	require.Equal(t, "closed", lines[0]["cause"])
}

// logLines returns the JSON log lines in logs with message msg (all of
// them when msg is "").
func logLines(t *testing.T, logs *lockedBuffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), sc.Text())
		if msg == "" || line["msg"] == msg {
			out = append(out, line)
		}
	}
	return out
}

// BenchmarkHooks measures Lock then Unlock of an uncontended Mutex on the
// shared one-member etcd, with no hooks ("unset") and with every hook set
// to count into atomics ("hooks"). With -count the two alternate, round
// after round; compare their medians:
//
//	go test -run '^$' -bench BenchmarkHooks -benchmem -count 10 .
func BenchmarkHooks(b *testing.B) {
	var n atomic.Int64
	count := etcdlock.Hooks{
		AcquireStart: func(etcdlock.AcquireStartInfo) { n.Add(1) },
		AcquireDone:  func(i etcdlock.AcquireDoneInfo) { n.Add(int64(i.Waited)) },
		HoldDone:     func(i etcdlock.HoldDoneInfo) { n.Add(int64(i.Held)) },
		RenewDone:    func(etcdlock.RenewDoneInfo) { n.Add(1) },
		SessionDone:  func(etcdlock.SessionDoneInfo) { n.Add(1) },
	}
	for _, c := range []struct {
		name string
		opts []etcdlock.SessionOption
	}{
		{"unset", nil},
		{"hooks", []etcdlock.SessionOption{etcdlock.WithHooks(count)}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := etcdlock.NewSession(b.Context(), cluster.Client(b), c.opts...)
			require.NoError(b, err)
			defer s.Close()
			m := etcdlock.NewMutex(s, "bench/hooks/"+c.name)
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if err := m.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := m.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHooksShards: a shard RunShards runs is a hold of kind shard on
// name/<shard>, acquired before fn starts and released once RunShards
// has let it go.
func TestHooksShards(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	s := newSession(t, newClient(t), etcdlock.WithHooks(rec.hooks()))
	name := lockName(t)
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan etcdlock.Shard, 1)
	err := make(chan error, 1)
	go func() {
		err <- etcdlock.RunShards(ctx, s, name, 1, func(ctx context.Context, sh etcdlock.Shard) error {
			started <- sh
			<-ctx.Done()
			return nil
		})
	}()
	sh := <-started
	shard := func(d etcdlock.AcquireDoneInfo) bool { return d.Kind == etcdlock.KindShard }
	rec.mu.Lock()
	i := slices.IndexFunc(rec.dones, shard)
	require.GreaterOrEqual(t, i, 0, "no AcquireDone of kind shard before fn")
	d := rec.dones[i]
	rec.mu.Unlock()
	require.Equal(t, etcdlock.Acquired, d.Outcome)
	require.Equal(t, name+"/0", d.Name)
	require.Equal(t, sh.Token, d.Token)
	require.Equal(t, sh.Key(), d.Key)
	require.Equal(t, "shard", d.Kind.String())

	cancel()
	require.NoError(t, <-err)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	j := slices.IndexFunc(rec.holds, func(h etcdlock.HoldDoneInfo) bool { return h.Kind == etcdlock.KindShard })
	require.GreaterOrEqual(t, j, 0, "no HoldDone of kind shard once RunShards returned")
	require.Equal(t, etcdlock.Released, rec.holds[j].End)
	require.Equal(t, sh.Token, rec.holds[j].Token)
}
