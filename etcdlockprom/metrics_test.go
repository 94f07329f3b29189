package etcdlockprom_test

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockprom"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// cluster is a one-member etcd started by TestMain.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := etcdtest.MkdirTemp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cluster, err = etcdtest.StartDir(dir, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	cluster.Close()
	if code != 0 {
		return code
	}
	// Every session's goroutines must have ended with it.
	if err := leakcheck.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// TestExposition feeds one event of each sort, with fixed durations, and
// checks the exposition: names, help, labels, base units; and promlint.
func TestExposition(t *testing.T) {
	m := etcdlockprom.New(etcdlockprom.Options{
		AcquireBuckets: []float64{1}, HoldBuckets: []float64{10}, RenewalBuckets: []float64{0.1},
	})
	h := m.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindRWMutexRead, Name: "jobs/1", Mode: etcdlock.KeyMode{Shared: true}}
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Waited: 1500 * time.Millisecond, Outcome: etcdlock.Acquired, Token: 7})
	h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, Token: 7, Held: 3 * time.Second, End: etcdlock.LostKeyDeleted, Err: etcdlock.ErrLockLost})
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: 50 * time.Millisecond, TTL: 15 * time.Second})
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: time.Second, Err: errors.New("unreachable")})
	h.SessionDone(etcdlock.SessionDoneInfo{Cause: etcdlock.SessionNotRenewed, Err: etcdlock.ErrSessionExpired})

	want := `
# HELP etcdlock_acquire_duration_seconds Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome.
# TYPE etcdlock_acquire_duration_seconds histogram
etcdlock_acquire_duration_seconds_bucket{kind="rwmutex_read",outcome="acquired",le="1"} 0
etcdlock_acquire_duration_seconds_bucket{kind="rwmutex_read",outcome="acquired",le="+Inf"} 1
etcdlock_acquire_duration_seconds_sum{kind="rwmutex_read",outcome="acquired"} 1.5
etcdlock_acquire_duration_seconds_count{kind="rwmutex_read",outcome="acquired"} 1
# HELP etcdlock_hold_duration_seconds How long holds lasted, by how they ended: released, or lost and why.
# TYPE etcdlock_hold_duration_seconds histogram
etcdlock_hold_duration_seconds_bucket{end="key_deleted",kind="rwmutex_read",le="10"} 1
etcdlock_hold_duration_seconds_bucket{end="key_deleted",kind="rwmutex_read",le="+Inf"} 1
etcdlock_hold_duration_seconds_sum{end="key_deleted",kind="rwmutex_read"} 3
etcdlock_hold_duration_seconds_count{end="key_deleted",kind="rwmutex_read"} 1
# HELP etcdlock_holders Holds of this process, not yet released or known lost; for elections, the elections it leads.
# TYPE etcdlock_holders gauge
etcdlock_holders{kind="rwmutex_read"} 0
# HELP etcdlock_lease_renewal_duration_seconds Round trip of the session lease renewals that succeeded.
# TYPE etcdlock_lease_renewal_duration_seconds histogram
etcdlock_lease_renewal_duration_seconds_bucket{le="0.1"} 1
etcdlock_lease_renewal_duration_seconds_bucket{le="+Inf"} 1
etcdlock_lease_renewal_duration_seconds_sum 0.05
etcdlock_lease_renewal_duration_seconds_count 1
# HELP etcdlock_lease_renewal_failures_total Session lease renewals that failed.
# TYPE etcdlock_lease_renewal_failures_total counter
etcdlock_lease_renewal_failures_total 1
# HELP etcdlock_sessions_ended_total Sessions ended, by cause.
# TYPE etcdlock_sessions_ended_total counter
etcdlock_sessions_ended_total{cause="not_renewed"} 1
# HELP etcdlock_waiters Acquisitions under way in this process.
# TYPE etcdlock_waiters gauge
etcdlock_waiters{kind="rwmutex_read"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestLockNames: names are a label only when asked for.
func TestLockNames(t *testing.T) {
	for _, names := range []bool{false, true} {
		m := etcdlockprom.New(etcdlockprom.Options{LockNames: names})
		lock := etcdlock.LockInfo{Kind: etcdlock.KindMutex, Name: "jobs/1"}
		m.Hooks().AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock})
		want := "\n# HELP etcdlock_waiters Acquisitions under way in this process.\n# TYPE etcdlock_waiters gauge\n"
		if names {
			want += `etcdlock_waiters{kind="mutex",name="jobs/1"} 1` + "\n"
		} else {
			want += `etcdlock_waiters{kind="mutex"} 1` + "\n"
		}
		if err := testutil.CollectAndCompare(m, strings.NewReader(want), "etcdlock_waiters"); err != nil {
			t.Errorf("LockNames %v: %v", names, err)
		}
	}
}

// TestSessions wires the metrics to real sessions on etcd: acquisitions,
// a busy TryLock, a lost hold, an election won and lost, renewals and the
// sessions' ends show in the gauges and counts.
func TestSessions(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := etcdlockprom.New(etcdlockprom.Options{LockNames: true})
	reg.MustRegister(m)
	cli := cluster.Client(t)
	ctx := t.Context()
	// After m's hooks, these tell the test that m has seen the event.
	renewed, holdDone := make(chan struct{}, 1), make(chan struct{}, 1)
	signal := func(c chan struct{}) {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	s, err := etcdlock.NewSession(cli, etcdlock.WithTTL(time.Second), etcdlock.WithHooks(m.Hooks()),
		etcdlock.WithHooks(etcdlock.Hooks{
			RenewDone: func(etcdlock.RenewDoneInfo) { signal(renewed) },
			HoldDone:  func(etcdlock.HoldDoneInfo) { signal(holdDone) },
		}))
	must(t, err)
	defer s.Close()
	other, err := etcdlock.NewSession(cli, etcdlock.WithHooks(m.Hooks()))
	must(t, err)
	defer other.Close()

	a := etcdlock.NewMutex(s, "a")
	must(t, a.Lock(ctx))
	want(t, reg, "etcdlock_holders", 1, "kind", "mutex", "name", "a")
	want(t, reg, "etcdlock_waiters", 0, "kind", "mutex", "name", "a")
	if err := etcdlock.NewMutex(other, "a").TryLock(ctx); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("TryLock: %v", err)
	}
	must(t, a.Unlock(ctx))
	<-holdDone // reported before Unlock returned
	want(t, reg, "etcdlock_holders", 0, "kind", "mutex", "name", "a")
	want(t, reg, "etcdlock_acquire_duration_seconds", 1, "kind", "mutex", "name", "a", "outcome", "acquired")
	want(t, reg, "etcdlock_acquire_duration_seconds", 1, "kind", "mutex", "name", "a", "outcome", "busy")
	want(t, reg, "etcdlock_hold_duration_seconds", 1, "end", "released", "kind", "mutex", "name", "a")

	// An election won, then lost: its key deleted.
	e := etcdlock.NewElection(s, "leader")
	must(t, e.Campaign(ctx, "me"))
	want(t, reg, "etcdlock_holders", 1, "kind", "election", "name", "leader")
	e.Done() // the loss watch reports the loss
	_, err = cli.Delete(ctx, e.Key())
	must(t, err)
	select {
	case <-holdDone:
	case <-time.After(5 * time.Second):
		t.Fatal("leadership not lost 5s after its key was deleted")
	}
	want(t, reg, "etcdlock_holders", 0, "kind", "election", "name", "leader")
	want(t, reg, "etcdlock_hold_duration_seconds", 1, "end", "key_deleted", "kind", "election", "name", "leader")
	if err := e.Resign(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Resign: %v", err)
	}

	// A renewal (TTL 1s: every 333ms), then the session's end.
	select {
	case <-renewed:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal in 5s")
	}
	if got := sample(t, reg, "etcdlock_lease_renewal_duration_seconds"); got < 1 {
		t.Fatalf("%v renewals counted, want at least 1", got)
	}
	must(t, s.Close())
	want(t, reg, "etcdlock_sessions_ended_total", 1, "cause", "closed")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// want asserts the series of family name with labels (name, value pairs)
// has value v (see sample).
func want(t *testing.T, g prometheus.Gatherer, name string, v float64, labels ...string) {
	t.Helper()
	if got := sample(t, g, name, labels...); got != v {
		t.Fatalf("%s%v = %v, want %v", name, labels, got, v)
	}
}

// sample returns the value of the series of family name with exactly
// labels (name, value pairs): a gauge's or counter's value, a histogram's
// count. It fails the test if there is no such series.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	must(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			if len(s.GetLabel())*2 != len(labels) {
				continue
			}
			for i, l := range s.GetLabel() {
				// Gather sorts labels by name; so are the tests' pairs.
				if l.GetName() != labels[2*i] || l.GetValue() != labels[2*i+1] {
					continue series
				}
			}
			switch {
			case s.Gauge != nil:
				return s.GetGauge().GetValue()
			case s.Counter != nil:
				return s.GetCounter().GetValue()
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// BenchmarkUncontended measures Lock then Unlock of an uncontended Mutex
// on a one-member etcd, without hooks ("unset") and with the metrics
// attached ("prometheus"). Run each alone, alternating, and compare the
// medians (see the README's Metrics and logs):
//
//	go test -run '^$' -bench 'BenchmarkUncontended/prometheus' -benchmem .
func BenchmarkUncontended(b *testing.B) {
	m := etcdlockprom.New(etcdlockprom.Options{})
	prometheus.NewRegistry().MustRegister(m)
	for _, c := range []struct {
		name string
		opts []etcdlock.SessionOption
	}{
		{"unset", nil},
		{"prometheus", []etcdlock.SessionOption{etcdlock.WithHooks(m.Hooks())}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := etcdlock.NewSession(cluster.Client(b), c.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			mu := etcdlock.NewMutex(s, "bench/"+c.name)
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if err := mu.Lock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := mu.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
