package etcdlockgocron_test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// electorReplica is one replica of a test: a scheduler whose Elector
// reaches etcd through a proxy of its own.
type electorReplica struct {
	px  *etcdtest.Proxy
	cli *clientv3.Client
	e   *etcdlockgocron.Elector
	s   gocron.Scheduler
}

// startElectors starts a replica on each clock, campaigning in the
// election name with its index as value, each running a job every second
// that records into runs.
func startElectors(t *testing.T, name string, runs *runLog, clocks []skewedClock, opts ...etcdlockgocron.Option) []*electorReplica {
	t.Helper()
	var reps []*electorReplica
	for i, c := range clocks {
		px := etcdtest.NewProxy(t, cluster.Endpoint(0))
		cli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
		e, err := etcdlockgocron.NewElector(cli, name, strconv.Itoa(i), opts...)
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, e.Close()) }) // after the scheduler's Shutdown
		s := newScheduler(t, c, gocron.WithDistributedElector(e))
		_, err = s.NewJob(everySecond, runs.task(i, c), gocron.WithName("report"))
		require.NoError(t, err)
		reps = append(reps, &electorReplica{px: px, cli: cli, e: e, s: s})
	}
	for _, r := range reps {
		r.s.Start()
	}
	return reps
}

// waitLeader waits up to d for one of the replicas other than those in
// not to lead, and returns it. IsLeader needs no RPC: it is polled.
func waitLeader(t *testing.T, reps []*electorReplica, d time.Duration, not ...int) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for i, r := range reps {
			if !slices.Contains(not, i) && r.e.IsLeader(t.Context()) == nil {
				return i
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no replica but %v leads within %v", not, d)
	return -1
}

// phase is a stretch of a test during which one replica leads.
type phase struct {
	leader   int
	from, to time.Time // when it was seen leading; when the test killed it
}

// TestElectorFailover runs a job every second on three replicas whose
// clocks disagree by up to 600ms, each a gocron scheduler with an
// Elector on a client of its own (through a proxy), sessions of TTL 2s,
// and the default takeover delay, 1s. The leader is cut off from etcd:
// it stops running the job before the next replica wins the election,
// at most about a TTL later, which runs ticks a second after that; then
// the new leader's client is closed, as when its process dies, and the
// last one takes over. Every tick runs at most once, even as the
// leadership moves between replicas whose clocks fire the same tick
// 600ms apart, and exactly once while a leader leads.
func TestElectorFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire, about 20s")
	}
	const ttl = 2 * time.Second
	name := lockName(t)
	clocks := []skewedClock{newSkewedClock(300 * time.Millisecond), newSkewedClock(0), newSkewedClock(-300 * time.Millisecond)}
	runs := newRunLog()
	reps := startElectors(t, name, runs, clocks, etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(ttl)))
	won := observeWins(t, name)

	// leadFor waits for the ticks under leader i: up to the fifth second
	// after it was seen leading.
	leadFor := func(i int) phase {
		p := phase{leader: i, from: time.Now()}
		runs.waitTick(t, p.from.Truncate(time.Second).Add(5*time.Second), 15*time.Second)
		return p
	}
	// takeover waits for a replica but those in not to lead, after the
	// leader was killed at killed, and reports when it won and led.
	takeover := func(how string, killed time.Time, not ...int) int {
		t.Helper()
		next := waitLeader(t, reps, ttl+10*time.Second, not...)
		led := time.Since(killed)
		for _, prev := range not {
			require.Error(t, reps[prev].e.IsLeader(t.Context()), "replica %d leads after %d took over", prev, next)
		}
		w := won(next)
		t.Logf("%s: replica %d won the election %v after replica %d was killed, and led %v after (TTL %v)",
			how, next, w.Sub(killed).Round(time.Millisecond), not[len(not)-1], led.Round(time.Millisecond), ttl)
		require.Less(t, w.Sub(killed), ttl+2*time.Second, "won within about a TTL")
		return next
	}

	var phases []phase
	first := waitLeader(t, reps, 10*time.Second)
	phases = append(phases, leadFor(first))

	// A partition: the leader stays up, firing its ticks, but cannot
	// reach etcd.
	reps[first].px.Cut()
	phases[0].to = time.Now()
	second := takeover("partition", phases[0].to, first)
	phases = append(phases, leadFor(second))

	// A crash: the leader's client closes under it; its lease, not
	// revoked, runs out.
	require.NoError(t, reps[second].cli.Close())
	phases[1].to = time.Now()
	third := takeover("crash", phases[1].to, first, second)
	phases = append(phases, leadFor(third))
	phases[2].to = time.Now()
	for _, r := range reps {
		require.NoError(t, r.s.Shutdown())
	}

	got := runs.snapshot()
	for _, tick := range slices.SortedFunc(maps.Keys(got), time.Time.Compare) {
		require.Len(t, got[tick], 1, "tick %v ran on replicas %v", tick.Format(time.TimeOnly), got[tick])
	}
	// While a leader led, from a second after it was seen leading to a
	// second before it was killed (every replica fires a tick within
	// 300ms of true time), each tick ran, on it.
	for _, p := range phases {
		n := 0
		for tick := p.from.Truncate(time.Second).Add(2 * time.Second); tick.Before(p.to.Add(-time.Second)); tick = tick.Add(time.Second) {
			require.Equal(t, []int{p.leader}, got[tick], "tick %v, while replica %d led", tick.Format(time.TimeOnly), p.leader)
			n++
		}
		require.GreaterOrEqual(t, n, 2, "phase %+v", p)
	}
}

// observeWins follows the election name until the end of the test, and
// returns a function that tells when replica i was first seen as its
// leader.
func observeWins(t *testing.T, name string) func(i int) time.Time {
	t.Helper()
	cli := cluster.Client(t)
	var mu sync.Mutex
	wins := map[string]time.Time{} // guarded by mu
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for l, err := range etcdlock.ObserveLeader(ctx, cli, name) {
			if err != nil {
				return
			}
			mu.Lock()
			if _, ok := wins[string(l.Value)]; !ok && l.Key != "" {
				wins[string(l.Value)] = time.Now()
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return func(i int) time.Time {
		mu.Lock()
		defer mu.Unlock()
		w, ok := wins[strconv.Itoa(i)]
		require.True(t, ok, "replica %d leads, but was never seen winning", i)
		return w
	}
}

// TestElectorCloseHandsOver: a leader's Close resigns, and the next
// replica leads at once, not a TTL later.
func TestElectorCloseHandsOver(t *testing.T) {
	const ttl = 10 * time.Second
	clocks := []skewedClock{newSkewedClock(0), newSkewedClock(0)}
	reps := startElectors(t, lockName(t), newRunLog(), clocks, etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(ttl)))
	first := waitLeader(t, reps, 10*time.Second)
	term, ok := reps[first].e.Term()
	require.True(t, ok)
	require.Positive(t, term.Token)
	_, ok = reps[1-first].e.Term()
	require.False(t, ok, "the other replica's Term")

	require.NoError(t, reps[first].s.Shutdown())
	closed := time.Now()
	require.NoError(t, reps[first].e.Close())
	require.ErrorIs(t, reps[first].e.IsLeader(t.Context()), etcdlock.ErrNotLeader)
	waitLeader(t, reps, ttl/2, first)
	t.Logf("replica %d leads %v after the leader's Close (TTL %v)", 1-first, time.Since(closed).Round(time.Millisecond), ttl)
	next, ok := reps[1-first].e.Term()
	require.True(t, ok)
	require.Greater(t, next.Token, term.Token)
}

// TestElectorYieldOnRequest: with YieldOnRequest, a request to release
// the election (a deploy) moves the leadership to the next replica.
func TestElectorYieldOnRequest(t *testing.T) {
	const ttl = 10 * time.Second
	name := lockName(t)
	clocks := []skewedClock{newSkewedClock(0), newSkewedClock(0)}
	reps := startElectors(t, name, newRunLog(), clocks, etcdlockgocron.YieldOnRequest(),
		etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(ttl)))
	first := waitLeader(t, reps, 10*time.Second)
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cluster.Client(t), name))
	waitLeader(t, reps, ttl/2, first)
}

// TestElectorEnded: when the campaign gives up (its client was closed, a
// value or a session option Lead refuses), IsLeader says why.
func TestElectorEnded(t *testing.T) {
	closed, err := cluster.NewClient(clientv3.Config{})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	for _, c := range []struct {
		name, value string
		cli         *clientv3.Client
		opts        []etcdlockgocron.Option
		want        error
	}{
		{"closed client", "v", closed, nil, etcdlock.ErrNotLeader},
		{"reserved value", "etcdlock/1 x", cluster.Client(t), nil, etcdlock.ErrInvalidValue},
		{"a lease of its own", "v", cluster.Client(t), []etcdlockgocron.Option{etcdlockgocron.WithSessionOptions(etcdlock.WithLease(1))}, etcdlock.ErrInvalidOption},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := etcdlockgocron.NewElector(c.cli, lockName(t), c.value, c.opts...)
			require.NoError(t, err)
			t.Cleanup(func() { e.Close() })
			require.Eventually(t, func() bool {
				return strings.Contains(e.IsLeader(t.Context()).Error(), "campaign ended")
			}, 10*time.Second, 10*time.Millisecond)
			err = e.IsLeader(t.Context())
			require.ErrorIs(t, err, etcdlock.ErrNotLeader)
			require.ErrorIs(t, err, c.want)
			t.Log(err)
		})
	}
}

// TestNewElectorOptions: invalid values are the constructor's errors.
func TestNewElectorOptions(t *testing.T) {
	cli := cluster.Client(t)
	for _, c := range []struct {
		name, election, value string
		cli                   *clientv3.Client
		opts                  []etcdlockgocron.Option
		want                  error
	}{
		{"nil client", "e", "v", nil, nil, etcdlock.ErrInvalidOption},
		{"a Locker's option", "e", "v", cli, []etcdlockgocron.Option{etcdlockgocron.WithPrefix("x/")}, etcdlock.ErrInvalidOption},
		{"negative takeover delay", "e", "v", cli, []etcdlockgocron.Option{etcdlockgocron.WithTakeoverDelay(-time.Second)}, etcdlock.ErrInvalidOption},
		{"a TTL too short", "e", "v", cli, []etcdlockgocron.Option{etcdlockgocron.WithSessionOptions(etcdlock.WithTTL(time.Millisecond))}, etcdlock.ErrInvalidOption},
		{"empty name", "", "v", cli, nil, etcdlock.ErrInvalidName},
		{"reserved name", "__etcdlock", "v", cli, nil, etcdlock.ErrInvalidName},
		{"name under the reserved one", "__etcdlock/e", "v", cli, nil, etcdlock.ErrInvalidName},
		{"long name", strings.Repeat("n", etcdlock.MaxNameLen+1), "v", cli, nil, etcdlock.ErrInvalidName},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, err := etcdlockgocron.NewElector(c.cli, c.election, c.value, c.opts...)
			require.ErrorIs(t, err, c.want)
			require.Nil(t, e)
		})
	}
}
