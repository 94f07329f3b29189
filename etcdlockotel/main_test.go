package etcdlockotel_test

import (
	"context"
	"os"
	"slices"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockotel"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// cluster is a one-member etcd started by TestMain.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return m.Run()
	}))
}

// rig is a Telemetry on SDK providers of its own: the spans it ends go to
// spans, its metrics are read with reader.
type rig struct {
	tel    *etcdlockotel.Telemetry
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tracer trace.Tracer // of the same provider, for the tests' parent spans
}

func newRig(t *testing.T, names bool) *rig {
	t.Helper()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() {
		must(t, tp.Shutdown(context.Background()))
		must(t, mp.Shutdown(context.Background()))
	})
	tel, err := etcdlockotel.New(etcdlockotel.Options{LockNames: names, MeterProvider: mp, TracerProvider: tp})
	must(t, err)
	return &rig{tel: tel, spans: spans, reader: reader, tracer: tp.Tracer("test")}
}

// ended returns the spans named name that have ended, in the order they
// ended.
func (r *rig) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// started counts the spans named name that were started.
func (r *rig) started(name string) int {
	n := 0
	for _, s := range r.spans.Started() {
		if s.Name() == name {
			n++
		}
	}
	return n
}

// collect reads the metrics, by name.
func (r *rig) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	must(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/etcdlock/etcdlock/etcdlockotel" {
			t.Errorf("scope %q, want the module's path", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// counts returns the points of an up-down counter or counter, by their
// attributes as "k=v,k=v" (sorted by key); it fails the test if name is
// not such an instrument, or is not cumulative, or has the wrong
// monotonicity. A metric absent has no points.
func counts(t *testing.T, ms map[string]metricdata.Metrics, name string, monotonic bool) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s is a %T, want an int64 sum", name, m.Data)
	}
	if sum.IsMonotonic != monotonic || sum.Temporality != metricdata.CumulativeTemporality {
		t.Fatalf("%s: monotonic %v, temporality %v; want monotonic %v, cumulative", name, sum.IsMonotonic, sum.Temporality, monotonic)
	}
	for _, p := range sum.DataPoints {
		out[encode(p.Attributes)] = p.Value
	}
	return out
}

// gauge returns the points of a float64 gauge, by their attributes (see
// counts).
func gauge(t *testing.T, ms map[string]metricdata.Metrics, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	g, ok := m.Data.(metricdata.Gauge[float64])
	if !ok {
		t.Fatalf("%s is a %T, want a float64 gauge", name, m.Data)
	}
	for _, p := range g.DataPoints {
		out[encode(p.Attributes)] = p.Value
	}
	return out
}

// histogram returns the points of a histogram, by their attributes (see
// counts).
func histogram(t *testing.T, ms map[string]metricdata.Metrics, name string) map[string]metricdata.HistogramDataPoint[float64] {
	t.Helper()
	out := map[string]metricdata.HistogramDataPoint[float64]{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("%s is a %T, want a float64 histogram", name, m.Data)
	}
	for _, p := range h.DataPoints {
		out[encode(p.Attributes)] = p
	}
	return out
}

// pointAttrs returns the attributes of each point of m.
func pointAttrs(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}

// encode writes an attribute set as "k=v,k=v", sorted by key.
func encode(s attribute.Set) string {
	return s.Encoded(attribute.DefaultEncoder())
}

// attrs returns a span's attributes by key; it fails the test if a key
// appears twice.
func attrs(t *testing.T, s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	t.Helper()
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		if _, dup := out[kv.Key]; dup {
			t.Errorf("%s: attribute %s set twice", s.Name(), kv.Key)
		}
		out[kv.Key] = kv.Value
	}
	return out
}

// keys returns the sorted keys of a.
func keys(a map[attribute.Key]attribute.Value) []string {
	var out []string
	for k := range a {
		out = append(out, string(k))
	}
	slices.Sort(out)
	return out
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkUncontended measures Lock then Unlock of an uncontended Mutex
// on a one-member etcd, without hooks ("unset") and with a Telemetry on
// the SDK's providers, every span sampled and none exported ("otel"). Run
// each alone, alternating, and compare the medians, as for etcdlockprom's
// (see docs/performance.md, "Hooks and metrics"):
//
//	go test -run '^$' -bench 'BenchmarkUncontended/otel' -benchmem .
func BenchmarkUncontended(b *testing.B) {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	tel, err := etcdlockotel.New(etcdlockotel.Options{MeterProvider: mp, TracerProvider: tp})
	must(b, err)
	for _, c := range []struct {
		name string
		opts []etcdlock.SessionOption
	}{
		{"unset", nil},
		{"otel", []etcdlock.SessionOption{etcdlock.WithHooks(tel.Hooks())}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := etcdlock.NewSession(b.Context(), cluster.Client(b), c.opts...)
			must(b, err)
			defer s.Close()
			mu := etcdlock.NewMutex(s, "bench/"+c.name)
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				must(b, mu.Lock(ctx))
				must(b, mu.Unlock(ctx))
			}
		})
	}
}
