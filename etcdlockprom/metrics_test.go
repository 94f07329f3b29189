package etcdlockprom_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockprom"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// cluster is a one-member etcd started by TestMain.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return m.Run()
	}))
}

// TestExposition feeds one event of each sort, with fixed durations, and
// checks the exposition: names, help, labels, base units; and promlint.
func TestExposition(t *testing.T) {
	m := etcdlockprom.New(etcdlockprom.Options{
		AcquireBuckets: []float64{1}, HoldBuckets: []float64{10}, RenewalBuckets: []float64{0.1},
	})
	now := time.Unix(1_800_000_000, 0)
	etcdlockprom.SetNow(m, func() time.Time { return now })
	h := m.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindRWMutexRead, Name: "jobs/1", Mode: etcdlock.KeyMode{Shared: true}}
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Waited: 1500 * time.Millisecond, Outcome: etcdlock.Acquired, Token: 7, Key: "jobs/1/a"})
	now = now.Add(42 * time.Second)
	h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, Token: 7, Key: "jobs/1/a", Held: 3 * time.Second, End: etcdlock.LostKeyDeleted, Err: etcdlock.ErrLockLost})
	// Still held when scraped, 5s later: the oldest hold is 5s old.
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Waited: 1500 * time.Millisecond, Outcome: etcdlock.Acquired, Token: 9, Key: "jobs/1/b"})
	now = now.Add(5 * time.Second)
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: 50 * time.Millisecond, TTL: 15 * time.Second})
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: time.Second, Err: errors.New("unreachable")})
	h.SessionDone(etcdlock.SessionDoneInfo{Cause: etcdlock.SessionNotRenewed, Err: etcdlock.ErrSessionExpired})

	want := `
# HELP etcdlock_acquire_duration_seconds Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome.
# TYPE etcdlock_acquire_duration_seconds histogram
etcdlock_acquire_duration_seconds_bucket{kind="rwmutex_read",outcome="acquired",le="1"} 0
etcdlock_acquire_duration_seconds_bucket{kind="rwmutex_read",outcome="acquired",le="+Inf"} 2
etcdlock_acquire_duration_seconds_sum{kind="rwmutex_read",outcome="acquired"} 3
etcdlock_acquire_duration_seconds_count{kind="rwmutex_read",outcome="acquired"} 2
# HELP etcdlock_hold_duration_seconds How long holds lasted, by how they ended: released, or lost and why.
# TYPE etcdlock_hold_duration_seconds histogram
etcdlock_hold_duration_seconds_bucket{end="key_deleted",kind="rwmutex_read",le="10"} 1
etcdlock_hold_duration_seconds_bucket{end="key_deleted",kind="rwmutex_read",le="+Inf"} 1
etcdlock_hold_duration_seconds_sum{end="key_deleted",kind="rwmutex_read"} 3
etcdlock_hold_duration_seconds_count{end="key_deleted",kind="rwmutex_read"} 1
# HELP etcdlock_holders Holds of this process, not yet released or known lost; for elections, the elections it leads.
# TYPE etcdlock_holders gauge
etcdlock_holders{kind="election"} 0
etcdlock_holders{kind="multimutex"} 0
etcdlock_holders{kind="mutex"} 0
etcdlock_holders{kind="rwmutex_read"} 1
etcdlock_holders{kind="rwmutex_write"} 0
etcdlock_holders{kind="semaphore"} 0
etcdlock_holders{kind="shard"} 0
# HELP etcdlock_lease_renewal_duration_seconds Round trip of the session lease renewals that succeeded.
# TYPE etcdlock_lease_renewal_duration_seconds histogram
etcdlock_lease_renewal_duration_seconds_bucket{le="0.1"} 1
etcdlock_lease_renewal_duration_seconds_bucket{le="+Inf"} 1
etcdlock_lease_renewal_duration_seconds_sum 0.05
etcdlock_lease_renewal_duration_seconds_count 1
# HELP etcdlock_lease_renewal_failures_total Session lease renewals that failed.
# TYPE etcdlock_lease_renewal_failures_total counter
etcdlock_lease_renewal_failures_total 1
# HELP etcdlock_locks_lost_total Holds lost (ended without their release), by cause.
# TYPE etcdlock_locks_lost_total counter
` + lostSeries(map[string]int{"rwmutex_read/key_deleted": 1}) + `# HELP etcdlock_oldest_hold_age_seconds Age of the oldest hold of this process not yet ended: a hold that never ends shows here long before it does in etcdlock_hold_duration_seconds.
# TYPE etcdlock_oldest_hold_age_seconds gauge
etcdlock_oldest_hold_age_seconds{kind="election"} 0
etcdlock_oldest_hold_age_seconds{kind="multimutex"} 0
etcdlock_oldest_hold_age_seconds{kind="mutex"} 0
etcdlock_oldest_hold_age_seconds{kind="rwmutex_read"} 5
etcdlock_oldest_hold_age_seconds{kind="rwmutex_write"} 0
etcdlock_oldest_hold_age_seconds{kind="semaphore"} 0
etcdlock_oldest_hold_age_seconds{kind="shard"} 0
# HELP etcdlock_sessions_ended_total Sessions ended, by cause.
# TYPE etcdlock_sessions_ended_total counter
etcdlock_sessions_ended_total{cause="client_closed"} 0
etcdlock_sessions_ended_total{cause="closed"} 0
etcdlock_sessions_ended_total{cause="context_ended"} 0
etcdlock_sessions_ended_total{cause="lease_gone"} 0
etcdlock_sessions_ended_total{cause="not_renewed"} 1
# HELP etcdlock_waiters Acquisitions under way in this process.
# TYPE etcdlock_waiters gauge
etcdlock_waiters{kind="election"} 0
etcdlock_waiters{kind="multimutex"} 0
etcdlock_waiters{kind="mutex"} 0
etcdlock_waiters{kind="rwmutex_read"} 1
etcdlock_waiters{kind="rwmutex_write"} 0
etcdlock_waiters{kind="semaphore"} 0
etcdlock_waiters{kind="shard"} 0
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

// lostSeries returns the exposition lines of etcdlock_locks_lost_total, one
// per kind and cause, at the counts given by "kind/cause" (0 otherwise).
func lostSeries(counts map[string]int) string {
	var b strings.Builder
	for _, k := range []string{"election", "multimutex", "mutex", "rwmutex_read", "rwmutex_write", "semaphore", "shard"} {
		for _, c := range []string{"key_deleted", "lease_ended", "max_hold", "session_closed", "unknown"} {
			fmt.Fprintf(&b, "etcdlock_locks_lost_total{cause=%q,kind=%q} %d\n", c, k, counts[k+"/"+c])
		}
	}
	return b.String()
}

// TestZeroSeries: before any event, the gauges have a series per kind and
// the session counter one per cause, at zero, for every kind and cause the
// library has; the default buckets tell 2ms from 5ms.
func TestZeroSeries(t *testing.T) {
	m := etcdlockprom.New(etcdlockprom.Options{})
	var kinds, causes []string
	for i := range 64 {
		if k := etcdlock.Kind(i).String(); !strings.HasPrefix(k, "Kind(") {
			kinds = append(kinds, k)
		}
		if c := etcdlock.SessionEnd(i).String(); !strings.HasPrefix(c, "SessionEnd(") {
			causes = append(causes, c)
		}
	}
	if len(kinds) != 7 || len(causes) != 5 {
		t.Fatalf("kinds %v, causes %v: check the lists of etcdlockprom", kinds, causes)
	}
	if n := testutil.CollectAndCount(m, "etcdlock_waiters", "etcdlock_holders"); n != 2*len(kinds) {
		t.Errorf("%d gauge series before any event, want %d", n, 2*len(kinds))
	}
	if n := testutil.CollectAndCount(m, "etcdlock_sessions_ended_total"); n != len(causes) {
		t.Errorf("%d sessions_ended_total series, want %d (%v)", n, len(causes), causes)
	}
	h := m.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindMutex, Name: "a"}
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Waited: 3 * time.Millisecond, Outcome: etcdlock.Acquired})
	want := `
# HELP etcdlock_acquire_duration_seconds Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome.
# TYPE etcdlock_acquire_duration_seconds histogram
`
	var b strings.Builder
	for _, le := range []string{"0.001", "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256", "0.512", "1.024",
		"2.048", "4.096", "8.192", "16.384", "32.768", "65.536", "131.072", "262.144", "524.288", "1048.576", "2097.152", "+Inf"} {
		n := 1
		if le == "0.001" || le == "0.002" {
			n = 0 // 3ms: above 2ms (buckets 1ms, 4ms, ... put it with 1.1ms)
		}
		fmt.Fprintf(&b, "etcdlock_acquire_duration_seconds_bucket{kind=\"mutex\",outcome=\"acquired\",le=%q} %d\n", le, n)
	}
	want += b.String() + `etcdlock_acquire_duration_seconds_sum{kind="mutex",outcome="acquired"} 0.003
etcdlock_acquire_duration_seconds_count{kind="mutex",outcome="acquired"} 1
`
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "etcdlock_acquire_duration_seconds"); err != nil {
		t.Fatal(err)
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
			// Every kind's series, from the start.
			want += `etcdlock_waiters{kind="election"} 0
etcdlock_waiters{kind="multimutex"} 0
etcdlock_waiters{kind="mutex"} 1
etcdlock_waiters{kind="rwmutex_read"} 0
etcdlock_waiters{kind="rwmutex_write"} 0
etcdlock_waiters{kind="semaphore"} 0
etcdlock_waiters{kind="shard"} 0
`
		}
		if err := testutil.CollectAndCompare(m, strings.NewReader(want), "etcdlock_waiters"); err != nil {
			t.Errorf("LockNames %v: %v", names, err)
		}
	}
}

// TestNameSeriesDeleted: with names, a gauge's series goes when its name
// has no waiters (holders) left, so that names used once do not stay in
// the registry for good; without names, the series of a kind stay, at 0.
// The histograms keep their series.
func TestNameSeriesDeleted(t *testing.T) {
	lock := etcdlock.LockInfo{Kind: etcdlock.KindMutex, Name: "jobs/1"}
	for _, names := range []bool{false, true} {
		m := etcdlockprom.New(etcdlockprom.Options{LockNames: names})
		h := m.Hooks()
		h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
		h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
		h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.Acquired})
		series := 2 // the name's waiters and holders
		if !names {
			series = 14 // waiters and holders of each of 7 kinds
		}
		if got := testutil.CollectAndCount(m, "etcdlock_waiters", "etcdlock_holders"); got != series {
			t.Fatalf("LockNames %v: %d gauge series with a waiter and a holder, want %d", names, got, series)
		}
		h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.AcquireCanceled})
		h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, End: etcdlock.Released})
		want := 14 // waiters and holders of each kind, at 0
		if names {
			want = 0
		}
		if got := testutil.CollectAndCount(m, "etcdlock_waiters", "etcdlock_holders"); got != want {
			t.Errorf("LockNames %v: %d gauge series once the name is idle, want %d", names, got, want)
		}
		// acquired and canceled; released
		if got := testutil.CollectAndCount(m, "etcdlock_acquire_duration_seconds", "etcdlock_hold_duration_seconds"); got != 3 {
			t.Errorf("LockNames %v: %d histogram series, want 3", names, got)
		}
	}
}

// TestNameSeriesConcurrent: events of one name from many goroutines, each
// series deleted and made again many times over, lose no change: the
// gauges end at what is still waiting and held.
func TestNameSeriesConcurrent(t *testing.T) {
	m := etcdlockprom.New(etcdlockprom.Options{LockNames: true})
	h := m.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindSemaphore, Name: "jobs/1"}
	const goroutines, rounds = 8, 2000
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
				h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.Acquired})
				h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, End: etcdlock.Released})
			}
			// One hold, and one waiter, left.
			h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
			h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.Acquired})
			h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
		}()
	}
	// Scrapes meanwhile see each series or none, never a negative value.
	stop := make(chan struct{})
	scraped := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				scraped <- nil
				return
			default:
			}
			mfs, err := gatherer(m).Gather()
			if err != nil {
				scraped <- err
				return
			}
			for _, mf := range mfs {
				for _, s := range mf.GetMetric() {
					if s.Gauge != nil && s.GetGauge().GetValue() < 0 {
						scraped <- fmt.Errorf("%s = %v", mf.GetName(), s.GetGauge().GetValue())
						return
					}
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	must(t, <-scraped)
	want := fmt.Sprintf(`
# HELP etcdlock_holders Holds of this process, not yet released or known lost; for elections, the elections it leads.
# TYPE etcdlock_holders gauge
etcdlock_holders{kind="semaphore",name="jobs/1"} %d
# HELP etcdlock_waiters Acquisitions under way in this process.
# TYPE etcdlock_waiters gauge
etcdlock_waiters{kind="semaphore",name="jobs/1"} %d
`, goroutines, goroutines)
	if err := testutil.CollectAndCompare(m, strings.NewReader(want), "etcdlock_holders", "etcdlock_waiters"); err != nil {
		t.Fatal(err)
	}
}

// gatherer returns a registry with only c.
func gatherer(c prometheus.Collector) prometheus.Gatherer {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	return reg
}

// TestLeadReleased: a term of Lead that ends normally counts as a
// release, not a loss, and its gauges' series go with it.
func TestLeadReleased(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := etcdlockprom.New(etcdlockprom.Options{LockNames: true})
	reg.MustRegister(m)
	cli := cluster.Client(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, name := range []string{"lead/returns", "lead/canceled"} {
		err := etcdlock.Lead(ctx, cli, name, "me", func(fctx context.Context) error {
			want(t, reg, "etcdlock_holders", 1, "kind", "election", "name", name)
			if name == "lead/canceled" {
				cancel()
				<-fctx.Done()
			}
			return nil
		}, etcdlock.WithSessionOptions(etcdlock.WithHooks(m.Hooks())))
		if name == "lead/canceled" && !errors.Is(err, context.Canceled) || name == "lead/returns" && err != nil {
			t.Fatalf("Lead %s: %v", name, err)
		}
		want(t, reg, "etcdlock_hold_duration_seconds", 1, "end", "released", "kind", "election", "name", name)
	}
	// No loss: one series of hold_duration per name, both released.
	if got := testutil.CollectAndCount(m, "etcdlock_hold_duration_seconds"); got != 2 {
		t.Errorf("%d series of etcdlock_hold_duration_seconds, want 2 (released)", got)
	}
	if got := testutil.CollectAndCount(m, "etcdlock_holders", "etcdlock_waiters"); got != 0 {
		t.Errorf("%d gauge series after Lead returned, want 0", got)
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
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithTTL(3*time.Second), etcdlock.WithHooks(m.Hooks()),
		etcdlock.WithHooks(etcdlock.Hooks{
			RenewDone: func(etcdlock.RenewDoneInfo) { signal(renewed) },
			HoldDone:  func(etcdlock.HoldDoneInfo) { signal(holdDone) },
		}))
	must(t, err)
	defer s.Close()
	other, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(m.Hooks()))
	must(t, err)
	defer other.Close()

	a := etcdlock.NewMutex(s, "a")
	must(t, a.Lock(ctx))
	want(t, reg, "etcdlock_holders", 1, "kind", "mutex", "name", "a")
	none(t, reg, "etcdlock_waiters", "kind", "mutex", "name", "a")
	if err := etcdlock.NewMutex(other, "a").TryLock(ctx); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("TryLock: %v", err)
	}
	must(t, a.Unlock(ctx))
	<-holdDone // reported before Unlock returned
	none(t, reg, "etcdlock_holders", "kind", "mutex", "name", "a")
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
	case <-time.After(10 * time.Second):
		t.Fatal("leadership not lost 10s after its key was deleted")
	}
	none(t, reg, "etcdlock_holders", "kind", "election", "name", "leader")
	want(t, reg, "etcdlock_hold_duration_seconds", 1, "end", "key_deleted", "kind", "election", "name", "leader")
	if err := e.Resign(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Resign: %v", err)
	}

	// A renewal (TTL 3s: every second), then the session's end. (At a
	// TTL of 1s a stall of the test process of about 600ms ended the
	// session before Close, and the cause was "not_renewed".)
	select {
	case <-renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal in 10s")
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

// none asserts there is no series of family name with labels (see
// sample): with names, a gauge's series is deleted at 0.
func none(t *testing.T, g prometheus.Gatherer, name string, labels ...string) {
	t.Helper()
	if v, ok := find(t, g, name, labels...); ok {
		t.Fatalf("%s%v = %v, want no series", name, labels, v)
	}
}

// sample returns the value of the series of family name with exactly
// labels (name, value pairs): a gauge's or counter's value, a histogram's
// count. It fails the test if there is no such series.
func sample(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := find(t, g, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// find is sample, reporting whether there is such a series.
func find(t *testing.T, g prometheus.Gatherer, name string, labels ...string) (float64, bool) {
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
				return s.GetGauge().GetValue(), true
			case s.Counter != nil:
				return s.GetCounter().GetValue(), true
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}

// BenchmarkUncontended measures Lock then Unlock of an uncontended Mutex
// on a one-member etcd, without hooks ("unset") and with the metrics
// attached ("prometheus"). Run each alone, alternating, and compare the
// medians (see docs/performance.md, "Hooks and metrics"):
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
			s, err := etcdlock.NewSession(b.Context(), cluster.Client(b), c.opts...)
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

// TestOldestHoldAndLosses (issue 40): on a real etcd, a hold that lasts
// shows in etcdlock_oldest_hold_age_seconds while it lasts; evicted by an
// operator, it counts in etcdlock_locks_lost_total as key_deleted, and the
// age goes back to 0. With LockNames the age's series is the name's, and
// goes with its last hold.
func TestOldestHoldAndLosses(t *testing.T) {
	for _, names := range []bool{false, true} {
		t.Run(fmt.Sprintf("names=%v", names), func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := etcdlockprom.New(etcdlockprom.Options{LockNames: names})
			reg.MustRegister(m)
			now := time.Now()
			etcdlockprom.SetNow(m, func() time.Time { return now })
			cli := cluster.Client(t)
			s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithHooks(m.Hooks()))
			must(t, err)
			defer s.Close()
			name := "oldest/" + t.Name()
			labels := []string{"kind", "mutex"}
			if names {
				labels = append(labels, "name", name)
			}
			mu := etcdlock.NewMutex(s, name)
			must(t, mu.Lock(t.Context()))
			now = now.Add(90 * time.Second)
			want(t, reg, "etcdlock_oldest_hold_age_seconds", 90, labels...)

			must(t, etcdlock.Evict(t.Context(), cli, name, mu.Key(), mu.Token()))
			// Unlock finds the loss, and reports it before it returns.
			if !errors.Is(mu.Unlock(t.Context()), etcdlock.ErrLockLost) {
				t.Fatal("Unlock of the evicted hold: want ErrLockLost")
			}
			// Gather sorts labels by name, and so must the pairs.
			want(t, reg, "etcdlock_locks_lost_total", 1, append([]string{"cause", "key_deleted"}, labels...)...)
			if names {
				none(t, reg, "etcdlock_oldest_hold_age_seconds", labels...)
			} else {
				want(t, reg, "etcdlock_oldest_hold_age_seconds", 0, labels...)
			}
		})
	}
}
