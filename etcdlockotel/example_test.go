package etcdlockotel_test

import (
	"context"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockotel"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Trace a request's lock and count acquisitions: one Telemetry serves
// every session given its Hooks. The providers here keep what they
// record in memory; a program gives them its exporters (OTLP,
// Prometheus), or leaves Options' providers nil for the global ones.
func ExampleNew() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	tel, err := etcdlockotel.New(etcdlockotel.Options{MeterProvider: mp, TracerProvider: tp}) // LockNames: true records the lock's name
	if err != nil {
		log.Fatal(err)
	}
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(tel.Hooks()))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	rctx, request := tp.Tracer("example").Start(ctx, "request")
	mu := etcdlock.NewMutex(s, "example/otel")
	if err := mu.Lock(rctx); err != nil { // the request's span is the parent
		log.Fatal(err)
	}
	if err := mu.Unlock(rctx); err != nil {
		log.Fatal(err)
	}
	request.End()

	for _, span := range spans.GetSpans() { // in the order they ended
		fmt.Print(span.Name)
		if span.Parent.SpanID() == request.SpanContext().SpanID() {
			fmt.Print(", child of request")
		}
		for _, kv := range span.Attributes {
			if kv.Key == "etcdlock.outcome" || kv.Key == "etcdlock.end" {
				fmt.Printf(", %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		fmt.Println()
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "etcdlock_acquire_duration_seconds" {
				for _, p := range h.DataPoints {
					fmt.Printf("%s{%s} count %d\n", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Count)
				}
			}
		}
	}
	// Output:
	// etcdlock.acquire, child of request, etcdlock.outcome=acquired
	// etcdlock.hold, child of request, etcdlock.end=released
	// request
	// etcdlock_acquire_duration_seconds{kind=mutex,outcome=acquired} count 1
}
