package etcdlockotel_test

import (
	"errors"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockotel"
)

// The Prometheus adapter's help texts: the descriptions must be the same.
var descriptions = map[string]string{
	"etcdlock_acquire_duration_seconds":       "Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome.",
	"etcdlock_waiters":                        "Acquisitions under way in this process.",
	"etcdlock_holders":                        "Holds of this process, not yet released or known lost; for elections, the elections it leads.",
	"etcdlock_hold_duration_seconds":          "How long holds lasted, by how they ended: released, or lost and why.",
	"etcdlock_lease_renewal_duration_seconds": "Round trip of the session lease renewals that succeeded.",
	"etcdlock_lease_renewal_failures_total":   "Session lease renewals that failed.",
	"etcdlock_sessions_ended_total":           "Sessions ended, by cause.",
	"etcdlock_locks_lost_total":               "Holds lost (ended without their release), by cause.",
	"etcdlock_oldest_hold_age_seconds":        "Age of the oldest hold of this process not yet ended: a hold that never ends shows here long before it does in etcdlock_hold_duration_seconds.",
}

// zeroLosses is etcdlock_locks_lost_total before any loss: a series per
// kind and cause, at 0.
func zeroLosses() map[string]int64 {
	out := map[string]int64{}
	for _, k := range []string{"election", "multimutex", "mutex", "rwmutex_read", "rwmutex_write", "semaphore", "shard"} {
		for _, c := range []string{"key_deleted", "lease_ended", "max_hold", "session_closed", "unknown"} {
			out["cause="+c+",kind="+k] = 0
		}
	}
	return out
}

// TestMetrics feeds one event of each sort, with fixed durations, and
// checks what a reader collects: names, descriptions, units, attributes,
// values, bucket boundaries; and, before any event, the series at zero.
func TestMetrics(t *testing.T) {
	r := newRig(t, false)
	now := time.Unix(1_800_000_000, 0)
	etcdlockotel.SetNow(r.tel, func() time.Time { return now })

	// Before any event: the up-down counters have a series per kind, the
	// session counter one per cause, the failure counter one, all at 0;
	// the histograms none.
	ms := r.collect(t)
	zeroKinds := map[string]int64{"kind=election": 0, "kind=multimutex": 0, "kind=mutex": 0,
		"kind=rwmutex_read": 0, "kind=rwmutex_write": 0, "kind=semaphore": 0, "kind=shard": 0}
	for _, g := range []string{"etcdlock_waiters", "etcdlock_holders"} {
		if got := counts(t, ms, g, false); !maps.Equal(got, zeroKinds) {
			t.Errorf("%s before any event: %v, want %v", g, got, zeroKinds)
		}
	}
	zeroCauses := map[string]int64{"cause=client_closed": 0, "cause=closed": 0, "cause=context_ended": 0,
		"cause=lease_gone": 0, "cause=not_renewed": 0}
	if got := counts(t, ms, "etcdlock_sessions_ended_total", true); !maps.Equal(got, zeroCauses) {
		t.Errorf("etcdlock_sessions_ended_total before any event: %v, want %v", got, zeroCauses)
	}
	if got := counts(t, ms, "etcdlock_lease_renewal_failures_total", true); !maps.Equal(got, map[string]int64{"": 0}) {
		t.Errorf("etcdlock_lease_renewal_failures_total before any event: %v, want one series at 0", got)
	}
	if got := counts(t, ms, "etcdlock_locks_lost_total", true); !maps.Equal(got, zeroLosses()) {
		t.Errorf("etcdlock_locks_lost_total before any event: %v, want %v", got, zeroLosses())
	}
	zeroAges := map[string]float64{}
	for k := range zeroKinds {
		zeroAges[k] = 0
	}
	if got := gauge(t, ms, "etcdlock_oldest_hold_age_seconds"); !maps.Equal(got, zeroAges) {
		t.Errorf("etcdlock_oldest_hold_age_seconds before any event: %v, want %v", got, zeroAges)
	}
	if n := len(ms); n != 6 {
		t.Errorf("%d metrics before any event, want 6 (no histogram): %v", n, slices.Sorted(maps.Keys(ms)))
	}

	h := r.tel.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindRWMutexRead, Name: "jobs/1", Mode: etcdlock.KeyMode{Shared: true}}
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Waited: 1500 * time.Millisecond, Outcome: etcdlock.Acquired, Token: 7, Key: "jobs/1/694d"})
	h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, Token: 7, Key: "jobs/1/694d", Held: 3 * time.Second, End: etcdlock.LostKeyDeleted, Err: etcdlock.ErrLockLost})
	mutex := etcdlock.LockInfo{Kind: etcdlock.KindMutex, Name: "a"}
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: mutex, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: mutex, Wait: true, Waited: 3 * time.Millisecond, Outcome: etcdlock.Acquired, Token: 8, Key: "a/694d"})
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: 50 * time.Millisecond, TTL: 15 * time.Second})
	h.RenewDone(etcdlock.RenewDoneInfo{Latency: time.Second, Err: errors.New("unreachable")})
	h.SessionDone(etcdlock.SessionDoneInfo{Cause: etcdlock.SessionNotRenewed, Err: etcdlock.ErrSessionExpired})
	now = now.Add(90 * time.Second) // the mutex's hold is 90s old

	ms = r.collect(t)
	if got := slices.Sorted(maps.Keys(ms)); !slices.Equal(got, slices.Sorted(maps.Keys(descriptions))) {
		t.Fatalf("metrics %v, want %v", got, slices.Sorted(maps.Keys(descriptions)))
	}
	units := map[string]string{
		"etcdlock_acquire_duration_seconds": "s", "etcdlock_hold_duration_seconds": "s", "etcdlock_lease_renewal_duration_seconds": "s",
		"etcdlock_waiters": "{acquisition}", "etcdlock_holders": "{hold}",
		"etcdlock_lease_renewal_failures_total": "{renewal}", "etcdlock_sessions_ended_total": "{session}",
		"etcdlock_locks_lost_total": "{hold}", "etcdlock_oldest_hold_age_seconds": "s",
	}
	for name, m := range ms {
		if m.Description != descriptions[name] || m.Unit != units[name] {
			t.Errorf("%s: description %q, unit %q; want %q, %q", name, m.Description, m.Unit, descriptions[name], units[name])
		}
	}

	waiters := maps.Clone(zeroKinds)
	waiters["kind=rwmutex_read"] = 1 // two started, one done
	holders := maps.Clone(zeroKinds)
	holders["kind=mutex"] = 1 // the read hold is lost, the mutex's held
	if got := counts(t, ms, "etcdlock_waiters", false); !maps.Equal(got, waiters) {
		t.Errorf("etcdlock_waiters %v, want %v", got, waiters)
	}
	if got := counts(t, ms, "etcdlock_holders", false); !maps.Equal(got, holders) {
		t.Errorf("etcdlock_holders %v, want %v", got, holders)
	}
	causes := maps.Clone(zeroCauses)
	causes["cause=not_renewed"] = 1
	if got := counts(t, ms, "etcdlock_sessions_ended_total", true); !maps.Equal(got, causes) {
		t.Errorf("etcdlock_sessions_ended_total %v, want %v", got, causes)
	}
	if got := counts(t, ms, "etcdlock_lease_renewal_failures_total", true); !maps.Equal(got, map[string]int64{"": 1}) {
		t.Errorf("etcdlock_lease_renewal_failures_total %v, want 1", got)
	}
	lost := zeroLosses()
	lost["cause=key_deleted,kind=rwmutex_read"] = 1
	if got := counts(t, ms, "etcdlock_locks_lost_total", true); !maps.Equal(got, lost) {
		t.Errorf("etcdlock_locks_lost_total %v, want %v", got, lost)
	}
	ages := maps.Clone(zeroAges)
	ages["kind=mutex"] = 90
	if got := gauge(t, ms, "etcdlock_oldest_hold_age_seconds"); !maps.Equal(got, ages) {
		t.Errorf("etcdlock_oldest_hold_age_seconds %v, want %v", got, ages)
	}

	// The Prometheus adapter's default buckets: 1ms doubling, 22 of them.
	var doubling []float64
	for i := range 22 {
		doubling = append(doubling, math.Ldexp(0.001, i))
	}
	type point struct {
		count uint64
		sum   float64
	}
	for _, c := range []struct {
		name   string
		bounds []float64
		want   map[string]point
	}{
		{"etcdlock_acquire_duration_seconds", doubling, map[string]point{
			"kind=rwmutex_read,outcome=acquired": {1, 1.5},
			"kind=mutex,outcome=acquired":        {1, 0.003},
		}},
		{"etcdlock_hold_duration_seconds", doubling, map[string]point{
			"end=key_deleted,kind=rwmutex_read": {1, 3},
		}},
		{"etcdlock_lease_renewal_duration_seconds", []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}, map[string]point{
			"": {1, 0.05},
		}},
	} {
		got := map[string]point{}
		for a, p := range histogram(t, ms, c.name) {
			got[a] = point{p.Count, p.Sum}
			if !slices.Equal(p.Bounds, c.bounds) {
				t.Errorf("%s{%s}: bounds %v, want %v", c.name, a, p.Bounds, c.bounds)
			}
		}
		if !maps.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	// 3ms is in the bucket above 2ms, up to 4ms: the buckets tell 2ms from 5ms.
	p := histogram(t, ms, "etcdlock_acquire_duration_seconds")["kind=mutex,outcome=acquired"]
	if want := []uint64{0, 0, 1}; len(p.BucketCounts) != 23 || !slices.Equal(p.BucketCounts[:3], want) {
		t.Errorf("3ms in buckets %v, want %v then zeros (23 in all)", p.BucketCounts, want)
	}
}

// TestMetricsNameSeries: with names, an up-down counter's series is there
// while the name has waiters (holders) in this process and goes after;
// there is no series per kind at zero. The histograms keep their series.
func TestMetricsNameSeries(t *testing.T) {
	r := newRig(t, true)
	if ms := r.collect(t); len(counts(t, ms, "etcdlock_waiters", false))+len(counts(t, ms, "etcdlock_holders", false)) != 0 {
		t.Errorf("series before any event with names: %v %v", ms["etcdlock_waiters"], ms["etcdlock_holders"])
	}
	h := r.tel.Hooks()
	lock := etcdlock.LockInfo{Kind: etcdlock.KindMutex, Name: "jobs/1"}
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.Acquired, Token: 7, Key: "jobs/1/1"})
	ms := r.collect(t)
	one := map[string]int64{"kind=mutex,name=jobs/1": 1}
	if w, hd := counts(t, ms, "etcdlock_waiters", false), counts(t, ms, "etcdlock_holders", false); !maps.Equal(w, one) || !maps.Equal(hd, one) {
		t.Errorf("with a waiter and a holder: waiters %v, holders %v; want %v each", w, hd, one)
	}
	h.AcquireDone(etcdlock.AcquireDoneInfo{LockInfo: lock, Wait: true, Outcome: etcdlock.AcquireCanceled})
	h.HoldDone(etcdlock.HoldDoneInfo{LockInfo: lock, Token: 7, Key: "jobs/1/1", End: etcdlock.Released})
	ms = r.collect(t)
	if w, hd := counts(t, ms, "etcdlock_waiters", false), counts(t, ms, "etcdlock_holders", false); len(w)+len(hd) != 0 {
		t.Errorf("once the name is idle: waiters %v, holders %v; want no series", w, hd)
	}
	if n := len(histogram(t, ms, "etcdlock_acquire_duration_seconds")) + len(histogram(t, ms, "etcdlock_hold_duration_seconds")); n != 3 {
		t.Errorf("%d histogram series, want 3 (acquired, canceled; released)", n)
	}
	// And back: a series that went comes again with its name's next waiter.
	h.AcquireStart(etcdlock.AcquireStartInfo{LockInfo: lock, Wait: true})
	if w := counts(t, r.collect(t), "etcdlock_waiters", false); !maps.Equal(w, one) {
		t.Errorf("waiters %v, want %v", w, one)
	}
}

// TestMetricsSessions wires the metrics to a real session: a renewal is
// timed, and the session's end counted by its cause.
func TestMetricsSessions(t *testing.T) {
	r := newRig(t, false)
	ctx := t.Context()
	renewed := make(chan struct{}, 1)
	s, err := etcdlock.NewSession(ctx, cluster.Client(t), etcdlock.WithTTL(3*time.Second), etcdlock.WithHooks(r.tel.Hooks()),
		etcdlock.WithHooks(etcdlock.Hooks{RenewDone: func(i etcdlock.RenewDoneInfo) {
			if i.Err == nil {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}}))
	must(t, err)
	defer s.Close()
	select {
	case <-renewed:
	case <-time.After(10 * time.Second):
		t.Fatal("no renewal in 10s")
	}
	must(t, s.Close())
	ms := r.collect(t)
	if p := histogram(t, ms, "etcdlock_lease_renewal_duration_seconds")[""]; p.Count < 1 || p.Sum <= 0 || p.Sum > float64(p.Count)*3 {
		t.Errorf("renewals: count %d, sum %vs; want at least one, each under the TTL", p.Count, p.Sum)
	}
	if c := counts(t, ms, "etcdlock_sessions_ended_total", true); c["cause=closed"] != 1 {
		t.Errorf("etcdlock_sessions_ended_total %v, want closed 1", c)
	}
}
