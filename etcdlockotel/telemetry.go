package etcdlockotel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// scope is the instrumentation scope of the meter and the tracer: the
// module's path, as OpenTelemetry asks of instrumentation libraries.
const scope = "github.com/etcdlock/etcdlock/etcdlockotel"

// Options configures New. The zero value is the default.
type Options struct {
	// LockNames records the lock's or election's name: as the attribute
	// name of the metrics of locks, and on spans as etcdlock.name and in
	// the error's text (the library's errors quote the lock's key). The
	// up-down counters' series of a name go when the name has no waiters
	// (holders) left in this process; the histograms keep theirs, a set
	// per name ever used. Default false: names can be unbounded, and
	// carry what a program put in them (a user, a job).
	LockNames bool
	// MeterProvider makes the metrics. Default (nil): the global one,
	// otel.GetMeterProvider(), which forwards to a provider set later
	// with otel.SetMeterProvider. A MeterProvider of package
	// go.opentelemetry.io/otel/metric/noop records none.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the spans. Default (nil): the global one,
	// otel.GetTracerProvider(), which forwards to a provider set later
	// with otel.SetTracerProvider. A TracerProvider of package
	// go.opentelemetry.io/otel/trace/noop records none.
	TracerProvider trace.TracerProvider
}

// Telemetry records the events of the sessions whose Hooks it gives as
// OpenTelemetry metrics and spans (see the package comment). It is safe
// for concurrent use.
type Telemetry struct {
	names  bool
	tracer trace.Tracer

	acquire, hold, renewal metric.Float64Histogram
	waiters, holders       metric.Int64ObservableUpDownCounter
	failures, sessions     metric.Int64ObservableCounter
	lost                   metric.Int64ObservableCounter
	oldest                 metric.Float64ObservableGauge

	// The asynchronous instruments report these at each collection.
	mu     sync.Mutex
	counts map[gaugeKey]int64            // guarded by mu; with names, no zero values
	failed int64                         // guarded by mu: renewals that failed
	ended  map[etcdlock.SessionEnd]int64 // guarded by mu: sessions ended, by cause
	losses map[lossKey]int64             // guarded by mu: holds lost, by lock and cause
	// current are the holds of this process not yet ended, by the key
	// and token that name one, with when each began: the age of the
	// oldest is reported at each collection. Guarded by mu.
	current map[holdKey]heldSince
	now     func() time.Time

	spansMu sync.Mutex
	holds   map[holdKey]trace.Span // guarded by spansMu: the hold spans not yet ended
}

// New returns a Telemetry whose metrics and spans come from o's
// providers. It fails only if a provider refuses to make an instrument
// or to register the callback of the asynchronous ones. The callback
// stays registered for the life of the MeterProvider: make one Telemetry
// and give its Hooks to every session.
func New(o Options) (*Telemetry, error) {
	mp, tp := o.MeterProvider, o.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	t := &Telemetry{
		names:   o.LockNames,
		tracer:  tp.Tracer(scope),
		counts:  make(map[gaugeKey]int64),
		ended:   make(map[etcdlock.SessionEnd]int64),
		losses:  make(map[lossKey]int64),
		current: make(map[holdKey]heldSince),
		now:     time.Now,
		holds:   make(map[holdKey]trace.Span),
	}
	if err := t.instruments(mp.Meter(scope)); err != nil {
		return nil, fmt.Errorf("etcdlockotel: %w", err)
	}
	return t, nil
}

// Hooks returns the hooks that feed t, for etcdlock.WithHooks.
func (t *Telemetry) Hooks() etcdlock.Hooks {
	return etcdlock.Hooks{
		AcquireStart: func(i etcdlock.AcquireStartInfo) {
			t.add(waiting, i.LockInfo, 1)
		},
		AcquireDone: func(i etcdlock.AcquireDoneInfo) {
			now := time.Now()
			t.add(waiting, i.LockInfo, -1)
			// The library calls AcquireDone before the hold is the
			// caller's: its HoldDone, which takes the holder off and
			// ends the hold's span started here, cannot come first.
			if i.Outcome == etcdlock.Acquired {
				t.add(holding, i.LockInfo, 1)
				t.mu.Lock()
				t.current[holdKey{i.Key, i.Token}] = heldSince{i.Kind, t.nameOf(i.LockInfo), t.now()}
				t.mu.Unlock()
			}
			ctx := t.acquireSpan(i, now)
			t.acquire.Record(ctx, i.Waited.Seconds(), t.lockAttrs(i.LockInfo, outcomeAttr.String(i.Outcome.String())))
		},
		HoldDone: func(i etcdlock.HoldDoneInfo) {
			now := time.Now()
			t.add(holding, i.LockInfo, -1)
			t.mu.Lock()
			delete(t.current, holdKey{i.Key, i.Token})
			if i.End.Lost() {
				t.losses[lossKey{i.Kind, t.nameOf(i.LockInfo), i.End}]++
			}
			t.mu.Unlock()
			ctx := t.endHold(i, now)
			t.hold.Record(ctx, i.Held.Seconds(), t.lockAttrs(i.LockInfo, endAttr.String(i.End.String())))
		},
		RenewDone: func(i etcdlock.RenewDoneInfo) {
			if i.Err != nil {
				t.mu.Lock()
				t.failed++
				t.mu.Unlock()
				return
			}
			t.renewal.Record(context.Background(), i.Latency.Seconds())
		},
		SessionDone: func(i etcdlock.SessionDoneInfo) {
			t.mu.Lock()
			t.ended[i.Cause]++
			t.mu.Unlock()
		},
	}
}
