package etcdlockprom

import (
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/prometheus/client_golang/prometheus"
)

// Options configures New. The zero value is the default.
type Options struct {
	// LockNames adds the label name, the lock's or election's name, to
	// the metrics of locks. The gauges' series of a name are deleted when
	// the name has no waiters (holders) left in this process; the
	// histograms keep theirs, a set per name ever used. Default false:
	// names can be unbounded.
	LockNames bool
	// AcquireBuckets and HoldBuckets are the buckets, in seconds, of
	// etcdlock_acquire_duration_seconds and etcdlock_hold_duration_seconds.
	// Default: 1ms to about 35 minutes, each twice the last (1ms, 2ms,
	// 4ms, 8ms, ...): an uncontended acquisition takes one round trip,
	// often 2 to 5ms, and coarser buckets could not tell 2ms from 5ms.
	AcquireBuckets, HoldBuckets []float64
	// RenewalBuckets are those of etcdlock_lease_renewal_duration_seconds.
	// Default: prometheus.DefBuckets (5ms to 10s).
	RenewalBuckets []float64
}

// defaultBuckets are 1ms, 2ms, 4ms ... about 35 minutes.
var defaultBuckets = prometheus.ExponentialBuckets(0.001, 2, 22)

// kinds and sessionEnds are every label value of kind and cause: their
// series exist from the start, at zero, as Prometheus advises for labels
// whose values are known (a series that appears only with its first event
// reads as "no data" before it, and rate() misses that first event).
var (
	kinds = []etcdlock.Kind{etcdlock.KindMutex, etcdlock.KindRWMutexRead, etcdlock.KindRWMutexWrite,
		etcdlock.KindSemaphore, etcdlock.KindElection, etcdlock.KindMultiMutex, etcdlock.KindShard}
	sessionEnds = []etcdlock.SessionEnd{etcdlock.SessionClosed, etcdlock.SessionContextEnded,
		etcdlock.SessionClientClosed, etcdlock.SessionNotRenewed, etcdlock.SessionLeaseGone}
	losses = []etcdlock.HoldEnd{etcdlock.LostLease, etcdlock.LostKeyDeleted, etcdlock.LostMaxHold,
		etcdlock.LostSessionClosed, etcdlock.LostUnknown}
)

// Metrics is a prometheus.Collector of the events of the sessions whose
// Hooks it gives. It is safe for concurrent use.
type Metrics struct {
	names bool

	// With names, a gauge's series is deleted at zero. Its value is kept
	// here, and each change and deletion made under mu: else an Inc
	// between another event's Dec to zero and its Delete would go to the
	// deleted series and be lost, and the Dec that follows it leave -1.
	mu     sync.Mutex
	counts map[gaugeKey]int // guarded by mu; no zero values
	// current are the holds of this process, by the key and token that
	// name one, with the label values and the start of each: the age of
	// the oldest is computed when scraped. Guarded by mu.
	current map[holdID]currentHold
	now     func() time.Time

	acquire  *prometheus.HistogramVec
	waiters  *prometheus.GaugeVec
	holders  *prometheus.GaugeVec
	hold     *prometheus.HistogramVec
	renewal  prometheus.Histogram
	failures prometheus.Counter
	sessions *prometheus.CounterVec
	lost     *prometheus.CounterVec
	oldest   *prometheus.Desc
}

// holdID names a hold: its key and token (AcquireDoneInfo, HoldDoneInfo).
type holdID struct {
	key   string
	token int64
}

// currentHold is a hold of this process not yet ended.
type currentHold struct {
	labels []string
	start  time.Time
}

// New returns the metrics described in the package comment. Register them
// (prometheus.MustRegister(m)) and give each session m.Hooks().
func New(o Options) *Metrics {
	lockLabels := []string{"kind"}
	if o.LockNames {
		lockLabels = append(lockLabels, "name")
	}
	with := func(extra string) []string {
		return append(lockLabels[:len(lockLabels):len(lockLabels)], extra)
	}
	or := func(b, def []float64) []float64 {
		if b == nil {
			return def
		}
		return b
	}
	m := &Metrics{
		names:   o.LockNames,
		counts:  make(map[gaugeKey]int),
		current: make(map[holdID]currentHold),
		now:     time.Now,
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "etcdlock", Name: "acquire_duration_seconds",
			Help:    "Time from the start of an acquisition (Lock, RLock, Acquire, Campaign, their Try forms) to its outcome.",
			Buckets: or(o.AcquireBuckets, defaultBuckets),
		}, with("outcome")),
		waiters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdlock", Name: "waiters",
			Help: "Acquisitions under way in this process.",
		}, lockLabels),
		holders: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "etcdlock", Name: "holders",
			Help: "Holds of this process, not yet released or known lost; for elections, the elections it leads.",
		}, lockLabels),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "etcdlock", Name: "hold_duration_seconds",
			Help:    "How long holds lasted, by how they ended: released, or lost and why.",
			Buckets: or(o.HoldBuckets, defaultBuckets),
		}, with("end")),
		renewal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "etcdlock", Name: "lease_renewal_duration_seconds",
			Help:    "Round trip of the session lease renewals that succeeded.",
			Buckets: or(o.RenewalBuckets, prometheus.DefBuckets),
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "etcdlock", Name: "lease_renewal_failures_total",
			Help: "Session lease renewals that failed.",
		}),
		sessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdlock", Name: "sessions_ended_total",
			Help: "Sessions ended, by cause.",
		}, []string{"cause"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "etcdlock", Name: "locks_lost_total",
			Help: "Holds lost (ended without their release), by cause.",
		}, with("cause")),
		oldest: prometheus.NewDesc("etcdlock_oldest_hold_age_seconds",
			"Age of the oldest hold of this process not yet ended: a hold that never ends shows here long before it does in etcdlock_hold_duration_seconds.",
			lockLabels, nil),
	}
	for _, c := range sessionEnds {
		m.sessions.WithLabelValues(c.String())
	}
	// With names, a gauge's series come and go with the names in use;
	// without, there is one per kind, from the start.
	if !o.LockNames {
		for _, k := range kinds {
			m.waiters.WithLabelValues(k.String())
			m.holders.WithLabelValues(k.String())
			for _, c := range losses {
				m.lost.WithLabelValues(k.String(), c.String())
			}
		}
	}
	return m
}

// Hooks returns the hooks that feed m, for etcdlock.WithHooks.
func (m *Metrics) Hooks() etcdlock.Hooks {
	return etcdlock.Hooks{
		AcquireStart: func(i etcdlock.AcquireStartInfo) {
			m.add(m.waiters, m.lock(i.LockInfo), 1)
		},
		AcquireDone: func(i etcdlock.AcquireDoneInfo) {
			l := m.lock(i.LockInfo)
			m.add(m.waiters, l, -1)
			if i.Outcome == etcdlock.Acquired {
				m.add(m.holders, l, 1)
				m.mu.Lock()
				m.current[holdID{i.Key, i.Token}] = currentHold{l[:len(l):len(l)], m.now()}
				m.mu.Unlock()
			}
			m.acquire.WithLabelValues(append(l, i.Outcome.String())...).Observe(i.Waited.Seconds())
		},
		HoldDone: func(i etcdlock.HoldDoneInfo) {
			l := m.lock(i.LockInfo)
			m.add(m.holders, l, -1)
			m.mu.Lock()
			delete(m.current, holdID{i.Key, i.Token})
			m.mu.Unlock()
			m.hold.WithLabelValues(append(l, i.End.String())...).Observe(i.Held.Seconds())
			if i.End.Lost() {
				m.lost.WithLabelValues(append(l, i.End.String())...).Inc()
			}
		},
		RenewDone: func(i etcdlock.RenewDoneInfo) {
			if i.Err != nil {
				m.failures.Inc()
				return
			}
			m.renewal.Observe(i.Latency.Seconds())
		},
		SessionDone: func(i etcdlock.SessionDoneInfo) {
			m.sessions.WithLabelValues(i.Cause.String()).Inc()
		},
	}
}

// gaugeKey names a series of a gauge with the label name.
type gaugeKey struct {
	gauge      *prometheus.GaugeVec
	kind, name string
}

// add adds d to the series of gauge with label values l (see lock). With
// names, a series that comes back to zero is deleted: the names of a
// program that names a lock per job would otherwise each keep a series
// for good.
func (m *Metrics) add(gauge *prometheus.GaugeVec, l []string, d int) {
	if !m.names {
		gauge.WithLabelValues(l...).Add(float64(d))
		return
	}
	k := gaugeKey{gauge, l[0], l[1]}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.counts[k] + d
	if n == 0 {
		delete(m.counts, k)
		gauge.DeleteLabelValues(l...)
		return
	}
	m.counts[k] = n
	gauge.WithLabelValues(l...).Set(float64(n))
}

// lock returns the label values of a lock's metrics, with room for one more.
func (m *Metrics) lock(i etcdlock.LockInfo) []string {
	l := make([]string, 1, 3)
	l[0] = i.Kind.String()
	if m.names {
		l = append(l, i.Name)
	}
	return l
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
	ch <- m.oldest
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
	for _, o := range m.oldestHolds() {
		ch <- prometheus.MustNewConstMetric(m.oldest, prometheus.GaugeValue, o.age.Seconds(), o.labels...)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.acquire, m.waiters, m.holders, m.hold, m.renewal, m.failures, m.sessions, m.lost}
}

// oldestAge is the age of the oldest current hold of a set of labels.
type oldestAge struct {
	labels []string
	age    time.Duration
}

// oldestHolds returns, for each set of label values of the holds of this
// process, the age of the oldest; without LockNames, a value for every
// kind, 0 where none is held.
func (m *Metrics) oldestHolds() []oldestAge {
	now := m.now()
	byLabels := map[string]*oldestAge{}
	var out []*oldestAge
	if !m.names {
		for _, k := range kinds {
			o := &oldestAge{labels: []string{k.String()}}
			byLabels[k.String()] = o
			out = append(out, o)
		}
	}
	m.mu.Lock()
	for _, h := range m.current {
		id := h.labels[0]
		if m.names {
			id += "\x00" + h.labels[1]
		}
		o := byLabels[id]
		if o == nil {
			o = &oldestAge{labels: h.labels}
			byLabels[id] = o
			out = append(out, o)
		}
		o.age = max(o.age, now.Sub(h.start))
	}
	m.mu.Unlock()
	ages := make([]oldestAge, len(out))
	for i, o := range out {
		ages[i] = *o
	}
	return ages
}
