package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// fifo returns the scenario of a queue of w waiters, each with its own
// session (spread over a few clients), drained after the holder releases.
// Every waiter unlocks as soon as it holds the lock, so the window measures
// w handoffs back to back. The waiters must get the lock in the order of
// their keys' create revisions, one at a time, or the run fails.
func fifo(w int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return fifoOf(queueSpec{label: fmt.Sprintf("fifo-%d", w), waiters: w, capacity: 1,
		newHolder: Session.NewMutex, newWaiter: Session.NewMutex})
}

// waiters returns the scenario called label of fifo's queue of w waiters,
// one session each, whose sessions share clients clients (w: each waiter
// on its own client), with what their waiting costs the etcd members and
// the client measured before the queue is drained (Result.Server,
// Result.Queue).
func waiters(label string, w, clients int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return fifoOf(queueSpec{label: label, waiters: w, capacity: 1, clients: clients, server: true,
		newHolder: Session.NewMutex, newWaiter: Session.NewMutex})
}

// semFIFO returns the scenario of a queue of w waiters for 1 permit of
// capacity behind a holder of all of them: up to capacity waiters hold at
// once, and each must be admitted within capacity-1 places of its place in
// the queue.
func semFIFO(w int, capacity int64) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return fifoOf(queueSpec{label: fmt.Sprintf("sem-fifo-%d", w), waiters: w, capacity: capacity,
		newHolder: func(s Session, name string) Mutex { return semMutex{s.NewSemaphore(name, capacity), capacity} },
		newWaiter: func(s Session, name string) Mutex { return semMutex{s.NewSemaphore(name, capacity), 1} }})
}

// rwReaders returns the scenario of r readers queued behind a writer: the
// writer's Unlock admits them all at once. The window opens when that
// Unlock has returned and closes when the last reader holds: one operation,
// the admission of all r. Each reader releases as soon as it holds.
func rwReaders(r int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return fifoOf(queueSpec{label: fmt.Sprintf("rw-readers-%d", r), waiters: r, capacity: int64(r), together: true,
		newHolder: func(s Session, name string) Mutex { return rwWriter{s.NewRWMutex(name)} },
		newWaiter: func(s Session, name string) Mutex { return rwReader{s.NewRWMutex(name)} }})
}

// A queueSpec says what a FIFO scenario queues and measures.
type queueSpec struct {
	label     string                      // of the lock
	waiters   int                         // queued behind the holder
	capacity  int64                       // most waiters that may hold at once
	newHolder func(Session, string) Mutex // the holder's lock
	newWaiter func(Session, string) Mutex // a waiter's lock
	// together: the holder's release admits every waiter at once. The
	// window then opens after the release returned and counts one
	// operation, all of them admitted; otherwise it opens before the
	// release and counts a handoff per waiter.
	together bool
	// clients is how many clients the waiters' sessions share, waiter i
	// on client i mod clients, the holder on the first; 0: clientsFor.
	clients int
	// server: also measure what the waiting costs the etcd members
	// (Result.Server). Every session is then made before the first waiter
	// calls Lock, and the memory, the client's as the members', is that of
	// the waiting alone, per waiter over all of them: what a session
	// costs is left out, on both sides.
	server bool
}

// fifoOf returns the scenario of spec: n queues drained.
func fifoOf(spec queueSpec) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		var sum Result
		for range n {
			r, err := drain(ctx, env, impl, timer, spec)
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

func drain(ctx context.Context, env *Env, impl Impl, timer Timer, spec queueSpec) (Result, error) {
	w := spec.waiters
	nc := spec.clients
	if nc == 0 {
		nc = clientsFor(w)
	}
	var snaps []serverSnapshot
	if spec.server {
		// The clients of the runs before are closed, but the members may
		// not have seen their streams end yet.
		if err := env.settleWatchers(ctx, &rpcCount{}, noFailure); err != nil {
			return Result{}, err
		}
		s, err := env.serverSnapshot(ctx)
		if err != nil {
			return Result{}, err
		}
		snaps = append(snaps, s)
	}
	cs, err := env.newClients(nc, 0)
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	name := env.lockName(spec.label, impl)
	hs, err := newSessions(ctx, impl, cs.clis, 1)
	if err != nil {
		return Result{}, err
	}
	defer closeSessions(hs)
	holder := spec.newHolder(hs[0], name)
	if err := holder.Lock(ctx); err != nil {
		return Result{}, fmt.Errorf("bench: holder Lock: %w", err)
	}

	wctx, cancel := context.WithCancel(ctx)
	q := &queue{env: env, cs: cs, name: name, cancel: cancel, capacity: spec.capacity, newLock: spec.newWaiter}
	if spec.server {
		q.batch = joinBatch
	}
	defer q.close() // stops the waiters, then closes their sessions

	// Queue the waiters in three parts, measuring memory after each. The
	// first part, at least one waiter per client, takes the clients'
	// one-time costs (watch and keepalive streams); the two others tell
	// what one more waiter costs, early and late in the queue.
	//
	// When the server is measured too, every session is made first, and
	// the waiters join in two halves: the first snapshot is taken before
	// any of them waits.
	first := max(len(cs.clis), w/10)
	second := (w - first) / 2
	parts := []int{first, second, w - first - second}
	var mems []memSnapshot
	if spec.server {
		if err := q.addSessions(ctx, impl, w); err != nil {
			return Result{}, err
		}
		if err := waitKeepAlives(ctx, &cs.rpcs, len(cs.clis), q.failed); err != nil {
			return Result{}, err
		}
		if err := env.settleWatchers(ctx, &cs.rpcs, q.failed); err != nil {
			return Result{}, err
		}
		mems = append(mems, takeMemSnapshot())
		s, err := env.serverSnapshot(ctx)
		if err != nil {
			return Result{}, err
		}
		snaps = append(snaps, s)
		parts = []int{w / 2, w - w/2}
	}
	for _, n := range parts {
		if err := q.add(ctx, wctx, impl, n); err != nil {
			return Result{}, err
		}
		mems = append(mems, takeMemSnapshot())
	}
	var server *ServerCost
	if spec.server {
		s, err := env.serverSnapshot(ctx)
		if err != nil {
			return Result{}, err
		}
		server = serverCost(int64(w), snaps[0], snaps[1], s)
	}

	keys, err := env.queue(ctx, name)
	if err != nil {
		return Result{}, err
	}
	if len(keys) != w+1 {
		return Result{}, fmt.Errorf("bench: %d keys in the queue, want %d", len(keys), w+1)
	}

	// The window opens before the holder's release (after it, for waiters
	// admitted together) and closes in the last waiter's hold, before its
	// release: it spans exactly w handoffs (one admission of all).
	mt := newMeter(env, &cs.rpcs, timer)
	release := func() error {
		if err := holder.Unlock(ctx); err != nil {
			return fmt.Errorf("bench: holder Unlock: %w", err)
		}
		return nil
	}
	if spec.together {
		q.setMeter(mt, w, 1, true)
		err = mt.startAfter(ctx, release)
	} else {
		q.setMeter(mt, w, int64(w), false)
		if err = mt.start(ctx); err == nil {
			started := time.Now()
			err = release()
			q.released(started)
		}
	}
	if err != nil {
		return Result{}, err
	}
	if err := q.wait(ctx); err != nil {
		return Result{}, err
	}

	if spec.together {
		// etcd's recipe RWMutex names its keys name/read/<time>, not
		// name/<lease> as the waiters record themselves: check by session
		// that each got the lock once.
		keys = keys[:1:1]
		for _, s := range q.ss {
			keys = append(keys, waiterKey(name, s.Lease()))
		}
	}
	if err := checkOrderWithin(q.order, keys, spec.capacity); err != nil {
		return Result{}, err
	}
	res := mt.result()
	if spec.capacity == 1 {
		res.Release = time.Duration(q.release.Load())
	}
	// The last two parts, from the snapshot before them.
	n, m := len(parts), len(mems)
	res.Queue = queueCost(int64(parts[n-2]), int64(parts[n-1]), mems[m-3], mems[m-2], mems[m-1])
	res.Server = server
	return res, nil
}

// keepAliveWait bounds waitKeepAlives: the default TTL of both
// implementations' sessions, which renew every third of it.
const keepAliveWait = 15 * time.Second

// waitKeepAlives returns once the clients counted in rpcs have opened n
// lease keepalive streams, one per client, or keepAliveWait has passed.
// etcd's sessions open their client's stream as they start, ours at
// their first renewal: a stream opened while the waiters join would count
// as theirs.
func waitKeepAlives(ctx context.Context, rpcs *rpcCount, n int, failed func() error) error {
	wctx, cancel := context.WithTimeout(ctx, keepAliveWait)
	defer cancel()
	err := poll(wctx, pollInterval, func() (bool, error) {
		return rpcs.keepAlive.Load() >= int64(n), failed()
	})
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return nil // waited long enough: measured as it is
	}
	return err
}

// checkOrder checks that the waiters got the lock in the order of the
// queue's keys: keys[0] is the holder's, and order must be keys[1:].
func checkOrder(order, keys []string) error { return checkOrderWithin(order, keys, 1) }

// checkOrderWithin is checkOrder for a lock with up to capacity holders at
// once. With more than one, the order in which holders record themselves
// is not the order of their admission: a holder delayed between Lock's
// return and its record lets later waiters through (others release, more
// are admitted). So only that every waiter got the lock exactly once is
// checked; the Semaphore's own tests check its admission order from etcd's
// state (TestSemaphoreFIFO).
func checkOrderWithin(order, keys []string, capacity int64) error {
	if capacity == 1 {
		return checkExactOrder(order, keys)
	}
	if len(order) != len(keys)-1 {
		return fmt.Errorf("bench: %d waiters got the lock, want %d", len(order), len(keys)-1)
	}
	got := slices.Clone(order)
	want := slices.Clone(keys[1:])
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		return fmt.Errorf("bench: the waiters that got the lock are not the queue's")
	}
	return nil
}

func checkExactOrder(order, keys []string) error {
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
	ss     []Session          // of the waiters, those not waiting yet last
	joined int                // waiters started: q.ss[:joined]
	batch  int                // at most this many join at once; 0: all

	capacity int64                       // most waiters holding at once
	newLock  func(Session, string) Mutex // a waiter's lock

	wg     sync.WaitGroup
	inside atomic.Int64 // waiters holding the lock right now
	// release is the time, in ns, spent in the Unlocks inside the
	// window (Result.Release): the holder's and those of every waiter
	// but the last, which stops the meter before it releases.
	release atomic.Int64

	mu   sync.Mutex // guards mt, want, ops, stopped, order, err
	mt   *meter     // stopped by the want-th waiter to get the lock
	want int
	// stopped, when not nil, is closed once mt stopped: the waiters hold
	// until then (waiters admitted together), so that no release competes
	// with the admissions measured.
	stopped chan struct{}
	ops     int64    // operations counted when mt stops
	order   []string // keys of the waiters in the order they got the lock
	err     error    // the first error of a waiter
}

// setMeter makes the want-th waiter to get the lock stop mt while it holds
// the lock, counting ops operations. With hold, the waiters hold until
// then.
func (q *queue) setMeter(mt *meter, want int, ops int64, hold bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mt, q.want, q.ops = mt, want, ops
	if hold {
		q.stopped = make(chan struct{})
	}
}

// addSessions makes n more sessions for waiters, the i-th waiter's on
// client i mod the number of clients, without starting the waiters.
func (q *queue) addSessions(ctx context.Context, impl Impl, n int) error {
	k := len(q.ss)
	clis := q.cs.clis
	// Session j of newSessions goes to client j mod len(clis).
	rotated := append(slices.Clone(clis[k%len(clis):]), clis[:k%len(clis)]...)
	ss, err := newSessions(ctx, impl, rotated, n)
	if err != nil {
		return err
	}
	q.ss = append(q.ss, ss...)
	return nil
}

// add starts n more waiters, with the sessions addSessions made or new
// ones, and returns once they are all queued and idle: no watcher on the
// server is still catching up, and for a while neither the number of
// watchers nor the number of unary RPCs of the clients changed (which
// tells nothing apart by implementation).
func (q *queue) add(ctx, wctx context.Context, impl Impl, n int) error {
	if more := q.joined + n - len(q.ss); more > 0 {
		if err := q.addSessions(ctx, impl, more); err != nil {
			return err
		}
	}
	for end := q.joined + n; q.joined < end; {
		b := end - q.joined
		if q.batch > 0 {
			b = min(b, q.batch)
		}
		for _, s := range q.ss[q.joined : q.joined+b] {
			m, key := q.newLock(s, q.name), waiterKey(q.name, s.Lease())
			q.wg.Add(1)
			go func() {
				defer q.wg.Done()
				q.waiter(wctx, m, key)
			}()
		}
		q.joined += b
		if err := q.queued(ctx, int64(q.joined+1)); err != nil {
			return err
		}
	}
	return q.env.settleWatchers(ctx, &q.cs.rpcs, q.failed)
}

// joinBatch is how many waiters join at once when the waiting itself is
// measured (queueSpec.server). A Lock's first read of the queue is sorted
// by create revision, which makes etcd read every key under the lock: a
// member given thousands of Locks at once falls seconds behind, and times
// out proposals and renewals alike. Those scenarios measure the waiting,
// not that burst; the others keep it (see docs/performance.md, Bursts).
const joinBatch = 100

func (q *queue) waiter(ctx context.Context, m Mutex, key string) {
	if err := m.Lock(ctx); err != nil {
		q.fail(fmt.Errorf("bench: waiter Lock: %w", err))
		return
	}
	if in := q.inside.Add(1); in > q.capacity {
		q.fail(fmt.Errorf("bench: mutual exclusion violated: %d holders inside at once, capacity %d", in, q.capacity))
		return
	}
	q.mu.Lock()
	q.order = append(q.order, key)
	mt, last, ops, stopped := q.mt, len(q.order) == q.want, q.ops, q.stopped
	q.mu.Unlock()
	if last {
		err := mt.stop(ctx, ops)
		if stopped != nil {
			close(stopped)
		}
		if err != nil {
			q.fail(err)
			return
		}
	}
	if stopped != nil {
		select {
		case <-stopped:
		case <-ctx.Done():
		}
	}
	q.inside.Add(-1)
	started := time.Now()
	if err := m.Unlock(ctx); err != nil {
		q.fail(fmt.Errorf("bench: waiter Unlock: %w", err))
	}
	if !last {
		q.released(started)
	}
}

// released adds the time since started to the time spent releasing.
func (q *queue) released(started time.Time) {
	q.release.Add(int64(time.Since(started)))
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

// queued returns once want keys (holder and waiters) are under the lock's
// prefix.
func (q *queue) queued(ctx context.Context, want int64) error {
	return poll(ctx, 10*time.Millisecond, func() (bool, error) {
		if err := q.failed(); err != nil {
			return false, err
		}
		n, err := q.env.countKeys(ctx, q.name)
		if n > want {
			err = fmt.Errorf("bench: %d keys under %s/, want %d", n, q.name, want)
		}
		return n == want, err
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

// memSnapshot is the memory of the process at one moment, after a GC.
type memSnapshot struct {
	heap       int64 // heap in use
	stack      int64 // goroutine stacks in use
	goroutines int64
}

// takeMemSnapshot collects garbage and measures. The etcd members are
// processes of their own: all of this process's heap is the clients'.
func takeMemSnapshot() memSnapshot {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memSnapshot{
		heap:       int64(ms.HeapAlloc),
		stack:      int64(ms.StackInuse),
		goroutines: int64(runtime.NumGoroutine()),
	}
}

// queueCost turns three snapshots, after the queue's first part, after its
// second (n1 more waiters) and after its third (n2 more), into costs per
// waiter of the second and third parts.
func queueCost(n1, n2 int64, m0, m1, m2 memSnapshot) *QueueCost {
	n := float64(n1 + n2)
	c := &QueueCost{
		Waiters:    n1 + n2,
		ClientHeap: float64(m2.heap-m0.heap) / n,
		Stack:      float64(m2.stack-m0.stack) / n,
		Goroutines: float64(m2.goroutines-m0.goroutines) / n,
	}
	early := float64(m1.heap-m0.heap) / float64(n1)
	late := float64(m2.heap-m1.heap) / float64(n2)
	if early > 0 {
		c.Growth = late / early
	}
	return c
}

// settleWatchers returns once no member has a watcher still catching up
// and, for a while, neither the number of watchers nor the number of unary
// RPCs of rpcs changed; or with failed's error, when it returns one.
func (e *Env) settleWatchers(ctx context.Context, rpcs *rpcCount, failed func() error) error {
	const quiet = 150 * time.Millisecond
	var (
		lastWatchers, lastRPCs int64 = -1, -1
		since                  time.Time
	)
	return poll(ctx, 30*time.Millisecond, func() (bool, error) {
		if err := failed(); err != nil {
			return false, err
		}
		watchers, slow, err := e.serverWatchers(ctx)
		if err != nil {
			return false, err
		}
		rpcs := rpcs.all.Unary()
		if slow > 0 || watchers != lastWatchers || rpcs != lastRPCs {
			lastWatchers, lastRPCs, since = watchers, rpcs, time.Now()
			return false, nil
		}
		return time.Since(since) >= quiet, nil
	})
}
