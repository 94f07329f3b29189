// Package bench compares this module's Mutex with etcd's
// concurrency.Mutex, its RWMutex with etcd's recipe RWMutex, and its
// Semaphore with its own Mutex, on the same etcd (server processes started by
// internal/etcdtest, fsync on), from one process, one implementation after
// the other, on one member or three. The scenarios of a Mutex and of an
// Election (uncontended, trylock-held, contend-…, fifo-…, elect-…,
// many-names-…) also run for this module's concurrency package, etcd's
// API on our queue (Compat, "etcdlock-compat"), which should cost what
// our own API costs.
//
// The scenarios are shared by the package's benchmarks and by the compare
// command (go run ./bench/cmd/compare), which alternates the two
// implementations over rounds and prints medians:
//
//   - uncontended: Lock then Unlock, nobody else around;
//   - trylock-held: TryLock on a lock another session holds;
//   - contend-4, contend-16: contenders, each with its own client and
//     session, taking turns; the time is per acquisition;
//   - fifo-50, fifo-300, fifo-1000: a queue of waiters, each with its own session
//     (sharing 8 or 16 clients), drained after the holder releases; the
//     time is per handoff;
//   - waiters-8-clients-1000, waiters-own-client-1000: fifo's queue of
//     1000 waiters, one session each, the sessions sharing 8 clients (as
//     in a service that makes a session per job) or each on its own
//     client. Before the drain they measure what the waiting costs the
//     etcd members, read from each member's /metrics: the watch streams
//     they keep open for the whole queue, and their heap (after a GC) and
//     goroutines per waiter; and the client's heap, stacks and goroutines
//     per waiter. Every session is made before the first snapshot: the
//     figures are the waiting alone. The benchmarks run them on one
//     member only (BenchmarkWaiters, skipped under -short);
//   - rw-uncontended-read, rw-uncontended-write: RLock+RUnlock and
//     Lock+Unlock of our RWMutex and of etcd's recipe RWMutex
//     (client/v3/experimental/recipes), nobody else around;
//   - rw-16r2w: 16 readers and 2 writers, each with its own client and
//     session, looping; the time is per acquisition of either kind;
//   - sem-uncontended, sem-4x16: our Semaphore (etcd has none), alone
//     (1 of 4 permits) and with 16 contenders for 4 permits of 1. Their
//     Impls is etcdlock only, and their Versus compares them with our own
//     Mutex in uncontended and contend-16;
//   - sem-fifo-100, sem-fifo-1000: fifo's queue of waiters for 1 of 4
//     permits behind a holder of all 4; up to 4 hold at once (the order
//     in which holders record themselves is not checked: it is not the
//     order of admission). Compared with fifo-50 and sem-fifo-100;
//   - multi-2-uncontended, multi-2-contend-8: one hold over two names, our
//     MultiMutex against etcd's Mutexes locked in sorted order, alone and
//     with 8 contenders (half naming the names in the other order);
//     pair-2-uncontended, pair-2-contend-8: our Mutexes locked in sorted
//     order, compared with our MultiMutex;
//   - lead-yield-3: three Lead loops made YieldOnRequest; the time from
//     RequestRelease to the next leader's fn starting, which must be the
//     next in line (ours only).
//   - delay-uncontended, delay-contend-4: our Mutex made WithLockDelay
//     (nothing crashes: what the record costs), compared with our Mutex
//     without a delay in uncontended and contend-4.
//   - minhold-uncontended: our Mutex made WithMinHold(1ms), Lock+Unlock
//     (the release sent by the session once the minimum hold has
//     passed), compared with our Mutex without one in uncontended.
//   - many-names-16, many-names-64, many-names-256: a lock per entity. G
//     goroutines on one Session (one client) each loop Lock+Unlock, every
//     cycle on a fresh name of its own, none contended;
//     many-names-…-sessions: the same with a Session per goroutine, all on
//     one client. Besides the three locks they run Floor, no lock: a Put
//     of the key with the session's lease, then its Delete, the least a
//     lock writes per cycle; compare prints every implementation's time
//     as a multiple of etcd's and of the floor's, and the members' and
//     the clients' CPU time per cycle. Under -short only the 16 run.
//   - write, handoff-floor-50, wake-floor-50: the references of a FIFO
//     handoff, run for Floor only (no lock). write is one fsynced Put by a
//     client of a follower; handoff-floor-50 a bare chain of 50 handoffs
//     (a link watches the key ahead, reads its own key serializably at or
//     after the deletion's revision, and deletes it); wake-floor-50 the
//     same chain without the read. compare prints them in a table of
//     their own, and fifo-50's time as a multiple of write and of
//     handoff-floor-50.
//
// The idle command (go run ./bench/cmd/idle) measures something else:
// what idle sessions cost to keep alive. It runs 100 and 1000 sessions of
// each implementation (TTL 6s) for 20s each and reports the lease
// keepalive streams opened per second and the CPU time per renewal of the
// etcd members (from /proc/<pid>/stat) and of the clients (getrusage). It
// takes a few minutes, and is not part of the benchmarks.
//
// BenchmarkMem measures memory rather than time: the client heap (after a
// GC), stack and goroutines per held lock (with and without Done) and per
// waiter, for 100, 1000 and 10 000 of them, with one session holding (or
// waiting for) every lock, so that what is counted is the lock and not the
// session. It takes a few minutes and is skipped under -short:
//
//	go test -run '^$' -bench Mem -benchtime 1x ./bench/ -args -mem.sizes=100,1000,10000
//
// With -mem.heapprofile=DIR it writes an inuse heap profile of each case
// (read it with go tool pprof -sample_index=inuse_space).
//
// The scale scenarios (ScaleScenarios: fifo-3000, waiters-8-clients-10000,
// waiters-own-client-10000, held-10000, held-10000-done) and 100 and 1000
// idle sessions beside etcd's take minutes and run only with -scale, on
// one member:
//
//	go test -run '^$' -bench Scale -benchtime 1x -timeout 60m ./bench/ -scale
//
// They report, besides the figures below, the members' CPU time per
// handoff or per Lock (server-us/op), memory and goroutines per held lock
// (B/held, heap-B/held, goroutines/held), and for idle sessions the
// renewals and keepalive streams per second and the CPU time per renewal
// of the members and of the clients.
//
// In CI, run the benchmarks with
//
//	go test -run '^$' -bench . -benchtime 3x -short ./bench/
//
// which runs every scenario but the slow ones (fifo-300, fifo-1000,
// sem-fifo-1000, the waiters-… ones, many-names with 64 and 256
// goroutines), on one member and on three. The benchmarks report
// ns/op, B/op and allocs/op per operation (per handoff for the queues,
// although b.N counts queues) and rpcs/op, keepalives/op, revs/op, acq/s,
// B/waiter and goroutines/waiter; the waiters-… ones also heap-B/waiter,
// server-streams, server-B/waiter and server-goroutines/waiter.
//
// The scenarios fail, rather than measure, a lock that lets two holders in
// at once (a writer with anyone, more permits than the capacity) or serves
// a queue out of order.
//
// Each figure is per operation, counted over a window that holds only the
// operations measured:
//
//   - RPCs are the unary calls and streams opened by the scenario's clients
//     (etcdtest.RPCCounter), reported without the lease keepalive streams,
//     which come with time rather than with operations and are reported
//     apart: both etcdlock's sessions and etcd's send their renewals on one
//     stream per client, opened again only when it breaks;
//   - revisions are the store's revision after the window minus before;
//   - allocations are those of the whole process: clients only, since
//     etcd runs in processes of its own;
//   - for the queues, also the memory and goroutines per waiting Mutex:
//     the growth of the process's heap (after a GC) and stacks while the
//     queue forms;
//   - for the queues whose waiters hold one at a time (fifo-…,
//     waiters-…), the time the releasers spent in Unlock (release-ns/op):
//     a handoff is the release, then the next waiter's admission, and the
//     split tells which of the two a change made faster or slower;
//   - the etcd members' watch streams, heap and goroutines are read from
//     their /metrics (etcd_debugging_mvcc_watch_stream_total,
//     go_memstats_heap_alloc_bytes, go_goroutines), medians of 3 readings
//     each after a forced GC: NewEnv starts the members with Go's
//     profiling endpoints on, and /debug/pprof/heap?gc=1 collects.
//
// A waiter counts as queued when its key is in etcd, and the queue as idle
// when the members have no unsynced watcher and the watchers and unary
// RPCs have stopped changing: nothing tells the implementations apart.
package bench
