package etcdlockotel_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockotel"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpans: a Lock under a request's span makes an acquisition span and
// a hold span, both children of the request: the first from the call's
// start to its outcome, the second from the acquisition to the Unlock,
// with the hold's token; neither is an error.
func TestSpans(t *testing.T) {
	r := newRig(t, true)
	ctx := t.Context()
	s, err := etcdlock.NewSession(ctx, cluster.Client(t), etcdlock.WithHooks(r.tel.Hooks()))
	must(t, err)
	defer s.Close()

	rctx, request := r.tracer.Start(ctx, "request")
	m := etcdlock.NewMutex(s, "spans/a")
	called := time.Now()
	must(t, m.Lock(rctx))
	returned := time.Now()
	token := m.Token()
	acq := r.ended("etcdlock.acquire")
	if len(acq) != 1 {
		t.Fatalf("%d acquisition spans ended, want 1", len(acq))
	}
	a := acq[0]
	if n := len(r.ended("etcdlock.hold")); n != 0 || r.started("etcdlock.hold") != 1 || r.tel.OpenHolds() != 1 {
		t.Fatalf("while held: %d hold spans ended, %d started, %d kept; want 0, 1, 1", n, r.started("etcdlock.hold"), r.tel.OpenHolds())
	}
	// Long enough for etcdlock.held to tell seconds from milliseconds.
	time.Sleep(20 * time.Millisecond)
	released := time.Now()
	must(t, m.Unlock(rctx))
	request.End()
	holds := r.ended("etcdlock.hold")
	if len(holds) != 1 {
		t.Fatalf("%d hold spans ended, want 1", len(holds))
	}
	h := holds[0]

	for _, s := range []sdktrace.ReadOnlySpan{a, h} {
		if s.Parent().SpanID() != request.SpanContext().SpanID() || s.SpanContext().TraceID() != request.SpanContext().TraceID() {
			t.Errorf("%s: parent %v, want the request %v", s.Name(), s.Parent(), request.SpanContext())
		}
		if s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("%s: kind %v, want internal", s.Name(), s.SpanKind())
		}
		if s.Status().Code != codes.Unset || len(s.Events()) != 0 {
			t.Errorf("%s: status %v, events %v; want unset, none", s.Name(), s.Status(), s.Events())
		}
		if s.InstrumentationScope().Name != "github.com/etcdlock/etcdlock/etcdlockotel" {
			t.Errorf("%s: scope %q", s.Name(), s.InstrumentationScope().Name)
		}
	}

	aa := attrs(t, a)
	want := []string{"etcdlock.kind", "etcdlock.name", "etcdlock.outcome", "etcdlock.token", "etcdlock.wait", "etcdlock.waited"}
	if got := keys(aa); !slices.Equal(got, want) {
		t.Errorf("acquisition span's attributes %v, want %v", got, want)
	}
	if aa["etcdlock.kind"].AsString() != "mutex" || aa["etcdlock.name"].AsString() != "spans/a" ||
		aa["etcdlock.outcome"].AsString() != "acquired" || !aa["etcdlock.wait"].AsBool() || aa["etcdlock.token"].AsInt64() != token {
		t.Errorf("acquisition span: %v; want mutex spans/a acquired, wait, token %d", a.Attributes(), token)
	}
	// The span covers the call, and etcdlock.waited is its length in seconds.
	if a.StartTime().Before(called) || a.EndTime().After(returned) || !a.StartTime().Before(a.EndTime()) {
		t.Errorf("acquisition span %v to %v; Lock called at %v, returned at %v", a.StartTime(), a.EndTime(), called, returned)
	}
	if waited := aa["etcdlock.waited"].AsFloat64(); math.Abs(waited-a.EndTime().Sub(a.StartTime()).Seconds()) > 1e-6 {
		t.Errorf("etcdlock.waited %v, the span lasted %v", waited, a.EndTime().Sub(a.StartTime()))
	}

	ha := attrs(t, h)
	want = []string{"etcdlock.end", "etcdlock.held", "etcdlock.kind", "etcdlock.name", "etcdlock.token"}
	if got := keys(ha); !slices.Equal(got, want) {
		t.Errorf("hold span's attributes %v, want %v", got, want)
	}
	if ha["etcdlock.kind"].AsString() != "mutex" || ha["etcdlock.name"].AsString() != "spans/a" ||
		ha["etcdlock.end"].AsString() != "released" || ha["etcdlock.token"].AsInt64() != token {
		t.Errorf("hold span: %v; want mutex spans/a released, token %d", h.Attributes(), token)
	}
	// From the acquisition to the Unlock.
	if !h.StartTime().Equal(a.EndTime()) || h.EndTime().Before(released) || h.EndTime().After(time.Now()) {
		t.Errorf("hold span %v to %v; acquired at %v, Unlock called at %v", h.StartTime(), h.EndTime(), a.EndTime(), released)
	}
	lasted := h.EndTime().Sub(h.StartTime()).Seconds()
	if held := ha["etcdlock.held"].AsFloat64(); held < 0.02 || held > lasted+1 {
		t.Errorf("etcdlock.held %v s, want at least 0.02 and about %v", held, lasted)
	}
	if n := r.tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept after Unlock", n)
	}
}

// TestSpansBusy: a TryLock that finds the lock held is an acquisition
// span with outcome busy, wait false and no token, not an error, and no
// hold span.
func TestSpansBusy(t *testing.T) {
	r := newRig(t, true)
	ctx := t.Context()
	cli := cluster.Client(t)
	holder, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()))
	must(t, err)
	defer holder.Close()
	other, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()))
	must(t, err)
	defer other.Close()

	m := etcdlock.NewMutex(holder, "busy/a")
	must(t, m.Lock(ctx))
	rctx, request := r.tracer.Start(ctx, "request")
	if err := etcdlock.NewMutex(other, "busy/a").TryLock(rctx); !errors.Is(err, etcdlock.ErrLocked) {
		t.Fatalf("TryLock: %v, want ErrLocked", err)
	}
	request.End()
	acq := r.ended("etcdlock.acquire")
	if len(acq) != 2 {
		t.Fatalf("%d acquisition spans, want 2 (Lock, TryLock)", len(acq))
	}
	b := acq[1]
	ba := attrs(t, b)
	want := []string{"etcdlock.kind", "etcdlock.name", "etcdlock.outcome", "etcdlock.wait", "etcdlock.waited"}
	if got := keys(ba); !slices.Equal(got, want) {
		t.Errorf("busy span's attributes %v, want %v (no token)", got, want)
	}
	if ba["etcdlock.outcome"].AsString() != "busy" || ba["etcdlock.wait"].AsBool() || b.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("busy span: %v, parent %v; want outcome busy, wait false, the request's child", b.Attributes(), b.Parent())
	}
	if b.Status().Code != codes.Unset {
		t.Errorf("busy span's status %v, want unset: busy is a Try form's answer", b.Status())
	}
	if n := r.started("etcdlock.hold"); n != 1 {
		t.Errorf("%d hold spans started, want 1 (the holder's)", n)
	}
	must(t, m.Unlock(ctx))
	if n := r.tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept after Unlock", n)
	}
	ms := r.collect(t)
	if p := histogram(t, ms, "etcdlock_acquire_duration_seconds")["kind=mutex,name=busy/a,outcome=busy"]; p.Count != 1 {
		t.Errorf("busy acquisitions counted %d, want 1", p.Count)
	}
}

// TestSpansLost: a hold whose key is deleted while Done watches it ends
// its span with status Error, etcdlock.end and error.type key_deleted,
// and the loss's error (with names) as description and exception event.
func TestSpansLost(t *testing.T) {
	r := newRig(t, true)
	ctx := t.Context()
	cli := cluster.Client(t)
	// After r's hook, this tells the test that r has seen the loss.
	lost := make(chan etcdlock.HoldDoneInfo, 1)
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()),
		etcdlock.WithHooks(etcdlock.Hooks{HoldDone: func(i etcdlock.HoldDoneInfo) { lost <- i }}))
	must(t, err)
	defer s.Close()

	m := etcdlock.NewMutex(s, "lost/a")
	must(t, m.Lock(ctx))
	key, token := m.Key(), m.Token()
	m.Done() // the loss watch reports the loss
	_, err = cli.Delete(ctx, key)
	must(t, err)
	var i etcdlock.HoldDoneInfo
	select {
	case i = <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("hold not lost 10s after its key was deleted")
	}
	if err := m.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
	holds := r.ended("etcdlock.hold")
	if len(holds) != 1 {
		t.Fatalf("%d hold spans ended, want 1", len(holds))
	}
	h := holds[0]
	ha := attrs(t, h)
	if ha["etcdlock.end"].AsString() != "key_deleted" || ha["error.type"].AsString() != "key_deleted" || ha["etcdlock.token"].AsInt64() != token {
		t.Errorf("lost hold's span: %v; want end and error.type key_deleted, token %d", h.Attributes(), token)
	}
	if h.Status().Code != codes.Error || h.Status().Description != i.Err.Error() || !strings.Contains(h.Status().Description, key) {
		t.Errorf("lost hold's status %v, want Error with the loss %q, which names the key %s", h.Status(), i.Err, key)
	}
	if ev := h.Events(); len(ev) != 1 || ev[0].Name != "exception" {
		t.Errorf("lost hold's events %v, want one exception", ev)
	}
	if n := r.tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept after the loss", n)
	}
	ms := r.collect(t)
	if p := histogram(t, ms, "etcdlock_hold_duration_seconds")["end=key_deleted,kind=mutex,name=lost/a"]; p.Count != 1 {
		t.Errorf("holds lost counted %d, want 1", p.Count)
	}
	if c := counts(t, ms, "etcdlock_holders", false); len(c) != 0 {
		t.Errorf("holders %v after the loss, want no series", c)
	}
}

// TestSpansSessionClosed: a session closed with a lock held, never
// unlocked nor watched, ends the hold's span (session_closed, no error
// status: the program closed it) and takes the holder off.
func TestSpansSessionClosed(t *testing.T) {
	r := newRig(t, true)
	ctx := t.Context()
	s, err := etcdlock.NewSession(ctx, cluster.Client(t), etcdlock.WithHooks(r.tel.Hooks()))
	must(t, err)
	m := etcdlock.NewMutex(s, "closed/a")
	must(t, m.Lock(ctx))
	must(t, s.Close())
	holds := r.ended("etcdlock.hold")
	if len(holds) != 1 {
		t.Fatalf("%d hold spans ended by Close, want 1", len(holds))
	}
	if a := attrs(t, holds[0]); a["etcdlock.end"].AsString() != "session_closed" || holds[0].Status().Code != codes.Unset {
		t.Errorf("hold span %v, status %v; want end session_closed, status Unset", holds[0].Attributes(), holds[0].Status())
	}
	if n := r.tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept after Close", n)
	}
	if c := counts(t, r.collect(t), "etcdlock_holders", false); len(c) != 0 {
		t.Errorf("holders %v after Close, want no series", c)
	}
}

// TestSpansFailed: an acquisition the session's end cuts short is an
// error (error.type session_ended); one the caller's ctx cuts short is
// not (outcome canceled).
func TestSpansFailed(t *testing.T) {
	r := newRig(t, true)
	ctx := t.Context()
	cli := cluster.Client(t)
	holder, err := etcdlock.NewSession(ctx, cli)
	must(t, err)
	defer holder.Close()
	h := etcdlock.NewMutex(holder, "failed/a")
	must(t, h.Lock(ctx))

	// After r's hook, this says a Lock has begun.
	started := make(chan struct{}, 1)
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()),
		etcdlock.WithHooks(etcdlock.Hooks{AcquireStart: func(etcdlock.AcquireStartInfo) { started <- struct{}{} }}))
	must(t, err)
	defer s.Close()

	cctx, cancel := context.WithCancel(ctx)
	go func() {
		<-started
		cancel()
	}()
	if err := etcdlock.NewMutex(s, "failed/a").Lock(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with its ctx canceled: %v", err)
	}

	done := make(chan error, 1)
	go func() { done <- etcdlock.NewMutex(s, "failed/a").Lock(ctx) }()
	<-started
	_, err = cli.Revoke(ctx, s.Lease())
	must(t, err)
	var lerr error
	select {
	case lerr = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Lock still waiting 20s after its session's lease was revoked")
	}
	if !errors.Is(lerr, etcdlock.ErrSessionExpired) {
		t.Fatalf("Lock on a revoked session: %v, want ErrSessionExpired", lerr)
	}

	acq := r.ended("etcdlock.acquire")
	if len(acq) != 2 {
		t.Fatalf("%d acquisition spans, want 2", len(acq))
	}
	c, e := attrs(t, acq[0]), attrs(t, acq[1])
	if c["etcdlock.outcome"].AsString() != "canceled" || acq[0].Status().Code != codes.Unset || c["error.type"].Type() != attribute.INVALID {
		t.Errorf("canceled span: %v, status %v; want outcome canceled, not an error", acq[0].Attributes(), acq[0].Status())
	}
	if e["etcdlock.outcome"].AsString() != "session_ended" || e["error.type"].AsString() != "session_ended" ||
		acq[1].Status().Code != codes.Error || acq[1].Status().Description != lerr.Error() {
		t.Errorf("session_ended span: %v, status %v; want outcome and error.type session_ended, Error %q",
			acq[1].Attributes(), acq[1].Status(), lerr)
	}
	if n := r.started("etcdlock.hold"); n != 0 {
		t.Errorf("%d hold spans started, want 0", n)
	}
}

// TestSpansConcurrent: holds of one Semaphore taken and released by
// goroutines on several sessions at once, two at a time, with each
// session's holds of the name sharing its key, are paired with their
// HoldDone: each hold span has its acquisition's token and parent, ends
// while its own Release runs, and none is left.
func TestSpansConcurrent(t *testing.T) {
	r := newRig(t, false)
	ctx := t.Context()
	cli := cluster.Client(t)
	const sessions, goroutines, rounds = 3, 2, 4
	type hold struct {
		parent        trace.SpanID
		before, after time.Time // around its Release
		spanSeen      bool      // a hold span of its token was found
	}
	var (
		mu     sync.Mutex
		held   = map[int64]*hold{} // by token
		wg     sync.WaitGroup
		failed = make(chan error, sessions*goroutines)
	)
	for range sessions {
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()))
		must(t, err)
		defer s.Close()
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sem := etcdlock.NewSemaphore(s, "concurrent/sem", 2)
				for range rounds {
					rctx, request := r.tracer.Start(ctx, "request")
					if err := sem.Acquire(rctx, 1); err != nil {
						failed <- err
						return
					}
					h := &hold{parent: request.SpanContext().SpanID()}
					token := sem.Token()
					h.before = time.Now()
					err := sem.Release(rctx)
					h.after = time.Now()
					request.End()
					if err != nil {
						failed <- err
						return
					}
					mu.Lock()
					held[token] = h
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		t.Fatal(err)
	}
	if len(held) != sessions*goroutines*rounds {
		t.Fatalf("%d tokens, want %d distinct", len(held), sessions*goroutines*rounds)
	}
	acquired := map[int64]sdktrace.ReadOnlySpan{}
	for _, a := range r.ended("etcdlock.acquire") {
		aa := attrs(t, a)
		if aa["etcdlock.outcome"].AsString() == "acquired" {
			acquired[aa["etcdlock.token"].AsInt64()] = a
		}
	}
	holds := r.ended("etcdlock.hold")
	if len(holds) != len(held) {
		t.Errorf("%d hold spans ended, want %d", len(holds), len(held))
	}
	for _, s := range holds {
		sa := attrs(t, s)
		token := sa["etcdlock.token"].AsInt64()
		h, ok := held[token]
		switch {
		case !ok:
			t.Errorf("hold span of token %d: no such hold", token)
		case h.spanSeen:
			t.Errorf("hold span of token %d twice", token)
		case s.Parent().SpanID() != h.parent:
			t.Errorf("hold span of token %d: parent %v, want its request's %v", token, s.Parent().SpanID(), h.parent)
		case s.EndTime().Before(h.before) || s.EndTime().After(h.after):
			t.Errorf("hold span of token %d ended at %v, its Release ran from %v to %v", token, s.EndTime(), h.before, h.after)
		case sa["etcdlock.end"].AsString() != "released" || sa["etcdlock.kind"].AsString() != "semaphore":
			t.Errorf("hold span of token %d: %v", token, s.Attributes())
		case acquired[token] == nil || !acquired[token].EndTime().Equal(s.StartTime()):
			t.Errorf("hold span of token %d starts at %v, not at its acquisition's end", token, s.StartTime())
		}
		if ok {
			h.spanSeen = true
		}
	}
	if n := r.tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept after every hold was released", n)
	}
	ms := r.collect(t)
	for _, g := range []string{"etcdlock_waiters", "etcdlock_holders"} {
		if v := counts(t, ms, g, false)["kind=semaphore"]; v != 0 {
			t.Errorf("%s{kind=semaphore} = %d once all is released, want 0", g, v)
		}
	}
	if p := histogram(t, ms, "etcdlock_hold_duration_seconds")["end=released,kind=semaphore"]; p.Count != uint64(len(held)) {
		t.Errorf("%d holds released counted, want %d", p.Count, len(held))
	}
}

// TestLockNames: without LockNames, no span and no metric carries the
// lock's name, in an attribute, a status or an event, although the loss's
// error quotes its key; with it, the same events show it.
func TestLockNames(t *testing.T) {
	const name = "secret-lock-7"
	for _, names := range []bool{false, true} {
		r := newRig(t, names)
		ctx := t.Context()
		cli := cluster.Client(t)
		lost := make(chan struct{}, 1)
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(r.tel.Hooks()),
			etcdlock.WithHooks(etcdlock.Hooks{HoldDone: func(etcdlock.HoldDoneInfo) { lost <- struct{}{} }}))
		must(t, err)
		defer s.Close()
		m := etcdlock.NewMutex(s, name)
		must(t, m.Lock(ctx))
		if err := etcdlock.NewMutex(s, name).TryLock(ctx); !errors.Is(err, etcdlock.ErrLocked) {
			t.Fatalf("TryLock: %v", err)
		}
		m.Done()
		_, err = cli.Delete(ctx, m.Key())
		must(t, err)
		select {
		case <-lost:
		case <-time.After(10 * time.Second):
			t.Fatal("hold not lost 10s after its key was deleted")
		}
		if err := m.Unlock(ctx); !strings.Contains(fmt.Sprint(err), name) {
			t.Fatalf("Unlock: %v; the test needs an error that names the lock", err)
		}

		var seen []string // where the name shows
		look := func(where string, kvs []attribute.KeyValue) {
			for _, kv := range kvs {
				if kv.Key == "name" || kv.Key == "etcdlock.name" || strings.Contains(kv.Value.Emit(), name) {
					seen = append(seen, fmt.Sprintf("%s: %s=%s", where, kv.Key, kv.Value.Emit()))
				}
			}
		}
		for _, sp := range r.spans.Ended() {
			look(sp.Name(), sp.Attributes())
			if strings.Contains(sp.Status().Description, name) {
				seen = append(seen, sp.Name()+": status "+sp.Status().Description)
			}
			for _, ev := range sp.Events() {
				look(sp.Name()+" event "+ev.Name, ev.Attributes)
			}
		}
		for n, m := range r.collect(t) {
			for _, a := range pointAttrs(m) {
				look(n+"{"+encode(a)+"}", a.ToSlice())
			}
		}
		if names != (len(seen) > 0) {
			t.Errorf("LockNames %v: the name shows in %d places: %q", names, len(seen), seen)
		}
		if names && !slices.ContainsFunc(seen, func(s string) bool { return strings.HasPrefix(s, "etcdlock.hold: status") }) {
			t.Errorf("LockNames true: the lost hold's status does not quote the error: %q", seen)
		}
	}
}

// TestSpansNotSampled: a hold whose span is not recording (its trace not
// sampled) is not kept, so that such a hold costs nothing; the
// metrics are recorded all the same.
func TestSpansNotSampled(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans), sdktrace.WithSampler(sdktrace.NeverSample()))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tel, err := etcdlockotel.New(etcdlockotel.Options{MeterProvider: mp, TracerProvider: tp})
	must(t, err)
	ctx := t.Context()
	s, err := etcdlock.NewSession(ctx, cluster.Client(t), etcdlock.WithHooks(tel.Hooks()))
	must(t, err)
	defer s.Close()
	m := etcdlock.NewMutex(s, "sampled/not")
	must(t, m.Lock(ctx))
	if n := tel.OpenHolds(); n != 0 {
		t.Errorf("%d hold spans kept while held, not sampled: want 0", n)
	}
	must(t, m.Unlock(ctx))
	if n := len(spans.Started()); n != 0 {
		t.Errorf("%d spans recorded, none sampled", n)
	}
	r := &rig{tel: tel, reader: reader}
	if p := histogram(t, r.collect(t), "etcdlock_hold_duration_seconds")["end=released,kind=mutex"]; p.Count != 1 {
		t.Errorf("holds counted %d, want 1", p.Count)
	}
}

// TestGlobalProviders: without providers in Options, a Telemetry uses the
// global ones, and so those set after New (on the first run of the test
// in a process: the global providers can be set only once).
func TestGlobalProviders(t *testing.T) {
	tel, err := etcdlockotel.New(etcdlockotel.Options{LockNames: true})
	must(t, err)
	spans, reader := globalProviders()
	name := fmt.Sprintf("global/%d", time.Now().UnixNano()) // this run's events

	ctx := t.Context()
	s, err := etcdlock.NewSession(ctx, cluster.Client(t), etcdlock.WithHooks(tel.Hooks()))
	must(t, err)
	defer s.Close()
	m := etcdlock.NewMutex(s, name)
	must(t, m.Lock(ctx))
	must(t, m.Unlock(ctx))
	r := &rig{tel: tel, spans: spans, reader: reader}
	n := 0
	for _, sp := range append(r.ended("etcdlock.acquire"), r.ended("etcdlock.hold")...) {
		if attrs(t, sp)["etcdlock.name"].AsString() == name {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d spans of %s through the global provider, want 2 (acquisition, hold)", n, name)
	}
	if p := histogram(t, r.collect(t), "etcdlock_acquire_duration_seconds")["kind=mutex,name="+name+",outcome=acquired"]; p.Count != 1 {
		t.Errorf("acquisitions of %s counted %d through the global provider, want 1", name, p.Count)
	}
}

// globalProviders sets the global providers, once, and returns where
// their spans and metrics go.
var globalProviders = sync.OnceValues(func() (*tracetest.SpanRecorder, *sdkmetric.ManualReader) {
	spans := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	return spans, reader
})
