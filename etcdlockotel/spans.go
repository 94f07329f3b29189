package etcdlockotel

import (
	"context"
	"time"

	"github.com/etcdlock/etcdlock"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The spans' names and attributes (see the package comment). Span
// attributes take the package's namespace, as OpenTelemetry's conventions
// ask; error.type is the conventions' own.
const (
	acquireSpan = "etcdlock.acquire"
	holdSpan    = "etcdlock.hold"

	spanKindAttr    = attribute.Key("etcdlock.kind")
	spanNameAttr    = attribute.Key("etcdlock.name")
	spanOutcomeAttr = attribute.Key("etcdlock.outcome")
	spanWaitAttr    = attribute.Key("etcdlock.wait")
	spanWaitedAttr  = attribute.Key("etcdlock.waited")
	spanTokenAttr   = attribute.Key("etcdlock.token")
	spanEndAttr     = attribute.Key("etcdlock.end")
	spanHeldAttr    = attribute.Key("etcdlock.held")
	errorTypeAttr   = attribute.Key("error.type")
)

// holdKey names a hold: its key in etcd and its fencing token, as
// AcquireDoneInfo and HoldDoneInfo give them. The key alone is not
// enough: a session's holds of one name, one after the other, have the
// same key.
type holdKey struct {
	key   string
	token int64
}

// acquireSpan records the acquisition i, which ended at now, as a span
// from its start to now, and starts its hold's span if it acquired one.
// It returns a context with the acquisition's span, for the exemplars of
// its metric.
//
// The span is made when the acquisition is over, with its start set
// back: a hook cannot put a span into the context the acquisition runs
// with. Parent context, timestamps and attributes are those it would
// have had.
func (t *Telemetry) acquireSpan(i etcdlock.AcquireDoneInfo, now time.Time) context.Context {
	parent := i.Context
	if parent == nil {
		parent = context.Background()
	}
	a := make([]attribute.KeyValue, 0, 6)
	a = append(a, spanKindAttr.String(i.Kind.String()))
	if t.names {
		a = append(a, spanNameAttr.String(i.Name))
	}
	a = append(a, spanOutcomeAttr.String(i.Outcome.String()), spanWaitAttr.Bool(i.Wait),
		spanWaitedAttr.Float64(i.Waited.Seconds()))
	acquired := i.Outcome == etcdlock.Acquired
	if acquired {
		a = append(a, spanTokenAttr.Int64(i.Token))
	}
	ctx, span := t.tracer.Start(parent, acquireSpan, trace.WithTimestamp(now.Add(-i.Waited)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(a...))
	// Busy is a Try form's "no", its answer rather than its failure;
	// canceled, the caller's own ctx ending, is the caller's to judge.
	// etcdlock.outcome says both.
	if i.Outcome == etcdlock.AcquireSessionEnded || i.Outcome == etcdlock.AcquireFailed {
		t.fail(span, "etcdlock: acquisition failed: ", i.Outcome.String(), i.Err)
	}
	span.End(trace.WithTimestamp(now))
	if acquired {
		t.startHold(parent, i, now)
	}
	return ctx
}

// startHold starts the span of the hold that i acquired at now, a
// sibling of the acquisition's, and keeps it until its HoldDone.
func (t *Telemetry) startHold(parent context.Context, i etcdlock.AcquireDoneInfo, now time.Time) {
	a := make([]attribute.KeyValue, 0, 3)
	a = append(a, spanKindAttr.String(i.Kind.String()))
	if t.names {
		a = append(a, spanNameAttr.String(i.Name))
	}
	a = append(a, spanTokenAttr.Int64(i.Token))
	_, span := t.tracer.Start(parent, holdSpan, trace.WithTimestamp(now),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(a...))
	if !span.IsRecording() {
		// Not sampled, or no SDK: ending it would do nothing, and
		// keeping it would cost memory until the hold's HoldDone.
		return
	}
	t.spansMu.Lock()
	t.holds[holdKey{i.Key, i.Token}] = span
	t.spansMu.Unlock()
}

// endHold ends the span of the hold that i reports ended, at now. It
// returns a context with that span, for the exemplars of the hold's
// metric, or an empty one if the span was not kept.
func (t *Telemetry) endHold(i etcdlock.HoldDoneInfo, now time.Time) context.Context {
	k := holdKey{i.Key, i.Token}
	t.spansMu.Lock()
	span, ok := t.holds[k]
	delete(t.holds, k)
	t.spansMu.Unlock()
	if !ok {
		return context.Background()
	}
	span.SetAttributes(spanEndAttr.String(i.End.String()), spanHeldAttr.Float64(i.Held.Seconds()))
	// A session the program closed releases its holds on purpose: the
	// library logs that at Info, its other losses at Warn.
	if i.End.Lost() && i.End != etcdlock.LostSessionClosed {
		t.fail(span, "etcdlock: lock lost: ", i.End.String(), i.Err)
	}
	span.End(trace.WithTimestamp(now))
	return trace.ContextWithSpan(context.Background(), span)
}

// fail sets span's status to Error, with error.type the outcome or end
// (class). The error's text quotes the lock's key, and so its name: with
// names, it is the status's description and an exception event; without,
// the description is what + class.
func (t *Telemetry) fail(span trace.Span, what, class string, err error) {
	span.SetAttributes(errorTypeAttr.String(class))
	if t.names && err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return
	}
	span.SetStatus(codes.Error, what+class)
}
