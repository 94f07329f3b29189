package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// testMinHold is the minimum hold of the tests that wait it out: 2s, so
// that the rest a Close leaves to a lease is at least etcd's minimum TTL.
const testMinHold = 2 * time.Second

// TestMinHoldOptions: a minimum hold outside [1ms, MaxLockDelay], one
// longer than the max hold, and one on an RWMutex, a Semaphore or a
// MultiMutex are ErrInvalidOption; nothing is written.
func TestMinHoldOptions(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli)
	name := delayName(t)
	for _, d := range []time.Duration{0, -time.Second, time.Microsecond, etcdlock.MaxLockDelay + time.Second} {
		err := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(d)).Lock(t.Context())
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption, "minimum hold %v", d)
	}
	for _, max := range []time.Duration{2 * time.Second, 3 * time.Second, 4 * time.Second} {
		err := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(3*time.Second), etcdlock.WithMaxHold(max)).Lock(t.Context())
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption, "max hold %v", max)
		require.ErrorContains(t, err, "must exceed the minimum hold 3s by at least 1.3s", "max hold %v", max)
	}
	rw := etcdlock.NewRWMutex(s, name, etcdlock.WithMinHold(time.Second))
	require.ErrorIs(t, rw.Lock(t.Context()), etcdlock.ErrInvalidOption)
	require.ErrorIs(t, rw.RLock(t.Context()), etcdlock.ErrInvalidOption)
	sem := etcdlock.NewSemaphore(s, name, 3, etcdlock.WithMinHold(time.Second))
	require.ErrorIs(t, sem.Acquire(t.Context(), 1), etcdlock.ErrInvalidOption)
	mm := etcdlock.NewMultiMutex(s, []string{name + "/a", name + "/b"}, etcdlock.WithMinHold(time.Second))
	require.ErrorIs(t, mm.Lock(t.Context()), etcdlock.ErrInvalidOption)
	require.ErrorIs(t, mm.TryLock(t.Context()), etcdlock.ErrInvalidOption)
	require.Empty(t, keys(t, cli, name))
	require.Empty(t, delayRecords(t, cli, name))

	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(time.Second), etcdlock.WithMaxHold(3*time.Second))
	require.NoError(t, m.Lock(t.Context()), "a max hold 2s longer than the minimum hold is fine")
	require.NoError(t, m.Unlock(t.Context()))
}

// TestMinHoldEarlyUnlock: Unlock before the minimum hold has passed
// returns at once and leaves the key, so that TryLock finds the lock
// taken and a waiter is admitted no sooner than the minimum hold after
// the holder was; the record, written with the key, goes with it.
func TestMinHoldEarlyUnlock(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(testMinHold))
	asked := time.Now() // before etcd admitted m
	require.NoError(t, m.Lock(t.Context()))
	key, token := m.Key(), m.Token()
	require.Equal(t, map[string]*recordKV{key: {token: token, secs: 2, minHold: testMinHold}}, delayRecords(t, cli, name),
		"the record, written in the Txn that took the lock")
	require.NoError(t, m.Unlock(t.Context()))
	require.Zero(t, m.Token(), "no longer held")
	require.Equal(t, []string{key}, keys(t, cli, name), "the key stays for the minimum hold")

	other := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(testMinHold))
	require.ErrorIs(t, other.TryLock(t.Context()), etcdlock.ErrLocked)
	w := startWaiter(t.Context(), other)
	require.Equal(t, key, w.waitIdle(t))
	require.NoError(t, w.result(t, 30*time.Second))
	require.GreaterOrEqual(t, time.Since(asked), testMinHold, "admitted before the minimum hold had passed")
	require.Nil(t, delayRecords(t, cli, name)[key], "a clean release deletes the record")
	select {
	case <-m.Done():
	default:
		t.Fatal("Done is open after the key went")
	}
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockReleased, "the first Unlock is owed nothing")
	require.NoError(t, other.Unlock(t.Context()))
}

// TestMinHoldLongHold: a hold longer than its minimum hold releases in
// Unlock itself, as without one.
func TestMinHoldLongHold(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	const d = 50 * time.Millisecond
	m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(d))
	require.NoError(t, m.Lock(t.Context()))
	time.Sleep(d) // the hold outlasts its minimum hold
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name), "Unlock deleted the key")
	require.Empty(t, delayRecords(t, cli, name), "and the record")
}

// TestMinHoldSameSession: a Lock of the same Mutex after an early Unlock
// waits for the minimum hold too.
func TestMinHoldSameSession(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(time.Second))
	asked := time.Now()
	require.NoError(t, m.Lock(t.Context()))
	first := m.Token()
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, m.Lock(t.Context()))
	require.GreaterOrEqual(t, time.Since(asked), time.Second)
	require.Greater(t, m.Token(), first, "a new hold")
	require.NoError(t, m.Unlock(t.Context()))
}

// TestMinHoldUnlockThenClose: Session.Close before the minimum hold has
// passed deletes the key and leaves the rest to an etcd lease on the
// record: Close returns at once, and the lock stays taken until then.
func TestMinHoldUnlockThenClose(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	s := newSession(t, cli)
	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(testMinHold))
	asked := time.Now()
	require.NoError(t, m.Lock(t.Context()))
	key := m.Key()
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, s.Close())
	require.Empty(t, keys(t, cli, name), "Close deleted the key")
	rec := delayRecords(t, cli, name)[key]
	require.NotNil(t, rec, "the record keeps the rest of the minimum hold")
	require.NotZero(t, rec.lease, "on a lease of its own")

	other := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(testMinHold))
	require.ErrorIs(t, other.TryLock(t.Context()), etcdlock.ErrLocked)
	w := startWaiter(t.Context(), other)
	require.Equal(t, etcdlock.LockDelayPrefix+key, w.waitIdle(t))
	require.NoError(t, w.result(t, 30*time.Second))
	require.GreaterOrEqual(t, time.Since(asked), testMinHold)
	require.NoError(t, other.Unlock(t.Context()))
}

// TestMinHoldHolderDies: a holder whose lease ends with the lock held
// (here Close revokes it) leaves its record, and the next holder waits
// the minimum hold out on an etcd lease from then: on the safe side.
func TestMinHoldHolderDies(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(testMinHold))
	require.NoError(t, m.Lock(t.Context()))
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(testMinHold)))
	require.Equal(t, m.Key(), w.waitIdle(t))
	closed := time.Now()
	require.NoError(t, s.Close())
	require.Equal(t, etcdlock.LockDelayPrefix+m.Key(), w.waitIdle(t), "the waiter waits for the record")
	require.NoError(t, w.result(t, 30*time.Second))
	require.GreaterOrEqual(t, time.Since(closed), testMinHold)
	require.NoError(t, w.m.Unlock(t.Context()))
}

// TestMinHoldSkewedReplicas: three replicas run a job on the same ticks
// by their own clocks, which disagree by up to 300ms (each fires early by
// its skew): the first to fire takes the lock, with a minimum hold of half
// the interval, and the others find it taken. No tick runs twice, and
// every tick runs. The library reads no replica's clock against
// another's: the skew is only when each fires.
func TestMinHoldSkewedReplicas(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	const (
		interval = 2 * time.Second
		minHold  = interval / 2
		ticks    = 5
	)
	skews := []time.Duration{0, 150 * time.Millisecond, 300 * time.Millisecond}
	base := time.Now().Add(time.Second)
	var mu sync.Mutex
	runs := map[int][]int{} // tick -> replicas that ran it
	var wg sync.WaitGroup
	for r, skew := range skews {
		m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(minHold))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range ticks {
				// This replica's clock reads skew ahead: it fires tick
				// k when its clock says base+k*interval.
				time.Sleep(time.Until(base.Add(time.Duration(k)*interval - skew)))
				err := m.TryLock(t.Context())
				if errors.Is(err, etcdlock.ErrLocked) {
					continue // another replica runs this tick
				}
				if err != nil {
					t.Errorf("replica %d, tick %d: %v", r, k, err)
					return
				}
				mu.Lock()
				runs[k] = append(runs[k], r)
				mu.Unlock()
				if err := m.Unlock(t.Context()); err != nil {
					t.Errorf("replica %d, tick %d: Unlock: %v", r, k, err)
				}
			}
		}()
	}
	wg.Wait()
	for k := range ticks {
		require.Len(t, runs[k], 1, "tick %d ran on replicas %v", k, runs[k])
	}
}

// TestMinHoldDo: Do with a minimum hold returns once fn has, and the
// lock stays taken until the minimum hold has passed.
func TestMinHoldDo(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(time.Second))
	asked := time.Now()
	require.NoError(t, m.Do(t.Context(), func(context.Context) error { return nil }))
	other := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(time.Second))
	require.NoError(t, other.Lock(t.Context()))
	require.GreaterOrEqual(t, time.Since(asked), time.Second)
	require.NoError(t, other.Unlock(t.Context()))
}

// TestMinHoldOutlived: a hold that outlives its minimum hold drops its
// record then (with a lock delay, keeps the delay's alone), so that a
// holder that dies afterwards leaves the next Lock nothing to wait out
// but the delay: a TryLock right after its lease is revoked takes the
// lock. (Issue 32's adapter found a crash long after d skipping the next
// tick.)
func TestMinHoldOutlived(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		delay time.Duration
	}{{"MinHoldOnly", 0}, {"WithLockDelay", time.Hour}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cli := newClient(t)
			name := delayName(t)
			s, err := etcdlock.NewSession(t.Context(), cli)
			require.NoError(t, err)
			opts := []etcdlock.MutexOption{etcdlock.WithMinHold(300 * time.Millisecond)}
			if c.delay > 0 {
				opts = append(opts, etcdlock.WithLockDelay(c.delay))
			}
			m := etcdlock.NewMutex(s, name, opts...)
			require.NoError(t, m.Lock(t.Context()))
			key, token := m.Key(), m.Token()
			want := map[string]*recordKV{}
			if c.delay > 0 {
				want[key] = &recordKV{token: token, secs: 3600}
			}
			require.Eventually(t, func() bool {
				recs := delayRecords(t, cli, name)
				return len(recs) == len(want) && (len(want) == 0 || *recs[key] == *want[key])
			}, 30*time.Second, 20*time.Millisecond, "the record, once the minimum hold has passed")
			require.NoError(t, s.Close()) // the lock held: no Unlock
			other := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(300*time.Millisecond))
			if c.delay > 0 {
				require.ErrorIs(t, other.TryLock(t.Context()), etcdlock.ErrLocked, "the delay holds")
				return
			}
			require.NoError(t, other.TryLock(t.Context()), "no minimum hold is owed after it passed")
			require.NoError(t, other.Unlock(t.Context()))
		})
	}
}
