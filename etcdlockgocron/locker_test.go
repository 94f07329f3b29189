package etcdlockgocron_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// attemptLog records each Lock of the replicas, by tick.
type attemptLog struct {
	mu       sync.Mutex
	attempts map[time.Time][]error // guarded by mu; Lock's error, nil when it took the lock
}

// recordingLocker is replica i's Locker, on clock c, recording into log
// every Lock gocron makes.
type recordingLocker struct {
	gocron.Locker
	i   int
	c   skewedClock
	log *attemptLog
}

func (r recordingLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	tick := r.c.tick()
	l, err := r.Locker.Lock(ctx, key)
	r.log.mu.Lock()
	r.log.attempts[tick] = append(r.log.attempts[tick], err)
	r.log.mu.Unlock()
	return l, err
}

// TestLockerEachTickOnce runs a job every second on three replicas, each
// a gocron scheduler with a Locker on a client and session of its own,
// for eight ticks, and checks that every tick ran exactly once.
//
// The replicas' clocks disagree: two are 100ms ahead of true time and one
// 100ms behind (skewedClock: the machine's clock set off, with real
// timers). So each tick is fired twice at once, 100ms early, and the two
// race for the lock, and once 200ms later, after the winner's run has
// long ended and unlocked: only the minimum hold (500ms) keeps that late
// replica from running the tick again. The ticks come 800ms apart on
// the skewed clocks (from the late replica's firing to the early ones'
// next), so the hold has passed by then.
func TestLockerEachTickOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 11s")
	}
	const (
		minHold = 500 * time.Millisecond
		ticks   = 8
	)
	offsets := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, -100 * time.Millisecond}
	runs := newRunLog()
	attempts := &attemptLog{attempts: map[time.Time][]error{}}
	var scheds []gocron.Scheduler
	prefix := etcdlockgocron.WithPrefix(lockName(t) + "/")
	for i, off := range offsets {
		c := newSkewedClock(off)
		l, err := etcdlockgocron.NewLocker(cluster.Client(t), minHold, prefix)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, l.Close()) }) // after the scheduler's Shutdown
		s := newScheduler(t, c, gocron.WithDistributedLocker(recordingLocker{l, i, c, attempts}))
		_, err = s.NewJob(everySecond, runs.task(i, c), gocron.WithName("report"))
		require.NoError(t, err)
		scheds = append(scheds, s)
	}
	for _, s := range scheds {
		s.Start()
	}
	// The window: ticks every replica fires (all started over a second
	// before the first, whatever its skew), until the scheduler is shut
	// down.
	first := time.Now().Truncate(time.Second).Add(2 * time.Second)
	last := first.Add((ticks - 1) * time.Second)
	runs.waitTick(t, last.Add(time.Second), time.Until(last)+10*time.Second)
	for _, s := range scheds {
		require.NoError(t, s.Shutdown())
	}

	got := runs.snapshot()
	attempts.mu.Lock()
	defer attempts.mu.Unlock()
	for _, tick := range slices.SortedFunc(maps.Keys(got), time.Time.Compare) {
		require.Len(t, got[tick], 1, "tick %v ran on replicas %v; attempts %v", tick.Format(time.TimeOnly), got[tick], attempts.attempts[tick])
	}
	perReplica := make([]int, len(offsets))
	for tick := first; !tick.After(last); tick = tick.Add(time.Second) {
		require.Len(t, got[tick], 1, "tick %v did not run; attempts %v", tick.Format(time.TimeOnly), attempts.attempts[tick])
		perReplica[got[tick][0]]++
		// Every replica fired it, and the two that did not run it were
		// refused because the lock was taken, not for a failure.
		require.Len(t, attempts.attempts[tick], len(offsets), "tick %v", tick.Format(time.TimeOnly))
		refused := 0
		for _, err := range attempts.attempts[tick] {
			if err != nil {
				require.ErrorIs(t, err, etcdlock.ErrLocked)
				refused++
			}
		}
		require.Equal(t, len(offsets)-1, refused, "tick %v", tick.Format(time.TimeOnly))
	}
	// The replica behind never runs a tick: it always comes 200ms after
	// one of the others did.
	require.Zero(t, perReplica[2], "runs per replica %v", perReplica)
	t.Logf("%d ticks, each run once; runs per replica (offsets %v): %v", ticks, offsets, perReplica)
}

// TestLockerMinHold: the lock stays taken for the minimum hold after
// Lock took it, though the run unlocked at once, and then is free; a run
// still under way on the same replica holds it too.
func TestLockerMinHold(t *testing.T) {
	const minHold = time.Second
	ctx := t.Context()
	prefix := etcdlockgocron.WithPrefix(lockName(t) + "/")
	newLocker := func() *etcdlockgocron.Locker {
		l, err := etcdlockgocron.NewLocker(cluster.Client(t), minHold, prefix)
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		return l
	}
	a, b := newLocker(), newLocker()

	began := time.Now() // before the admission of a's hold
	lock, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	_, err = a.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked, "a run under way on the same replica")
	require.NoError(t, lock.Unlock(ctx))
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked, "unlocked before the minimum hold")
	_, err = a.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked, "unlocked before the minimum hold, same replica")
	other, err := b.Lock(ctx, "other")
	require.NoError(t, err, "another job's lock")
	require.NoError(t, other.Unlock(ctx))

	// Once the minimum hold has passed, b takes it: not sooner (a lower
	// bound, which no slowness of the machine can break).
	var taken time.Time
	require.Eventually(t, func() bool {
		l, err := b.Lock(ctx, "job")
		if err != nil {
			require.ErrorIs(t, err, etcdlock.ErrLocked)
			return false
		}
		taken = time.Now()
		require.NoError(t, l.Unlock(ctx))
		return true
	}, 10*minHold, 20*time.Millisecond)
	require.GreaterOrEqual(t, taken.Sub(began), minHold)
	t.Logf("taken by the other replica %v after the first Lock began (minimum hold %v)", taken.Sub(began).Round(time.Millisecond), minHold)
}

// TestLockerCloseKeepsMinHold: a replica that closes its Locker right
// after a run (a shutdown) leaves the rest of the minimum hold to etcd,
// so that another replica does not run the tick again.
func TestLockerCloseKeepsMinHold(t *testing.T) {
	const minHold = 2 * time.Second
	ctx := t.Context()
	prefix := etcdlockgocron.WithPrefix(lockName(t) + "/")
	a, err := etcdlockgocron.NewLocker(cluster.Client(t), minHold, prefix)
	require.NoError(t, err)
	b, err := etcdlockgocron.NewLocker(cluster.Client(t), minHold, prefix)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })

	lock, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))
	require.NoError(t, a.Close())
	_, err = a.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrSessionClosed, "Lock after Close")
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, etcdlock.ErrLocked, "the closed replica's minimum hold")
	require.Eventually(t, func() bool {
		l, err := b.Lock(ctx, "job")
		if err == nil {
			require.NoError(t, l.Unlock(ctx))
		}
		return err == nil
	}, 5*minHold, 50*time.Millisecond)
}

// TestLockerNewSession: when the Locker's session ends (here its lease is
// revoked, as etcd does to a lease not renewed in time; the session
// learns it at its next renewal, TTL/3 later), the next Lock starts a
// new one.
func TestLockerNewSession(t *testing.T) {
	ctx := t.Context()
	cli := cluster.Client(t)
	l, err := etcdlockgocron.NewLocker(cli, 100*time.Millisecond, etcdlockgocron.WithPrefix(lockName(t)+"/"),
		etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(2*time.Second)))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	lock, err := l.Lock(ctx, "job")
	require.NoError(t, err)
	s := etcdlockgocron.SessionOf(l)
	_, err = cli.Revoke(ctx, s.Lease())
	require.NoError(t, err)
	<-s.Done()
	require.ErrorIs(t, lock.Unlock(ctx), etcdlock.ErrSessionExpired)
	// Another job: "job" is kept by its minimum hold, which etcd times
	// after a lease ended.
	lock, err = l.Lock(ctx, "other")
	require.NoError(t, err)
	require.NotEqual(t, s, etcdlockgocron.SessionOf(l))
	require.NoError(t, lock.Unlock(ctx))
}

// TestLockerLockBounded: an attempt that etcd does not answer within the
// minimum hold fails with context.DeadlineExceeded, and the caller's ctx
// bounds it too.
func TestLockerLockBounded(t *testing.T) {
	const (
		minHold = 200 * time.Millisecond
		late    = 5 * minHold // how late etcd's answers come
	)
	px := etcdtest.NewProxy(t, cluster.Endpoint(0))
	l, err := etcdlockgocron.NewLocker(cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}}), minHold,
		etcdlockgocron.WithPrefix(lockName(t)+"/"), etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(5*time.Second)))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	lock, err := l.Lock(t.Context(), "job")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(t.Context()))

	px.DelayAnswers(late)
	began := time.Now()
	_, err = l.Lock(t.Context(), "other")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(began), late, "bounded by the minimum hold, not by etcd's answer")
	px.DelayAnswers(0)

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = l.Lock(ctx, "other")
	require.ErrorIs(t, err, context.Canceled)
}

// TestNewLockerOptions: invalid values are the constructor's errors.
func TestNewLockerOptions(t *testing.T) {
	cli := cluster.Client(t)
	for _, c := range []struct {
		name    string
		cli     bool
		minHold time.Duration
		opts    []etcdlockgocron.Option
		want    error
	}{
		{"nil client", false, time.Second, nil, etcdlock.ErrInvalidOption},
		{"no minimum hold", true, 0, nil, etcdlock.ErrInvalidOption},
		{"negative minimum hold", true, -time.Second, nil, etcdlock.ErrInvalidOption},
		{"an Elector's option", true, time.Second, []etcdlockgocron.Option{etcdlockgocron.YieldOnRequest()}, etcdlock.ErrInvalidOption},
		{"nil option", true, time.Second, []etcdlockgocron.Option{nil}, etcdlock.ErrInvalidOption},
		{"an Elector's delay", true, time.Second, []etcdlockgocron.Option{etcdlockgocron.WithTakeoverDelay(time.Second)}, etcdlock.ErrInvalidOption},
		{"reserved prefix", true, time.Second, []etcdlockgocron.Option{etcdlockgocron.WithPrefix("__etcdlock/")}, etcdlock.ErrInvalidName},
		{"a TTL too short", true, time.Second, []etcdlockgocron.Option{etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(time.Millisecond))}, etcdlock.ErrInvalidOption},
		{"a minimum hold too long", true, etcdlock.MaxLockDelay + time.Second, nil, etcdlock.ErrInvalidOption},
		{"a minimum hold too short", true, time.Microsecond, nil, etcdlock.ErrInvalidOption},
	} {
		t.Run(c.name, func(t *testing.T) {
			var given *clientv3.Client
			if c.cli {
				given = cli
			}
			l, err := etcdlockgocron.NewLocker(given, c.minHold, c.opts...)
			require.ErrorIs(t, err, c.want)
			require.Nil(t, l)
		})
	}

	// What the library checks only when it is used is Lock's error: a
	// job's name.
	for _, c := range []struct {
		name    string
		minHold time.Duration
		opts    []etcdlockgocron.Option
		job     string
		want    error
	}{
		{"a name too long", time.Second, nil, strings.Repeat("n", etcdlock.MaxNameLen), etcdlock.ErrInvalidName},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, err := etcdlockgocron.NewLocker(cli, c.minHold, c.opts...)
			require.NoError(t, err)
			t.Cleanup(func() { l.Close() })
			_, err = l.Lock(t.Context(), c.job)
			require.ErrorIs(t, err, c.want)
		})
	}
}

// TestLockBoundedWhenWriteLate: Lock waits for etcd at most d, even when
// the answer to its write (not its read) is late (issue 41: with d =
// 200ms and the answer 3 s late, Lock took 3.2 s). The key the write put
// is removed as soon as the answer comes, and another replica then takes
// the tick's lock.
func TestLockBoundedWhenWriteLate(t *testing.T) {
	in := &etcdtest.Injector{}
	cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	// d is long enough that Lock's read, before its write, is answered
	// within it even on a loaded machine; if not, the run says so.
	const d = time.Second
	l, err := etcdlockgocron.NewLocker(cli, d)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	other, err := etcdlockgocron.NewLocker(cluster.Client(t), d)
	require.NoError(t, err)
	t.Cleanup(func() { other.Close() })
	job := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), time.Now().UnixNano())

	applied, answer := make(chan struct{}), make(chan struct{})
	in.At(func(r etcdtest.RPC) bool {
		req, ok := r.Req.(*pb.TxnRequest)
		return ok && len(req.Success) > 0 && req.Success[0].GetRequestPut() != nil && strings.Contains(string(req.Success[0].GetRequestPut().Key), job)
	}, etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
		close(applied)
		<-answer
		return err
	}})
	res := make(chan error, 1)
	go func() {
		_, err := l.Lock(t.Context(), job)
		res <- err
	}()
	select {
	case <-applied:
	case err = <-res:
		// The read took d: no write was made, and none is left.
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Skip("Lock's read took longer than d, on this machine: its write was never sent")
	}
	select {
	case err = <-res:
	case <-time.After(20 * time.Second): // twenty times d: a bound for the failure only
		close(answer)
		<-res
		t.Fatal("Lock waited for its write's answer, past d")
	}
	require.ErrorIs(t, err, context.DeadlineExceeded)
	_, err = other.Lock(t.Context(), job)
	require.ErrorIs(t, err, etcdlock.ErrLocked, "the late write's key holds the lock until its answer comes")
	close(answer)
	require.Eventually(t, func() bool {
		lk, err := other.Lock(t.Context(), job)
		if err == nil {
			require.NoError(t, lk.Unlock(t.Context()))
		}
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the key went once the answer came")
}
