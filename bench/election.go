package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	compat "github.com/etcdlock/etcdlock/concurrency"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

// The election scenarios compare this module's Election with etcd's
// concurrency.Election:
//
//   - elect-uncontended: Campaign then Resign, nobody else around;
//   - elect-handoff-4: 4 candidates, each with its own client and
//     session, taking turns (Campaign, then Resign); the time is per
//     acquisition of leadership;
//   - elect-observe-10-p50, elect-observe-10-p99: two candidates hand
//     leadership to each other over and over, and 10 observers, each with
//     its own client, follow the election (our ObserveLeader, etcd's
//     Observe); the time is the median, or the 99th percentile, over every
//     change and observer, from the response to the leader's Resign to the
//     observer seeing the new leader (0 when it saw it first).
var electionScenarios = []Scenario{
	{
		Name: "elect-uncontended", Unit: "Campaign+Resign", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(1.0), RPCsEqual(2)},
		Impls:    withCompat,
		Baseline: "etcd Election",
		Run: uncontendedOf("elect-uncontended", func(s Session, name string) func(context.Context) error {
			m := electionMutex{newElection(s, name)}
			return pair("Campaign", m.Lock, "Resign", m.Unlock)
		}),
	},
	{
		Name: "elect-handoff-4", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Targets:  []Target{RatioAtMost(0.15)},
		Impls:    withCompat,
		Baseline: "etcd Election",
		Run: contendWith("elect-handoff-4", 4, 1, func(s Session, name string) Mutex {
			return electionMutex{newElection(s, name)}
		}),
	},
	{
		Name: "elect-observe-10-p50", Unit: "observed change", Short: true, N: 50, ShortN: 10,
		Impls:    withCompat,
		Baseline: "etcd Election",
		Run:      observeLatency("elect-observe-10-p50", 10, 0.5),
	},
	{
		Name: "elect-observe-10-p99", Unit: "observed change", Short: true, N: 50, ShortN: 10,
		Targets:  []Target{RatioAtMost(0.2)},
		Impls:    withCompat,
		Baseline: "etcd Election",
		Run:      observeLatency("elect-observe-10-p99", 10, 0.99),
	},
}

func init() { Scenarios = append(Scenarios, electionScenarios...) }

// An election is what the scenarios use of an implementation's election.
type election interface {
	Campaign(ctx context.Context, value string) error
	Resign(ctx context.Context) error
}

// newElection returns the election called name of s's implementation.
func newElection(s Session, name string) election {
	switch s := s.(type) {
	case etcdlockSession:
		return etcdlock.NewElection(s.Session, name)
	case etcdSession:
		return concurrency.NewElection(s.Session, name)
	case compatSession:
		return compat.NewElection(s.Session, name)
	}
	panic(fmt.Sprintf("bench: no election for %T", s))
}

// electionMutex is an election used as a Mutex, for the harness of the
// Mutex scenarios: Lock campaigns, Unlock resigns.
type electionMutex struct{ e election }

func (m electionMutex) Lock(ctx context.Context) error   { return m.e.Campaign(ctx, "bench") }
func (m electionMutex) Unlock(ctx context.Context) error { return m.e.Resign(ctx) }
func (m electionMutex) TryLock(context.Context) error {
	return errors.New("bench: an election has no TryLock")
}

// observeLeaders follows the election called name as impl's observers do,
// and calls seen with each leader's key it reports, until ctx ends. etcd's
// Observe needs a session (for its client only); ours needs the client.
func observeLeaders(ctx context.Context, s Session, cli *clientv3.Client, name string, seen func(key string)) error {
	switch s := s.(type) {
	case etcdlockSession:
		for l, err := range etcdlock.ObserveLeader(ctx, cli, name) {
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("bench: ObserveLeader: %w", err)
			}
			seen(l.Key)
		}
		return nil
	case etcdSession:
		return observeResponses(ctx, "etcd's", concurrency.NewElection(s.Session, name).Observe(ctx), seen)
	case compatSession:
		return observeResponses(ctx, "the concurrency package's", compat.NewElection(s.Session, name).Observe(ctx), seen)
	}
	return fmt.Errorf("bench: no observer for %T", s)
}

// observeResponses calls seen with the key of each leader that an
// Observe channel of etcd's API reports, until the channel closes, which
// is an error unless ctx ended. whose names the API in the error. (Its
// element type depends on etcd's version: etcdtest.GetResponses.)
func observeResponses(ctx context.Context, whose string, ch any, seen func(key string)) error {
	for resp := range etcdtest.GetResponses(ch) {
		if len(resp.Kvs) > 0 {
			seen(string(resp.Kvs[0].Key))
		}
	}
	if ctx.Err() == nil {
		return fmt.Errorf("bench: %s Observe ended", whose)
	}
	return nil
}

// A leaderChange is one handoff the observers are waiting to see.
type leaderChange struct {
	key  string         // the new leader's key
	seen []atomic.Int64 // by observer: when it saw key, in Unix ns; 0: not yet
	left atomic.Int64   // observers yet to see it
	done chan struct{}  // closed when every observer saw it
}

// observeLatency returns the scenario called label: two candidates, each
// with its own client and session, hand leadership to each other n times,
// and observers, each with its own client, follow the election. Each
// handoff waits for every observer to see the new leader, and for the old
// leader to join the queue again, before the next. The result is the given
// quantile of the latencies, over every handoff and observer, from the
// response to Resign to the observer seeing the new leader: as one
// operation of that duration, so that the tables show it as the time per
// operation.
func observeLatency(label string, observers int, quantile float64) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		k := observers + 2
		cs, err := env.newClients(k, 0)
		if err != nil {
			return Result{}, err
		}
		defer cs.close()
		ss, err := newSessions(ctx, impl, cs.clis, k)
		if err != nil {
			return Result{}, err
		}
		defer closeSessions(ss)
		name := env.lockName(label, impl)
		cands := []election{newElection(ss[0], name), newElection(ss[1], name)}
		keys := []string{waiterKey(name, ss[0].Lease()), waiterKey(name, ss[1].Lease())}
		if err := cands[0].Campaign(ctx, "0"); err != nil {
			return Result{}, fmt.Errorf("bench: Campaign: %w", err)
		}

		octx, stopObservers := context.WithCancel(ctx)
		var (
			cur     atomic.Pointer[leaderChange]
			wg      sync.WaitGroup
			errMu   sync.Mutex
			obsErr  error
			watched = make(chan struct{}, observers)
		)
		for i := range observers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := true
				err := observeLeaders(octx, ss[2+i], cs.clis[2+i], name, func(key string) {
					if first && key == keys[0] {
						first = false
						watched <- struct{}{}
					}
					c := cur.Load()
					if c != nil && key == c.key && c.seen[i].CompareAndSwap(0, time.Now().UnixNano()) {
						if c.left.Add(-1) == 0 {
							close(c.done)
						}
					}
				})
				if err != nil {
					errMu.Lock()
					obsErr = errors.Join(obsErr, err)
					errMu.Unlock()
					stopObservers()
				}
			}()
		}
		// The candidate that waits campaigns with a context of its own, so
		// that a failed run can end it.
		cctx, stopCampaign := context.WithCancel(ctx)
		campaigned := make(chan error, 1)
		pending := false // a Campaign runs, and will send to campaigned
		campaign := func(c election, value string) {
			pending = true
			go func() { campaigned <- c.Campaign(cctx, value) }()
		}
		defer func() {
			stopCampaign()
			if pending {
				<-campaigned
			}
			stopObservers()
			wg.Wait()
		}()
		queued := func() error {
			return poll(ctx, 2*time.Millisecond, func() (bool, error) {
				q, err := env.queue(ctx, name)
				return len(q) == 2, err
			})
		}
		for range observers {
			select {
			case <-watched:
			case <-octx.Done():
				return Result{}, errors.Join(obsErr, octx.Err())
			}
		}

		latencies := make([]time.Duration, 0, n*observers)
		if timer != nil {
			timer.StartTimer()
		}
		leader := 0
		for i := range n {
			next := 1 - leader
			if i == 0 {
				campaign(cands[next], "1")
			}
			if err := queued(); err != nil {
				return Result{}, err
			}
			c := &leaderChange{key: keys[next], seen: make([]atomic.Int64, observers), done: make(chan struct{})}
			c.left.Store(int64(observers))
			cur.Store(c)
			if err := cands[leader].Resign(ctx); err != nil {
				return Result{}, fmt.Errorf("bench: Resign: %w", err)
			}
			resigned := time.Now()
			select {
			case <-c.done:
			case <-octx.Done():
				errMu.Lock()
				defer errMu.Unlock()
				return Result{}, errors.Join(obsErr, octx.Err())
			}
			for j := range c.seen {
				latencies = append(latencies, max(0, time.Unix(0, c.seen[j].Load()).Sub(resigned)))
			}
			err := <-campaigned
			pending = false
			if err != nil {
				return Result{}, fmt.Errorf("bench: Campaign: %w", err)
			}
			leader = next
			if i < n-1 {
				// The old leader joins the queue again, behind the new one.
				campaign(cands[1-leader], "again")
			}
		}
		if timer != nil {
			timer.StopTimer()
		}
		if err := cands[leader].Resign(ctx); err != nil {
			return Result{}, fmt.Errorf("bench: Resign: %w", err)
		}
		slices.Sort(latencies)
		q := latencies[max(0, int(math.Ceil(quantile*float64(len(latencies))))-1)]
		return Result{Ops: 1, Elapsed: q}, nil
	}
}
