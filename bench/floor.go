package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Floor is no lock: its Lock puts the key a Mutex would put (name/<lease
// ID in hex>, an empty value, the session's lease) and its Unlock deletes
// it, each one plain RPC. That is the least any lock on etcd writes per
// Lock+Unlock, so the many-names scenarios run it beside the locks, as an
// implementation, and print each lock's time as a multiple of it. It
// excludes no one: only scenarios whose names are uncontended name it.
// Its sessions are etcd's concurrency.Session, whose lease is renewed on
// the client's one keepalive stream, as every other implementation's.
var Floor = Impl{
	Name: "floor",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return floorSession{s}, nil
	},
	NewSessionTTL: func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx), concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
		if err != nil {
			return nil, err
		}
		return floorSession{s}, nil
	},
}

type floorSession struct{ *concurrency.Session }

func (s floorSession) NewMutex(name string) Mutex {
	return floorMutex{cli: s.Client(), key: waiterKey(name, s.Lease()), lease: s.Lease()}
}

// NewRWMutex returns nil: the floor is a Mutex's writes only.
func (floorSession) NewRWMutex(string) RWMutex { return nil }

// NewSemaphore returns nil: the floor is a Mutex's writes only.
func (floorSession) NewSemaphore(string, int64) Semaphore { return nil }

// floorMutex is a Put and a Delete of one key: see Floor.
type floorMutex struct {
	cli   *clientv3.Client
	key   string
	lease clientv3.LeaseID
}

var errFloorTryLock = errors.New("bench: the floor is no lock: it has no TryLock")

func (m floorMutex) Lock(ctx context.Context) error {
	_, err := m.cli.Put(ctx, m.key, "", clientv3.WithLease(m.lease))
	return err
}

func (m floorMutex) Unlock(ctx context.Context) error {
	_, err := m.cli.Delete(ctx, m.key)
	return err
}

func (floorMutex) TryLock(context.Context) error { return errFloorTryLock }

// writeScenario is one fsynced write: the floor's Lock alone, a Put of
// one key with a session's lease, over and over, by one client talking to
// a follower when there are three members (Env.singleMember), as
// uncontended's. It is no lock, and runs for the floor only: a FIFO
// handoff is compared with it, since a handoff writes once (the holder's
// release) and the rest of it, the next waiter's wake-up and its
// confirming read, is what a lock adds to that write.
var writeScenario = Scenario{
	Name: "write", Unit: "Put", Short: true, N: 100, ShortN: 20,
	Impls:    []string{Floor.Name},
	Versus:   &Ref{"write", Floor.Name},
	Baseline: "itself",
	Run: uncontendedOf("write", func(s Session, name string) func(context.Context) error {
		return s.NewMutex(name).Lock
	}),
}

func init() { Scenarios = append(Scenarios, writeScenario) }

// The handoff floors are a FIFO handoff with no lock around it: a chain
// of keys, link i waiting for link i-1's key to be deleted and then
// deleting its own. What one costs is the least any watch-based lock on
// etcd pays per handoff: the release (one write), the next waiter's
// wake-up (the deletion's event, sent by the waiter's member once it
// has applied it), and, in handoff-floor-50, a serializable read of the
// waiter's own key at a revision at or after the event's, without which
// a waiter cannot know its key outlived the release it waited for
// (wake-floor-50 leaves it out: no safe lock can). The links' clients
// are spread over the members as fifo's waiters are (clientsFor), and
// every watch is made before the window opens.
var handoffFloorScenarios = []Scenario{
	{
		Name: "handoff-floor-50", Unit: "handoff", Short: true, N: 1, ShortN: 1,
		Impls: []string{Floor.Name}, Versus: &Ref{"write", Floor.Name}, Baseline: "floor write",
		Run: handoffFloor(50, true),
	},
	{
		Name: "wake-floor-50", Unit: "handoff", Short: true, N: 1, ShortN: 1,
		Impls: []string{Floor.Name}, Versus: &Ref{"write", Floor.Name}, Baseline: "floor write",
		Run: handoffFloor(50, false),
	},
}

func init() { Scenarios = append(Scenarios, handoffFloorScenarios...) }

// handoffFloor returns the scenario of a chain of w handoffs, each link
// reading its own key before it deletes it when read is set.
func handoffFloor(w int, read bool) func(context.Context, *Env, Impl, int, Timer) (Result, error) {
	return func(ctx context.Context, env *Env, impl Impl, n int, timer Timer) (Result, error) {
		var sum Result
		for range n {
			r, err := chain(ctx, env, impl, timer, w, read)
			if err != nil {
				return Result{}, err
			}
			sum = sum.Add(r)
		}
		return sum, nil
	}
}

func chain(ctx context.Context, env *Env, impl Impl, timer Timer, w int, read bool) (Result, error) {
	cs, err := env.newClients(clientsFor(w), 0)
	if err != nil {
		return Result{}, err
	}
	defer cs.close()
	name := env.lockName("handoff-floor", impl)
	keys := make([]string, w+1)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s/%06d", name, i)
		if _, err := cs.clis[0].Put(ctx, keys[i], ""); err != nil {
			return Result{}, fmt.Errorf("bench: put %s: %w", keys[i], err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := &failure{cancel: cancel}
	var made, done sync.WaitGroup
	for i := 1; i <= w; i++ {
		cli := cs.clis[i%len(cs.clis)]
		made.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			if err := link(ctx, cli, keys[i-1], keys[i], read, made.Done); err != nil {
				failed.fail(err)
			}
		}()
	}
	made.Wait()
	if err := failed.first(); err != nil {
		done.Wait()
		return Result{}, err
	}
	mt := newMeter(env, &cs.rpcs, timer)
	if err := mt.start(ctx); err != nil {
		return Result{}, err
	}
	if _, err := cs.clis[0].Delete(ctx, keys[0]); err != nil {
		failed.fail(fmt.Errorf("bench: delete %s: %w", keys[0], err))
	}
	done.Wait()
	if err := failed.first(); err != nil {
		return Result{}, err
	}
	if err := mt.stop(ctx, int64(w)); err != nil {
		return Result{}, err
	}
	return mt.result(), nil
}

// link is one link of a chain: it watches ahead, calls made once the
// watch is made, waits for ahead's deletion, reads mine (with read) at or
// after it, and deletes mine.
func link(ctx context.Context, cli *clientv3.Client, ahead, mine string, read bool, made func()) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, ahead, clientv3.WithCreatedNotify())
	created := false
	var at int64
	for resp := range wch {
		if err := resp.Err(); err != nil {
			if !created {
				made()
			}
			return fmt.Errorf("bench: watch %s: %w", ahead, err)
		}
		if resp.Created {
			created = true
			made()
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				at = ev.Kv.ModRevision
			}
		}
		if at != 0 {
			break
		}
	}
	if at == 0 {
		if !created {
			made()
		}
		return fmt.Errorf("bench: watch %s ended: %w", ahead, ctx.Err())
	}
	cancel()
	if read {
		resp, err := cli.Get(ctx, mine, clientv3.WithSerializable(), clientv3.WithCountOnly())
		if err == nil && resp.Header.Revision < at {
			resp, err = cli.Get(ctx, mine, clientv3.WithCountOnly())
		}
		if err != nil {
			return fmt.Errorf("bench: read %s: %w", mine, err)
		}
		if resp.Count != 1 {
			return fmt.Errorf("bench: %s is gone", mine)
		}
	}
	if _, err := cli.Delete(ctx, mine); err != nil {
		return fmt.Errorf("bench: delete %s: %w", mine, err)
	}
	return nil
}
