package bench

import (
	"context"
	"runtime"
	"sync"
	"time"
)

// A Timer is the part of *testing.B a scenario drives, so that a benchmark
// times only what the scenario measures. The compare command passes nil.
type Timer interface {
	StartTimer()
	StopTimer()
}

// Result is what one run of a scenario measured, summed over its windows.
type Result struct {
	// Ops is the number of operations measured: Lock+Unlock pairs,
	// TryLocks, acquisitions, or handoffs (see Scenario.Unit).
	Ops     int64
	Elapsed time.Duration
	// RPCs is the number of unary calls plus streams opened by the run's
	// clients; KeepAlives is how many of those streams were lease
	// keepalives (they come with time, not with operations).
	RPCs, KeepAlives int64
	// Revs is the number of store revisions consumed.
	Revs int64
	// Allocs and AllocBytes are the heap allocations of the whole process
	// (clients only: etcd runs in processes of its own).
	Allocs, AllocBytes uint64
	// ServerCPU is the user+system CPU time of the etcd members (0 where
	// it cannot be read: off Linux). It counts in 10ms ticks: meaningful
	// for windows of seconds (the queues), not for short ones.
	ServerCPU time.Duration
	// ClientCPU is the CPU time of this process (the clients), 0 where it
	// cannot be read.
	ClientCPU time.Duration
	// Release is the time the releasers spent in Unlock within the window,
	// for the FIFO scenarios whose waiters hold one at a time (0 for the
	// others): a handoff is a release, then the admission of the next
	// waiter, and Elapsed - Release is the admissions' time.
	Release time.Duration

	// Queue is set by the FIFO scenarios: the cost of the waiting Mutexes.
	Queue *QueueCost
	// Server is set by the scenarios that read what the waiting costs the
	// etcd members (the waiters-… ones).
	Server *ServerCost
}

// QueueCost is the memory and goroutines that waiting Mutexes take, per
// waiter. It is measured over the waiters queued after a first few (at
// least one per client, taking the clients' one-time costs), split in two
// halves queued one after the other.
type QueueCost struct {
	// Waiters is the number of waiters measured.
	Waiters int64
	// ClientHeap is the heap in use per waiter after a GC: clients,
	// sessions, Mutexes, the goroutines calling Lock. The etcd members are
	// processes of their own, so all of this process's heap is the clients'.
	ClientHeap float64
	// Stack is the goroutine stack memory per waiter: the growth of the
	// runtime's stack spans, which also keep freed stacks for reuse, so it
	// is coarse for a short queue.
	Stack float64
	// Goroutines per waiter, the one blocked in Lock included.
	Goroutines float64
	// Growth is the client heap per waiter of the second half over that of
	// the first half: about 1 when a waiter's cost does not depend on the
	// length of the queue. It is noisy for a short queue (tens of waiters)
	// and meaningful for a long one.
	Growth float64
}

// Add returns the sum of r and o. Queue and server costs are averaged.
func (r Result) Add(o Result) Result {
	s := Result{
		Ops:        r.Ops + o.Ops,
		Elapsed:    r.Elapsed + o.Elapsed,
		RPCs:       r.RPCs + o.RPCs,
		KeepAlives: r.KeepAlives + o.KeepAlives,
		Revs:       r.Revs + o.Revs,
		Allocs:     r.Allocs + o.Allocs,
		AllocBytes: r.AllocBytes + o.AllocBytes,
		ServerCPU:  r.ServerCPU + o.ServerCPU,
		ClientCPU:  r.ClientCPU + o.ClientCPU,
		Release:    r.Release + o.Release,
		Queue:      r.Queue,
		Server:     r.Server.add(o.Server),
	}
	switch {
	case s.Queue == nil:
		s.Queue = o.Queue
	case o.Queue != nil:
		q := *r.Queue
		n, m := float64(r.Queue.Waiters), float64(o.Queue.Waiters)
		avg := func(a, b float64) float64 { return (a*n + b*m) / (n + m) }
		q.Waiters += o.Queue.Waiters
		q.ClientHeap = avg(q.ClientHeap, o.Queue.ClientHeap)
		q.Stack = avg(q.Stack, o.Queue.Stack)
		q.Goroutines = avg(q.Goroutines, o.Queue.Goroutines)
		q.Growth = avg(q.Growth, o.Queue.Growth)
		s.Queue = &q
	}
	return s
}

// PerOp returns x divided by the number of operations.
func (r Result) PerOp(x float64) float64 {
	if r.Ops == 0 {
		return 0
	}
	return x / float64(r.Ops)
}

// NsPerOp returns the time per operation in nanoseconds.
func (r Result) NsPerOp() float64 { return r.PerOp(float64(r.Elapsed)) }

// RPCsPerOp returns the RPCs per operation, lease keepalives excluded.
func (r Result) RPCsPerOp() float64 { return r.PerOp(float64(r.RPCs - r.KeepAlives)) }

// KeepAlivesPerOp returns the lease keepalive streams opened per operation.
func (r Result) KeepAlivesPerOp() float64 { return r.PerOp(float64(r.KeepAlives)) }

// RevsPerOp returns the store revisions consumed per operation.
func (r Result) RevsPerOp() float64 { return r.PerOp(float64(r.Revs)) }

// AllocsPerOp returns the process's heap allocations per operation.
func (r Result) AllocsPerOp() float64 { return r.PerOp(float64(r.Allocs)) }

// BytesPerOp returns the process's bytes allocated per operation.
func (r Result) BytesPerOp() float64 { return r.PerOp(float64(r.AllocBytes)) }

// ServerCPUPerOp and ClientCPUPerOp return the CPU time, in nanoseconds,
// that the etcd members and the clients used per operation.
func (r Result) ServerCPUPerOp() float64 { return r.PerOp(float64(r.ServerCPU)) }

func (r Result) ClientCPUPerOp() float64 { return r.PerOp(float64(r.ClientCPU)) }

// ReleasePerOp returns the time in Unlock per operation, in nanoseconds
// (see Result.Release).
func (r Result) ReleasePerOp() float64 { return r.PerOp(float64(r.Release)) }

// ServerMicrosPerOp returns the members' CPU time per operation, in µs.
func (r Result) ServerMicrosPerOp() float64 {
	return r.PerOp(float64(r.ServerCPU) / float64(time.Microsecond))
}

// A meter measures windows of a run: elapsed time, RPCs of the run's
// clients, revisions of the store and allocations of the process. start
// and stop alternate; they may be called from any goroutine, one at a time.
type meter struct {
	env   *Env
	rpcs  *rpcCount
	timer Timer // may be nil

	mu     sync.Mutex // guards the fields below
	res    Result
	t0     time.Time
	rpc0   int64
	ka0    int64
	rev0   int64
	alloc0 runtime.MemStats
	cpu0   time.Duration // members' CPU time; < 0 when it cannot be read
	cli0   time.Duration // this process's CPU time; < 0 when it cannot be read
}

func newMeter(env *Env, rpcs *rpcCount, timer Timer) *meter {
	return &meter{env: env, rpcs: rpcs, timer: timer}
}

// start opens a window. The revision is read before the clock starts.
func (m *meter) start(ctx context.Context) error {
	return m.startAfter(ctx, func() error { return nil })
}

// startAfter opens a window once fn has returned: the revisions fn
// consumes count, its time, RPCs and allocations do not. The revision is
// read before fn runs, so that no RPC sits between fn's return and the
// clock's start.
func (m *meter) startAfter(ctx context.Context, fn func() error) error {
	rev, err := m.env.revision(ctx)
	if err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rev0 = rev
	m.cpu0, m.cli0 = readServerCPU(m.env), readClientCPU()
	runtime.ReadMemStats(&m.alloc0)
	m.rpc0, m.ka0 = m.rpcs.all.Total(), m.rpcs.keepAlive.Load()
	if m.timer != nil {
		m.timer.StartTimer()
	}
	m.t0 = time.Now()
	return nil
}

// stop closes the window opened by start and counts ops operations in it.
// The revision is read after the clock stopped.
func (m *meter) stop(ctx context.Context, ops int64) error {
	m.mu.Lock()
	elapsed := time.Since(m.t0)
	if m.timer != nil {
		m.timer.StopTimer()
	}
	rpcs, ka := m.rpcs.all.Total(), m.rpcs.keepAlive.Load()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.res.Ops += ops
	m.res.Elapsed += elapsed
	m.res.RPCs += rpcs - m.rpc0
	m.res.KeepAlives += ka - m.ka0
	m.res.Allocs += ms.Mallocs - m.alloc0.Mallocs
	m.res.AllocBytes += ms.TotalAlloc - m.alloc0.TotalAlloc
	if cpu := readServerCPU(m.env); cpu >= 0 && m.cpu0 >= 0 {
		m.res.ServerCPU += cpu - m.cpu0
	}
	if cpu := readClientCPU(); cpu >= 0 && m.cli0 >= 0 {
		m.res.ClientCPU += cpu - m.cli0
	}
	rev0 := m.rev0
	m.mu.Unlock()

	rev, err := m.env.revision(ctx)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.res.Revs += rev - rev0
	m.mu.Unlock()
	return nil
}

// result returns the sums of the windows so far.
func (m *meter) result() Result {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.res
}

// readServerCPU returns the CPU time the members of env have used, or -1
// when it cannot be read.
func readServerCPU(env *Env) time.Duration {
	d, err := serverCPU(env)
	if err != nil {
		return -1
	}
	return d
}

// readClientCPU returns the CPU time this process has used, or -1 when it
// cannot be read.
func readClientCPU() time.Duration {
	d, err := clientCPU()
	if err != nil {
		return -1
	}
	return d
}
