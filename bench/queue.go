package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fifo returns the scenario of a queue of w waiters, each with its own
// session (spread over a few clients), drained after the holder releases.
// Every waiter unlocks as soon as it holds the lock, so the window measures
// w handoffs back to back. The waiters must get the lock in the order of
// their keys' create revisions, one at a time, or the run fails.
func fifo(w int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		var sum Result
		for range n {
			r, err := drain(ctx, env, impl, w, timer)
			if err != nil {
				return Result{}, err
			}
			sum = sum.Add(r)
		}
		return sum, nil
	}
}

// clientsFor is how many clients w waiters share.
func clientsFor(w int) int {
	if w <= 100 {
		return 8
	}
	return 16
}

func drain(ctx context.Context, env *Env, impl Impl, w int, timer Timer) (Result, error) {
	cs, err := env.newClients(clientsFor(w), 0)
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	name := env.lockName(fmt.Sprintf("fifo-%d", w), impl)
	hs, err := newSessions(ctx, impl, cs.clis, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeSessions(hs)
	holder := hs[0].NewMutex(name)
	if err := holder.Lock(ctx); err != nil {
		return Result{}, fmt.Errorf("bench: holder Lock: %w", err)
	}

	wctx, cancel := context.WithCancel(ctx)
	q := &queue{env: env, cs: cs, name: name, cancel: cancel}
	defer q.close() // stops the waiters, then closes their sessions

	// Queue the waiters in three parts, measuring memory after each, with
	// allocations sampled densely in the heap profile until the queue is
	// complete. The first part, at least one waiter per client, takes the
	// clients' one-time costs (watch and keepalive streams); the two others
	// tell what one more waiter costs, early and late in the queue.
	prevRate := runtime.MemProfileRate
	runtime.MemProfileRate = profileRate
	defer func() { runtime.MemProfileRate = prevRate }()
	first := max(len(cs.clis), w/10)
	second := (w - first) / 2
	parts := []int{first, second, w - first - second}
	var mems []memSnapshot
	for _, n := range parts {
		if err := q.add(ctx, wctx, impl, n); err != nil {
			return Result{}, err
		}
		mems = append(mems, takeMemSnapshot())
	}
	runtime.MemProfileRate = prevRate

	keys, err := env.queue(ctx, name)
	if err != nil {
		return Result{}, err
	}
	if len(keys) != w+1 {
		return Result{}, fmt.Errorf("bench: %d keys in the queue, want %d", len(keys), w+1)
	}

	// The window opens before the holder's release and closes in the last
	// waiter's hold, before its release: it spans exactly w handoffs.
	mt := newMeter(env, &cs.rpcs, timer)
	q.setMeter(mt, w)
	if err := mt.start(ctx); err != nil {
		return Result{}, err
	}
	if err := holder.Unlock(ctx); err != nil {
		return Result{}, fmt.Errorf("bench: holder Unlock: %w", err)
	}
	if err := q.wait(ctx); err != nil {
		return Result{}, err
	}

	if err := checkOrder(q.order, keys); err != nil {
		return Result{}, err
	}
	res := mt.result()
	res.Queue = queueCost(int64(parts[1]), int64(parts[2]), mems[0], mems[1], mems[2])
	return res, nil
}

// checkOrder checks that the waiters got the lock in the order of the
// queue's keys: keys[0] is the holder's, and order must be keys[1:].
func checkOrder(order, keys []string) error {
	if len(order) != len(keys)-1 {
		return fmt.Errorf("bench: %d waiters got the lock, want %d", len(order), len(keys)-1)
	}
	for i, k := range order {
		if k != keys[i+1] {
			return fmt.Errorf("bench: FIFO order violated: handoff %d went to %s, place %d in the queue, before %s",
				i+1, k, slices.Index(keys, k), keys[i+1])
		}
	}
	return nil
}

// A queue is the waiters of one FIFO run: each calls Lock in its own
// goroutine and, once it holds the lock, records itself and unlocks.
type queue struct {
	env    *Env
	cs     *clients
	name   string
	cancel context.CancelFunc // makes the waiters' Lock return
	ss     []Session

	wg     sync.WaitGroup
	inside atomic.Int64 // waiters holding the lock right now

	mu    sync.Mutex // guards mt, want, order, err
	mt    *meter     // stopped by the want-th waiter to get the lock
	want  int
	order []string // keys of the waiters in the order they got the lock
	err   error    // the first error of a waiter
}

// setMeter makes the want-th waiter to get the lock stop mt while it holds
// the lock.
func (q *queue) setMeter(mt *meter, want int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mt, q.want = mt, want
}

// add starts n more waiters with new sessions and returns once they are all
// queued and idle.
func (q *queue) add(ctx, wctx context.Context, impl Impl, n int) error {
	ss, err := newSessions(ctx, impl, q.cs.clis, n)
	if err != nil {
		return err
	}
	q.ss = append(q.ss, ss...)
	for _, s := range ss {
		m, key := s.NewMutex(q.name), waiterKey(q.name, s.Lease())
		q.wg.Go(func() { q.waiter(wctx, m, key) })
	}
	return q.settle(ctx, int64(len(q.ss)+1))
}

func (q *queue) waiter(ctx context.Context, m Mutex, key string) {
	if err := m.Lock(ctx); err != nil {
		q.fail(fmt.Errorf("bench: waiter Lock: %w", err))
		return
	}
	if in := q.inside.Add(1); in != 1 {
		q.fail(fmt.Errorf("bench: mutual exclusion violated: %d holders inside at once", in))
		return
	}
	q.mu.Lock()
	q.order = append(q.order, key)
	mt, last := q.mt, len(q.order) == q.want
	q.mu.Unlock()
	if last {
		if err := mt.stop(ctx, int64(q.want)); err != nil {
			q.fail(err)
			return
		}
	}
	q.inside.Add(-1)
	if err := m.Unlock(ctx); err != nil {
		q.fail(fmt.Errorf("bench: waiter Unlock: %w", err))
	}
}

// fail records err and makes all waiters return.
func (q *queue) fail(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
	q.cancel()
}

func (q *queue) failed() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.err
}

// settle returns once want keys (holder and waiters) are under the lock's
// prefix and the waiters are idle: no watcher on the server is still
// catching up, and for a while neither the number of watchers nor the
// number of unary RPCs of the clients changed. It tells nothing apart by
// implementation.
func (q *queue) settle(ctx context.Context, want int64) error {
	const quiet = 150 * time.Millisecond
	err := poll(ctx, 10*time.Millisecond, func() (bool, error) {
		if err := q.failed(); err != nil {
			return false, err
		}
		n, err := q.env.countKeys(ctx, q.name)
		if n > want {
			err = fmt.Errorf("bench: %d keys under %s/, want %d", n, q.name, want)
		}
		return n == want, err
	})
	if err != nil {
		return err
	}
	var (
		lastWatchers, lastRPCs int64 = -1, -1
		since                  time.Time
	)
	return poll(ctx, 30*time.Millisecond, func() (bool, error) {
		if err := q.failed(); err != nil {
			return false, err
		}
		watchers, slow, err := serverWatchers()
		if err != nil {
			return false, err
		}
		rpcs := q.cs.rpcs.all.Unary()
		if slow > 0 || watchers != lastWatchers || rpcs != lastRPCs {
			lastWatchers, lastRPCs, since = watchers, rpcs, time.Now()
			return false, nil
		}
		return time.Since(since) >= quiet, nil
	})
}

// wait waits until every waiter has held and released the lock.
func (q *queue) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		q.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return q.failed()
	case <-ctx.Done():
		return fmt.Errorf("bench: queue not drained: %w", ctx.Err())
	}
}

// close makes the waiters return, waits for them and closes their sessions.
func (q *queue) close() {
	q.cancel()
	q.wg.Wait()
	closeSessions(q.ss)
}

// serverWatchers returns the number of watchers of the embedded members of
// this process, and how many of them are unsynced (catching up with the
// store, their events delayed), from etcd's metrics.
func serverWatchers() (watchers, slow int64, err error) {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		return 0, 0, fmt.Errorf("bench: gather metrics: %w", err)
	}
	found := 0
	for _, mf := range mfs {
		var dst *int64
		switch mf.GetName() {
		case "etcd_debugging_mvcc_watcher_total":
			dst = &watchers
		case "etcd_debugging_mvcc_slow_watcher_total":
			dst = &slow
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			*dst += int64(m.GetGauge().GetValue())
		}
		found++
	}
	if found != 2 {
		return 0, 0, errors.New("bench: etcd's watcher metrics not found")
	}
	return watchers, slow, nil
}

// memSnapshot is the memory of the process at one moment, after a GC.
type memSnapshot struct {
	clientHeap int64 // heap in use allocated outside the etcd server
	heap       int64 // heap in use
	stack      int64 // goroutine stacks in use
	goroutines int64
}

// profileRate is the heap profile's sampling rate while a queue forms: one
// sample per 4 KiB allocated on average, dense enough for a few percent
// of error over hundreds of waiters, sparse enough that the embedded etcd,
// which allocates under the same profiler, keeps up. Sampling every
// allocation slowed the process so much that etcd timed requests out.
const profileRate = 4096

// takeMemSnapshot collects garbage and measures. It reads the heap profile
// as sampled at profileRate; allocations from before the rate was set are
// scaled the same way in every snapshot, and cancel out.
func takeMemSnapshot() memSnapshot {
	// The heap profile is published at the end of a cycle's sweep: two
	// cycles make sure it includes everything allocated before this call.
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnapshot{
		clientHeap: clientHeapInUse(),
		heap:       int64(ms.HeapAlloc),
		stack:      int64(ms.StackInuse),
		goroutines: int64(runtime.NumGoroutine()),
	}
}

// clientHeapInUse estimates from the heap profile the bytes in use that
// were allocated outside the embedded etcd server: not in etcd's server
// packages, raft, bbolt, gRPC's server side, or the members' peer HTTP.
// Samples are scaled up as pprof does, for the current sampling rate.
func clientHeapInUse() int64 {
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+64)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	rate := float64(runtime.MemProfileRate)
	var sum float64
	for i := range recs {
		r := &recs[i]
		inuse := r.InUseBytes()
		if inuse == 0 || r.AllocObjects == 0 || serverStack(r.Stack()) {
			continue
		}
		// An object of size s is sampled with probability 1-exp(-s/rate).
		avg := float64(r.AllocBytes) / float64(r.AllocObjects)
		sum += float64(inuse) / (1 - math.Exp(-avg/rate))
	}
	return int64(sum)
}

// serverFuncPrefixes name the functions that only the server side runs.
var serverFuncPrefixes = []string{
	"go.etcd.io/etcd/server/",
	"go.etcd.io/etcd/pkg/",
	"go.etcd.io/raft/",
	"go.etcd.io/bbolt",
	"github.com/soheilhy/cmux",
	"google.golang.org/grpc.(*Server)",
	"google.golang.org/grpc.(*serverStream)",
	"google.golang.org/grpc/internal/transport.(*http2Server)",
	"google.golang.org/grpc/internal/transport.NewServerTransport",
	"google.golang.org/grpc/internal/transport.newHTTP2Server",
	"net/http.",
}

func serverStack(stk []uintptr) bool {
	frames := runtime.CallersFrames(stk)
	for {
		f, more := frames.Next()
		for _, p := range serverFuncPrefixes {
			if strings.HasPrefix(f.Function, p) {
				return true
			}
		}
		if !more {
			return false
		}
	}
}

// queueCost turns three snapshots, after the queue's first part, after its
// second (n1 more waiters) and after its third (n2 more), into costs per
// waiter of the second and third parts.
func queueCost(n1, n2 int64, m0, m1, m2 memSnapshot) *QueueCost {
	n := float64(n1 + n2)
	c := &QueueCost{
		Waiters:     n1 + n2,
		ClientHeap:  float64(m2.clientHeap-m0.clientHeap) / n,
		Stack:       float64(m2.stack-m0.stack) / n,
		Goroutines:  float64(m2.goroutines-m0.goroutines) / n,
		ProcessHeap: float64(m2.heap-m0.heap) / n,
	}
	early := float64(m1.clientHeap-m0.clientHeap) / float64(n1)
	late := float64(m2.clientHeap-m1.clientHeap) / float64(n2)
	if early > 0 {
		c.Growth = late / early
	}
	return c
}
