package bench_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/bench"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
)

// scale runs the benchmarks of bench.ScaleScenarios and idle sessions
// (BenchmarkScale…): minutes each, so they are left out unless asked for:
//
//	go test -run '^$' -bench Scale -benchtime 1x -timeout 60m ./bench/ -scale
var scale = flag.Bool("scale", false, "run the scale benchmarks (minutes each)")

// The clusters start on first use, so that `go test ./...` without -bench
// starts none, and stop in TestMain.
var clusters struct {
	mu   sync.Mutex // guards dir, envs
	dir  string
	envs map[int]*bench.Env // by number of members
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	code := m.Run()
	clusters.mu.Lock()
	for _, e := range clusters.envs {
		e.Close()
	}
	if clusters.dir != "" {
		os.RemoveAll(clusters.dir)
	}
	clusters.mu.Unlock()
	if code != 0 {
		return code
	}
	// Every session and client the scenarios opened must be closed, and
	// their goroutines gone.
	if err := leakcheck.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// env returns the cluster of the given size, started on first use.
func env(tb testing.TB, members int) *bench.Env {
	tb.Helper()
	clusters.mu.Lock()
	defer clusters.mu.Unlock()
	if e := clusters.envs[members]; e != nil {
		return e
	}
	if clusters.dir == "" {
		dir, err := etcdtest.MkdirTemp()
		if err != nil {
			tb.Fatal(err)
		}
		clusters.dir = dir
		clusters.envs = make(map[int]*bench.Env)
	}
	e, err := bench.NewEnv(filepath.Join(clusters.dir, fmt.Sprintf("members-%d", members)), members)
	if err != nil {
		tb.Fatal(err)
	}
	clusters.envs[members] = e
	return e
}

// benchScenario runs the scenario called name on one member and on three,
// each time for this library, then for etcd's Mutex, then for this
// module's concurrency package where the scenario runs for it: with
// -count, they alternate. Under -short, the scenarios not marked Short
// (fifo-1000) are skipped.
//
// ns/op, B/op and allocs/op are per operation of the scenario (for the
// FIFO queues, per handoff, although b.N counts queues drained); B/op and
// allocs/op are the whole process's (clients only: etcd runs apart).
func benchScenario(b *testing.B, name string) {
	sc, ok := bench.Lookup(name)
	if !ok {
		b.Fatalf("no scenario %q", name)
	}
	for _, members := range []int{1, 3} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			if testing.Short() && !sc.Short {
				b.Skip("skipped under -short")
			}
			e := env(b, members)
			for _, impl := range bench.AllImpls {
				if !sc.RunsFor(impl.Name) {
					continue
				}
				b.Run("impl="+impl.Name, func(b *testing.B) {
					runScenario(b, e, sc, impl)
				})
			}
		})
	}
}

func runScenario(b *testing.B, e *bench.Env, sc bench.Scenario, impl bench.Impl) {
	b.StopTimer() // the scenario starts it around what it measures
	b.ReportAllocs()
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	r, err := sc.Run(ctx, e, impl, b.N, b)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.NsPerOp(), "ns/op")
	b.ReportMetric(r.AllocsPerOp(), "allocs/op")
	b.ReportMetric(r.BytesPerOp(), "B/op")
	b.ReportMetric(r.RPCsPerOp(), "rpcs/op")
	b.ReportMetric(r.KeepAlivesPerOp(), "keepalives/op")
	b.ReportMetric(r.RevsPerOp(), "revs/op")
	switch sc.Unit {
	case "acquisition", "handoff":
		b.ReportMetric(float64(r.Ops)/r.Elapsed.Seconds(), "acq/s")
	}
	if r.Release > 0 {
		b.ReportMetric(r.ReleasePerOp(), "release-ns/op")
	}
	per := "waiter"
	if sc.Unit == "held lock" {
		per = "held"
	}
	if r.ServerCPU > 0 && (sc.Unit == "handoff" || sc.Unit == "held lock" || sc.Unit == "queue read" || sc.Unit == bench.ManyNamesUnit) {
		// The members' CPU time, in 10ms ticks: meaningful over the
		// seconds a queue or 10 000 Locks take, not for the short
		// scenarios.
		b.ReportMetric(r.ServerMicrosPerOp(), "server-us/op")
	}
	if sc.Unit == bench.ManyNamesUnit {
		// This process's CPU time: the clients are where the many-names
		// scenarios tell the implementations apart.
		b.ReportMetric(r.ClientCPUPerOp()/1e3, "client-us/op")
	}
	if q := r.Queue; q != nil {
		b.ReportMetric(q.ClientHeap+q.Stack, "B/"+per)
		b.ReportMetric(q.Goroutines, "goroutines/"+per)
		b.ReportMetric(q.Growth, "mem-growth")
		if *scale || r.Server != nil {
			b.ReportMetric(q.ClientHeap, "heap-B/"+per)
		}
	}
	if s := r.Server; s != nil {
		// Read from the etcd member: the watch streams it keeps for the
		// whole queue, and its heap (after a GC) and goroutines per waiter.
		b.ReportMetric(s.Streams, "server-streams")
		b.ReportMetric(s.Heap, "server-B/waiter")
		b.ReportMetric(s.Goroutines, "server-goroutines/waiter")
	}
}

// benchScale runs the scenario called name, on one member, if -scale is
// given.
func benchScale(b *testing.B, name string) {
	if !*scale {
		b.Skip("scale benchmarks run with -scale")
	}
	benchOneMember(b, name)
}

// benchOneMember runs the scenario called name on one member, for each
// implementation it runs for.
func benchOneMember(b *testing.B, name string) {
	sc, ok := bench.Lookup(name)
	if !ok {
		b.Fatalf("no scenario %q", name)
	}
	e := env(b, 1)
	for _, impl := range bench.AllImpls {
		if sc.RunsFor(impl.Name) {
			b.Run("impl="+impl.Name, func(b *testing.B) { runScenario(b, e, sc, impl) })
		}
	}
}

// BenchmarkScaleFIFO measures queues of 1000 and 3000 waiters drained
// after the holder releases, on one member: time, RPCs and the members'
// CPU time per handoff, memory and goroutines per waiter. With -scale.
func BenchmarkScaleFIFO(b *testing.B) {
	for _, w := range []int{1000, 3000} {
		b.Run(fmt.Sprintf("waiters=%d", w), func(b *testing.B) { benchScale(b, fmt.Sprintf("fifo-%d", w)) })
	}
}

// BenchmarkScaleWaiters measures what waiters cost the etcd member and
// the client, as BenchmarkWaiters, with 10 000 waiters. With -scale.
func BenchmarkScaleWaiters(b *testing.B) {
	for _, name := range []string{"waiters-8-clients-10000", "waiters-own-client-10000"} {
		b.Run(name, func(b *testing.B) { benchScale(b, name) })
	}
}

// BenchmarkScaleQueueRead measures the read a waiter sends when the key
// ahead of it goes, with 100, 1000 and 3000 keys ahead: the members' CPU
// time per read. With -scale.
func BenchmarkScaleQueueRead(b *testing.B) {
	for _, n := range []int{100, 1000, 3000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) { benchScale(b, fmt.Sprintf("queue-read-%d", n)) })
	}
}

// BenchmarkScaleHeld measures 10 000 locks held at once through 16
// sessions, without and with Done: memory and goroutines per held lock.
// With -scale.
func BenchmarkScaleHeld(b *testing.B) {
	for _, name := range []string{"held-10000", "held-10000-done"} {
		b.Run(name, func(b *testing.B) { benchScale(b, name) })
	}
}

// BenchmarkScaleIdle measures 100 and 1000 idle sessions (TTL 6s, over 4
// clients) for 20s each, as the idle command does: keepalive streams
// opened and renewals sent per second, and the CPU time per renewal of
// the members and of this process. With -scale.
func BenchmarkScaleIdle(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			if !*scale {
				b.Skip("scale benchmarks run with -scale")
			}
			e := env(b, 1)
			for _, impl := range bench.Impls {
				b.Run("impl="+impl.Name, func(b *testing.B) {
					b.StopTimer()
					var r bench.IdleResult
					for range b.N {
						r1, err := bench.Idle(b.Context(), e, impl, n, 4, 6*time.Second, 20*time.Second)
						if err != nil {
							b.Fatal(err)
						}
						r = r.Add(r1)
					}
					b.ReportMetric(r.RenewalsPerSecond(), "renewals/s")
					b.ReportMetric(r.StreamsPerSecond(), "streams/s")
					b.ReportMetric(float64(r.Unary)/r.Window.Seconds(), "unary/s")
					b.ReportMetric(float64(r.ServerCPUPerRenewal())/float64(time.Microsecond), "server-us/renewal")
					b.ReportMetric(float64(r.ServerNetCPUPerRenewal())/float64(time.Microsecond), "server-net-us/renewal")
					b.ReportMetric(float64(r.ClientCPUPerRenewal())/float64(time.Microsecond), "client-us/renewal")
				})
			}
		})
	}
}

// BenchmarkUncontended measures Lock then Unlock with no one else around.
func BenchmarkUncontended(b *testing.B) { benchScenario(b, "uncontended") }

// BenchmarkTryLockHeld measures TryLock on a lock another session holds.
func BenchmarkTryLockHeld(b *testing.B) { benchScenario(b, "trylock-held") }

// BenchmarkContention measures acquisitions by 4 and by 16 contenders, each
// with its own client and session, taking turns. It fails if two are ever
// inside at once.
func BenchmarkContention(b *testing.B) {
	for _, k := range []int{4, 16} {
		b.Run(fmt.Sprintf("contenders=%d", k), func(b *testing.B) {
			benchScenario(b, fmt.Sprintf("contend-%d", k))
		})
	}
}

// BenchmarkFIFO measures the handoffs of queues of 50, 300 and 1000 waiters
// drained after the holder releases. It fails if the order is not FIFO.
func BenchmarkFIFO(b *testing.B) {
	for _, w := range []int{50, 300, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", w), func(b *testing.B) {
			benchScenario(b, fmt.Sprintf("fifo-%d", w))
		})
	}
}

// BenchmarkWaiters measures 1000 waiters on one lock, one session each,
// on one member: their sessions share 8 clients (as in a service that
// makes a session per job), or each has its own client. It reports what
// their waiting costs the etcd member (the watch streams it keeps open,
// its heap after a GC and its goroutines per waiter) and the client (heap
// and goroutines per waiter), then drains the queue (time and RPCs per
// handoff). It is slow and skipped under -short.
func BenchmarkWaiters(b *testing.B) {
	for _, name := range []string{"waiters-8-clients-1000", "waiters-own-client-1000"} {
		b.Run(name, func(b *testing.B) {
			if testing.Short() {
				b.Skip("slow: skipped under -short")
			}
			benchOneMember(b, name)
		})
	}
}

// BenchmarkRWMutex measures our RWMutex against etcd's recipe RWMutex:
// RLock+RUnlock and Lock+Unlock alone, 16 readers with 2 writers
// contending, and 50 readers admitted at once by a writer's Unlock. It
// fails if a writer is ever inside with anyone.
func BenchmarkRWMutex(b *testing.B) {
	for _, name := range []string{"rw-uncontended-read", "rw-uncontended-write", "rw-16r2w", "rw-readers-50"} {
		b.Run(name, func(b *testing.B) { benchScenario(b, name) })
	}
}

// BenchmarkSemaphore measures our Semaphore (etcd has none): Acquire+Release
// alone, 16 contenders for 4 permits, and queues of 100 and 1000 waiters
// for 1 of 4 permits behind a holder of all 4. It fails if more than 4 are
// ever inside, or never more than one in the contention.
func BenchmarkSemaphore(b *testing.B) {
	for _, name := range []string{"sem-uncontended", "sem-4x16", "sem-fifo-100", "sem-fifo-1000"} {
		b.Run(name, func(b *testing.B) { benchScenario(b, name) })
	}
}

// BenchmarkLockDelay: our Mutex with WithLockDelay against our Mutex
// without, uncontended and with 4 contenders.
func BenchmarkLockDelay(b *testing.B) {
	for _, name := range []string{"delay-uncontended", "delay-contend-4"} {
		b.Run(name, func(b *testing.B) { benchScenario(b, name) })
	}
}

// BenchmarkMinHold: our Mutex with WithMinHold against our Mutex
// without, uncontended.
func BenchmarkMinHold(b *testing.B) { benchScenario(b, "minhold-uncontended") }

// BenchmarkManyNames measures a lock per entity: 16, 64 and 256
// goroutines of one process, each locking and unlocking fresh names, none
// contended, on one session or on a session each (all on one client), for
// every lock and for the floor (a Put and a Delete of the key). The time,
// RPCs, revisions, allocations and CPU times are per Lock+Unlock, although
// b.N counts rounds of one per goroutine. Under -short only the 16 run.
// A CPU profile of etcdlock's client with 64 goroutines on one session
// (1200 rounds: about 40 s, 1500 samples), then an allocation profile that
// records every allocation (slower: fewer rounds):
//
//	go test -run '^$' -bench 'ManyNames/many-names-64$/members=1/impl=etcdlock$' -benchtime 1200x -cpuprofile cpu.out ./bench/
//	go test -run '^$' -bench 'ManyNames/many-names-64$/members=1/impl=etcdlock$' -benchtime 100x -memprofile mem.out -memprofilerate 1 ./bench/
func BenchmarkManyNames(b *testing.B) {
	for _, g := range []int{16, 64, 256} {
		for _, suffix := range []string{"", "-sessions"} {
			name := fmt.Sprintf("many-names-%d%s", g, suffix)
			b.Run(name, func(b *testing.B) { benchScenario(b, name) })
		}
	}
}

// BenchmarkMultiMutex: one hold over two names, our MultiMutex against a
// Mutex per name locked in sorted order (etcd's, and ours).
func BenchmarkMultiMutex(b *testing.B) {
	for _, name := range []string{"multi-2-uncontended", "multi-2-contend-8", "pair-2-uncontended", "pair-2-contend-8"} {
		b.Run(name, func(b *testing.B) { benchScenario(b, name) })
	}
}
