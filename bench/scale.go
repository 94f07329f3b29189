package bench

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ScaleScenarios measure how the costs grow with the numbers of waiters and
// of held locks. They take minutes and are not in Scenarios: the compare
// command and the CI run leave them out; the benchmarks run them with
// -scale (see bench_test.go).
//
//   - fifo-3000: fifo's queue with 3000 waiters (fifo-1000 is in
//     Scenarios); the time, RPCs and the members' CPU time are per
//     handoff, the memory per waiter;
//   - queue-read-100, -1000, -3000: the read a waiter sends when the key
//     ahead of it is deleted, with that many keys under the lock's prefix
//     and every one of them ahead of the reader (as for the last waiter of
//     a queue): ours is keys-only and returns up to 8 keys, etcd's
//     Mutex's (in waitDeletes) reads the newest key ahead with its value.
//     etcd ignores the limit of a range sorted by create revision or
//     filtered by revision: it reads the whole prefix, then sorts and cuts.
//     This shows what that costs the members per read (server-us/op);
//   - waiters-8-clients-10000, waiters-own-client-10000: the waiters-…
//     scenarios of Scenarios with 10 000 waiters, one session each, over 8
//     clients or each on its own client: what the waiting costs the etcd
//     member (watch streams for the whole queue, heap after a GC and
//     goroutines per waiter, read from its /metrics) and the client
//     (heap, stacks and goroutines per waiter), then the drain's time per
//     handoff. With 10 000 clients, the bench process and the member each
//     hold about 10 000 connections: mind the open files limit;
//   - held-10000: 10 000 locks, each of its own name, held at once through
//     16 sessions (one per client); the memory and goroutines are per held
//     lock, the time per Lock (issued 32 at a time);
//   - held-10000-done: the same, with Done called on each hold (etcdlock
//     only: etcd's Mutex has no Done), so that each watches for its loss.
var ScaleScenarios = []Scenario{
	{
		Name: "fifo-3000", Unit: "handoff", N: 1, ShortN: 1,
		Run: fifo(3000),
	},
	{
		Name: "queue-read-100", Unit: "queue read", N: 1, ShortN: 1,
		Run: queueRead(100),
	},
	{
		Name: "queue-read-1000", Unit: "queue read", N: 1, ShortN: 1,
		Run: queueRead(1000),
	},
	{
		Name: "queue-read-3000", Unit: "queue read", N: 1, ShortN: 1,
		Run: queueRead(3000),
	},
	{
		Name: "waiters-8-clients-10000", Unit: "handoff", N: 1, ShortN: 1,
		Targets: waitersTargets(8),
		Run:     waiters("waiters-8-clients-10000", 10000, 8),
	},
	{
		Name: "waiters-own-client-10000", Unit: "handoff", N: 1, ShortN: 1,
		Targets: waitersTargets(10000),
		Run:     waiters("waiters-own-client-10000", 10000, 10000),
	},
	{
		Name: "held-10000", Unit: "held lock", N: 1, ShortN: 1,
		Run: held(10000, false),
	},
	{
		Name: "held-10000-done", Unit: "held lock", N: 1, ShortN: 1,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"held-10000", Etcd.Name},
		Baseline: "etcd Mutex (held-10000, no Done)",
		Run:      held(10000, true),
	},
}

// heldSessions is how many sessions (and clients) the held locks share.
const heldSessions = 16

// A doner is a Mutex whose hold tells its loss on a channel (etcdlock's).
type doner interface{ Done() <-chan struct{} }

// held returns the scenario of n locks, each of its own name, held at
// once through heldSessions sessions, with Done called on each hold when
// done is set. It measures the memory and goroutines per held lock over
// the locks taken after a first tenth (which takes the sessions' and
// clients' one-time costs), in two halves.
func held(n int, done bool) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, iters int, timer Timer) (Result, error) {
		var sum Result
		for range iters {
			r, err := holdMany(ctx, env, impl, n, done, timer)
			if err != nil {
				return Result{}, err
			}
			sum = sum.Add(r)
		}
		return sum, nil
	}
}

func holdMany(ctx context.Context, env *Env, impl Impl, n int, done bool, timer Timer) (Result, error) {
	cs, err := env.newClients(heldSessions, 0)
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	ss, err := newSessions(ctx, impl, cs.clis, heldSessions)
	if err != nil {
		return Result{}, err
	}
	defer closeSessions(ss)
	label := "held"
	if done {
		label = "held-done"
	}
	base := env.lockName(label, impl)
	ms := make([]Mutex, n)
	for i := range ms {
		ms[i] = ss[i%len(ss)].NewMutex(fmt.Sprintf("%s/%d", base, i))
	}
	// Unlock everything that was locked, whatever happens.
	locked := make([]bool, n)
	defer forEach(n, func(i int) {
		if locked[i] {
			_ = ms[i].Unlock(context.WithoutCancel(ctx))
		}
	})

	first := n / 10
	second := (n - first) / 2
	parts := [][2]int{{0, first}, {first, first + second}, {first + second, n}}
	var mems []memSnapshot
	mt := newMeter(env, &cs.rpcs, timer)
	for p, part := range parts {
		// The first part is not measured.
		if p > 0 {
			if err := mt.start(ctx); err != nil {
				return Result{}, err
			}
		}
		errs := make([]error, n)
		forEach(part[1]-part[0], func(j int) {
			i := part[0] + j
			if errs[i] = ms[i].Lock(ctx); errs[i] != nil {
				return
			}
			locked[i] = true
			if done {
				d, ok := ms[i].(doner)
				if !ok {
					errs[i] = fmt.Errorf("bench: %s's Mutex has no Done", impl.Name)
					return
				}
				_ = d.Done()
			}
		})
		if err := errors.Join(errs...); err != nil {
			return Result{}, fmt.Errorf("bench: Lock: %w", err)
		}
		if p > 0 {
			if err := mt.stop(ctx, int64(part[1]-part[0])); err != nil {
				return Result{}, err
			}
		}
		// Done's loss watches start in the background: wait until the
		// members' watchers stop changing.
		if err := env.settleWatchers(ctx, &cs.rpcs, func() error { return nil }); err != nil {
			return Result{}, err
		}
		mems = append(mems, takeMemSnapshot())
	}
	got, err := env.countKeys(ctx, base)
	if err != nil {
		return Result{}, err
	}
	if got != int64(n) {
		return Result{}, fmt.Errorf("bench: %d keys under %s/, want %d", got, base, n)
	}
	res := mt.result()
	res.Queue = queueCost(int64(second), int64(n-first-second), mems[0], mems[1], mems[2])
	return res, nil
}

// queueReadsPerIter is how many reads one iteration of queueRead times:
// enough for the members' CPU time, counted in 10ms ticks.
const queueReadsPerIter = 2000

// queueRead returns the scenario of the read a waiter sends to find the
// key ahead of it, with n keys under the prefix, all ahead of the reader.
// The keys are bound to a session's lease, as waiters' keys are; the
// reads are serializable for ours (a waiter's check reads from the member
// it talks to when it can), linearizable for etcd's, as each sends them.
func queueRead(n int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, iters int, timer Timer) (Result, error) {
		cs, err := env.newClients(1, 0)
		if err != nil {
			return Result{}, err
		}
		defer cs.close()
		ss, err := newSessions(ctx, impl, cs.clis, 1)
		if err != nil {
			return Result{}, err
		}
		defer closeSessions(ss)
		cli, pfx := cs.clis[0], env.lockName(fmt.Sprintf("queue-read-%d", n), impl)+"/"
		var last int64
		for i := 0; i < n; {
			var ops []clientv3.Op
			for ; i < n && len(ops) < 100; i++ {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%x", pfx, 1<<40+i), "", clientv3.WithLease(ss[0].Lease())))
			}
			resp, err := cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				return Result{}, fmt.Errorf("bench: put queue keys: %w", err)
			}
			last = resp.Header.Revision
		}
		opts := []clientv3.OpOption{
			clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend),
			clientv3.WithLimit(8), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(last), clientv3.WithSerializable(),
		}
		if impl.Name == Etcd.Name {
			opts = append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(last))
		}
		mt := newMeter(env, &cs.rpcs, timer)
		if err := mt.start(ctx); err != nil {
			return Result{}, err
		}
		reads := iters * queueReadsPerIter
		for range reads {
			resp, err := cli.Get(ctx, pfx, opts...)
			if err != nil {
				return Result{}, fmt.Errorf("bench: read queue: %w", err)
			}
			if len(resp.Kvs) == 0 {
				return Result{}, fmt.Errorf("bench: read queue: no key ahead")
			}
		}
		if err := mt.stop(ctx, int64(reads)); err != nil {
			return Result{}, err
		}
		return mt.result(), nil
	}
}
