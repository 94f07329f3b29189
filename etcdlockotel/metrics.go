package etcdlockotel

import (
	"context"
	"errors"
	"time"

	"github.com/etcdlock/etcdlock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// The metrics' attributes: the Prometheus adapter's label names, so that
// its dashboards and alerts read these metrics too (see the package
// comment).
const (
	kindAttr    = attribute.Key("kind")
	nameAttr    = attribute.Key("name")
	outcomeAttr = attribute.Key("outcome")
	endAttr     = attribute.Key("end")
	causeAttr   = attribute.Key("cause")
)

// defaultBuckets are the boundaries, in seconds, of the acquisition and
// hold histograms, as the Prometheus adapter's: 1ms, 2ms, 4ms ... about
// 35 minutes. An uncontended acquisition takes one round trip, often 2 to
// 5ms; coarser buckets could not tell 2ms from 5ms.
var defaultBuckets = func() []float64 {
	b := make([]float64, 22)
	for i, v := 0, 0.001; i < len(b); i, v = i+1, v*2 {
		b[i] = v
	}
	return b
}()

// renewalBuckets are those of the renewal histogram: the Prometheus
// client's default buckets (5ms to 10s), as the Prometheus adapter's.
var renewalBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// kinds and sessionEnds are every kind and cause the library has: without
// lock names, the series of each exist from the start, at zero, as in the
// Prometheus adapter (a series that appears only with its first event
// reads as "no data" before it, and rate() misses that first event).
var (
	kinds = []etcdlock.Kind{etcdlock.KindMutex, etcdlock.KindRWMutexRead, etcdlock.KindRWMutexWrite,
		etcdlock.KindSemaphore, etcdlock.KindElection, etcdlock.KindMultiMutex, etcdlock.KindShard}
	sessionEnds = []etcdlock.SessionEnd{etcdlock.SessionClosed, etcdlock.SessionContextEnded,
		etcdlock.SessionClientClosed, etcdlock.SessionNotRenewed, etcdlock.SessionLeaseGone}
	losses = []etcdlock.HoldEnd{etcdlock.LostLease, etcdlock.LostKeyDeleted, etcdlock.LostMaxHold,
		etcdlock.LostSessionClosed, etcdlock.LostUnknown}
)

// lossKey names a series of etcdlock_locks_lost_total; name is "" without
// lock names.
type lossKey struct {
	kind  etcdlock.Kind
	name  string
	cause etcdlock.HoldEnd
}

// heldSince is a hold of this process not yet ended: its lock (name ""
// without lock names) and when it began.
type heldSince struct {
	kind  etcdlock.Kind
	name  string
	start time.Time
}

// nameOf is l's name as the metrics record it: "" without lock names.
func (t *Telemetry) nameOf(l etcdlock.LockInfo) string {
	if t.names {
		return l.Name
	}
	return ""
}

// instruments makes t's instruments with meter, and registers the
// callback of the asynchronous ones.
func (t *Telemetry) instruments(meter metric.Meter) error {
	var errs [10]error
	t.acquire, errs[0] = meter.Float64Histogram("etcdlock_acquire_duration_seconds",
		metric.WithUnit("s"),
		metric.WithDescription("Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome."),
		metric.WithExplicitBucketBoundaries(defaultBuckets...))
	t.waiters, errs[1] = meter.Int64ObservableUpDownCounter("etcdlock_waiters",
		metric.WithUnit("{acquisition}"),
		metric.WithDescription("Acquisitions under way in this process."))
	t.holders, errs[2] = meter.Int64ObservableUpDownCounter("etcdlock_holders",
		metric.WithUnit("{hold}"),
		metric.WithDescription("Holds of this process, not yet released or known lost; for elections, the elections it leads."))
	t.hold, errs[3] = meter.Float64Histogram("etcdlock_hold_duration_seconds",
		metric.WithUnit("s"),
		metric.WithDescription("How long holds lasted, by how they ended: released, or lost and why."),
		metric.WithExplicitBucketBoundaries(defaultBuckets...))
	t.renewal, errs[4] = meter.Float64Histogram("etcdlock_lease_renewal_duration_seconds",
		metric.WithUnit("s"),
		metric.WithDescription("Round trip of the session lease renewals that succeeded."),
		metric.WithExplicitBucketBoundaries(renewalBuckets...))
	t.failures, errs[5] = meter.Int64ObservableCounter("etcdlock_lease_renewal_failures_total",
		metric.WithUnit("{renewal}"),
		metric.WithDescription("Session lease renewals that failed."))
	t.sessions, errs[6] = meter.Int64ObservableCounter("etcdlock_sessions_ended_total",
		metric.WithUnit("{session}"),
		metric.WithDescription("Sessions ended, by cause."))
	t.lost, errs[7] = meter.Int64ObservableCounter("etcdlock_locks_lost_total",
		metric.WithUnit("{hold}"),
		metric.WithDescription("Holds lost (ended without their release), by cause."))
	t.oldest, errs[8] = meter.Float64ObservableGauge("etcdlock_oldest_hold_age_seconds",
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest hold of this process not yet ended: a hold that never ends shows here long before it does in etcdlock_hold_duration_seconds."))
	if err := errors.Join(errs[:]...); err != nil {
		return err
	}
	for _, c := range sessionEnds {
		t.ended[c] = 0
	}
	// With names, the series come and go with the names in use; without,
	// there is one per kind, from the start.
	if !t.names {
		for _, k := range kinds {
			t.counts[gaugeKey{waiting, k, ""}] = 0
			t.counts[gaugeKey{holding, k, ""}] = 0
			for _, c := range losses {
				t.losses[lossKey{k, "", c}] = 0
			}
		}
	}
	_, errs[9] = meter.RegisterCallback(t.observe, t.waiters, t.holders, t.failures, t.sessions, t.lost, t.oldest)
	return errs[9]
}

// gauge says which count a gaugeKey is of.
type gauge uint8

const (
	waiting gauge = iota // etcdlock_waiters
	holding              // etcdlock_holders
)

// gaugeKey names a series of etcdlock_waiters or etcdlock_holders; name
// is "" without lock names.
type gaugeKey struct {
	gauge gauge
	kind  etcdlock.Kind
	name  string
}

// add adds d to the count of gauge for the lock l. With names, a count
// that comes back to zero is deleted, and its series goes at the next
// collection: the names of a program that names a lock per job would
// otherwise each keep a series for good.
func (t *Telemetry) add(g gauge, l etcdlock.LockInfo, d int64) {
	k := gaugeKey{g, l.Kind, ""}
	if t.names {
		k.name = l.Name
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.counts[k] + d
	if n == 0 && t.names {
		delete(t.counts, k)
		return
	}
	t.counts[k] = n
}

// observe is the callback of the asynchronous instruments: it reports the
// counts as they are. A series not reported is not exported: that is how
// a name's series goes.
func (t *Telemetry) observe(_ context.Context, o metric.Observer) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, n := range t.counts {
		inst := t.waiters
		if k.gauge == holding {
			inst = t.holders
		}
		o.ObserveInt64(inst, n, t.lockAttrs(etcdlock.LockInfo{Kind: k.kind, Name: k.name}))
	}
	o.ObserveInt64(t.failures, t.failed)
	for c, n := range t.ended {
		o.ObserveInt64(t.sessions, n, metric.WithAttributes(causeAttr.String(c.String())))
	}
	for k, n := range t.losses {
		o.ObserveInt64(t.lost, n, t.lockAttrs(etcdlock.LockInfo{Kind: k.kind, Name: k.name}, causeAttr.String(k.cause.String())))
	}
	// The age of the oldest hold of each lock (kind, and name with
	// names); without names every kind has one, 0 when none is held.
	type lock struct {
		kind etcdlock.Kind
		name string
	}
	oldest := map[lock]time.Duration{}
	if !t.names {
		for _, k := range kinds {
			oldest[lock{k, ""}] = 0
		}
	}
	now := t.now()
	for _, h := range t.current {
		l := lock{h.kind, h.name}
		oldest[l] = max(oldest[l], now.Sub(h.start))
	}
	for l, age := range oldest {
		o.ObserveFloat64(t.oldest, age.Seconds(), t.lockAttrs(etcdlock.LockInfo{Kind: l.kind, Name: l.name}))
	}
	return nil
}

// lockAttrs returns the attributes of a lock's metrics, kind and (with
// names) name, and extra.
func (t *Telemetry) lockAttrs(l etcdlock.LockInfo, extra ...attribute.KeyValue) metric.MeasurementOption {
	a := make([]attribute.KeyValue, 0, 3)
	a = append(a, kindAttr.String(l.Kind.String()))
	if t.names {
		a = append(a, nameAttr.String(l.Name))
	}
	return metric.WithAttributes(append(a, extra...)...)
}
