package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
)

// lead-yield-3: three instances run Lead made YieldOnRequest on one
// election; a deploy asks the leader to step down (RequestRelease), and
// the time is from that call to the next leader's fn starting: the
// request's write, the leader's watch, fn's end, the resign and the next
// candidate's turn. The leadership must move once, to the next in line,
// and the one that stepped down joins the line again at the back: the
// run fails otherwise. Waiting for it to rejoin is not measured. Ours
// only (etcd's Election has no such request); compared with our
// Campaign+Resign alone.
var leadScenarios = []Scenario{
	{
		Name: "lead-yield-3", Unit: "handoff on request", Short: true, N: 20, ShortN: 5,
		Targets:  []Target{TimeAtMost(100 * time.Millisecond)},
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"elect-uncontended", Etcdlock.Name},
		Baseline: "etcdlock Campaign+Resign",
		Run:      leadYield(3),
	},
}

func init() { Scenarios = append(Scenarios, leadScenarios...) }

func leadYield(k int) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		if impl.Name != Etcdlock.Name {
			return Result{}, errors.New("bench: lead-yield runs etcdlock's Lead only")
		}
		cs, err := env.newClients(k+1, 0) // the candidates, and the deploy that asks
		if err != nil {
			return Result{}, err
		}
		defer cs.close()
		name := env.lockName("lead-yield", impl)
		lctx, stop := context.WithCancel(ctx)
		starts := make(chan int, k)
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			errs error
		)
		defer func() {
			stop()
			wg.Wait()
		}()
		queued := func(want int64) error {
			return poll(ctx, 2*time.Millisecond, func() (bool, error) {
				n, err := env.countKeys(ctx, name)
				return n == want, err
			})
		}
		for i := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := etcdlock.Lead(lctx, cs.clis[i], name, strconv.Itoa(i), func(fctx context.Context) error {
					starts <- i
					<-fctx.Done()
					return nil
				}, etcdlock.YieldOnRequest())
				if err != nil && lctx.Err() == nil {
					mu.Lock()
					errs = errors.Join(errs, err)
					mu.Unlock()
				}
			}()
			// One at a time, so that the line is 0, 1, 2.
			if err := queued(int64(i + 1)); err != nil {
				return Result{}, err
			}
		}
		next := func() (int, error) {
			select {
			case i := <-starts:
				return i, nil
			case <-time.After(10 * time.Second):
				mu.Lock()
				defer mu.Unlock()
				return 0, errors.Join(errors.New("bench: no leader 10s after the request"), errs)
			}
		}
		if got, err := next(); err != nil || got != 0 {
			return Result{}, errors.Join(err, fmt.Errorf("bench: candidate %d leads first, not 0", got))
		}
		asker := cs.clis[k]
		mt := newMeter(env, &cs.rpcs, timer)
		want := 0
		for round := range n + 1 {
			want = (want + 1) % k
			measured := round > 0 // the first round warms up
			if measured {
				if err := mt.start(ctx); err != nil {
					return Result{}, err
				}
			}
			if err := etcdlock.RequestRelease(ctx, asker, name); err != nil {
				return Result{}, fmt.Errorf("bench: RequestRelease: %w", err)
			}
			got, err := next()
			if err != nil {
				return Result{}, err
			}
			if measured {
				if err := mt.stop(ctx, 1); err != nil {
					return Result{}, err
				}
			}
			if got != want {
				return Result{}, fmt.Errorf("bench: the request moved the leadership to %d, not to %d, the next in line", got, want)
			}
			// The one that stepped down is back in line.
			if err := queued(int64(k)); err != nil {
				return Result{}, err
			}
			select {
			case i := <-starts:
				return Result{}, fmt.Errorf("bench: one request moved the leadership twice: %d leads too", i)
			default:
			}
		}
		return mt.result(), nil
	}
}
