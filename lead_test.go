package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeadFailover runs three instances of a primary/standby service with
// Lead. The leader is cut off from etcd (a partition): its fn's ctx ends
// before a standby's fn starts, and a standby takes over within TTL + 1s.
// The new leader's process dies (its client closes: no renewal, no
// revoke): the last standby takes over within TTL + 1s, and the dead one,
// restarted, rejoins as a standby. The leader's ctx ends: it resigns, and
// the standby takes over at once. fn never runs twice at once.
func TestLeadFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire")
	}
	t.Parallel()
	name := lockName(t)
	const ttl = 2 * time.Second
	var (
		running atomic.Int32
		twice   atomic.Bool
		mu      sync.Mutex
		events  []string             // "start i" and "stop i", in order
		seen    = map[int][]string{} // the leaders each instance's observer saw
	)
	started := make(chan int, 16)
	record := func(ev string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}
	type instance struct {
		px     *etcdtest.Proxy
		cli    *clientv3.Client
		cancel context.CancelFunc
		done   chan struct{} // closed when Lead returned
		err    error         // what Lead returned
	}
	start := func(i int) *instance {
		px := etcdtest.NewProxy(t, endpoints[0])
		cli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
		ctx, cancel := context.WithCancel(t.Context())
		in := &instance{px: px, cli: cli, cancel: cancel, done: make(chan struct{})}
		fn := func(ctx context.Context) error {
			if running.Add(1) > 1 {
				twice.Store(true)
			}
			record("start " + strconv.Itoa(i))
			started <- i
			<-ctx.Done()
			record("stop " + strconv.Itoa(i))
			running.Add(-1)
			return context.Cause(ctx)
		}
		observer := func(l etcdlock.Leader) {
			mu.Lock()
			defer mu.Unlock()
			if l.Key != "" {
				seen[i] = append(seen[i], string(l.Value))
			}
		}
		opts := []etcdlock.LeadOption{etcdlock.WithSessionOptions(etcdlock.WithTTL(ttl)), etcdlock.WithObserver(observer)}
		go func() {
			defer close(in.done)
			in.err = etcdlock.Lead(ctx, cli, name, strconv.Itoa(i), fn, opts...)
		}()
		t.Cleanup(func() {
			cancel()
			<-in.done
		})
		return in
	}
	// waitStart waits for an fn to start within d and returns its
	// instance.
	waitStart := func(d time.Duration) int {
		t.Helper()
		select {
		case i := <-started:
			return i
		case <-time.After(d):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("no fn started within %v; events %v", d, events)
		}
		return -1
	}
	cli := newClient(t)

	ins := []*instance{start(0), start(1), start(2)}
	first := waitStart(10 * time.Second)
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 3 }, 10*time.Second, 10*time.Millisecond)

	// A partition of the leader.
	ins[first].px.Cut()
	cut := time.Now()
	second := waitStart(ttl + time.Second)
	t.Logf("partition: instance %d took over %v after the cut of %d", second, time.Since(cut).Round(time.Millisecond), first)
	require.NotEqual(t, first, second)
	mu.Lock()
	require.Equal(t, []string{"start " + strconv.Itoa(first), "stop " + strconv.Itoa(first), "start " + strconv.Itoa(second)}, events)
	mu.Unlock()

	// The new leader's process dies.
	third := 3 - first - second
	require.NoError(t, ins[second].cli.Close())
	killed := time.Now()
	require.Equal(t, third, waitStart(ttl+time.Second))
	t.Logf("kill: instance %d took over %v after %d died", third, time.Since(killed).Round(time.Millisecond), second)
	<-ins[second].done
	require.Error(t, ins[second].err, "Lead on a closed client")
	// It restarts, and waits as a standby.
	restarted := start(second)
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 10*time.Millisecond)
	l, err := etcdlock.CurrentLeader(t.Context(), cli, name)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(third), string(l.Value))

	// The leader's ctx ends: it resigns, and the restarted one leads at
	// once, not a TTL later.
	ins[third].cancel()
	<-ins[third].done
	require.ErrorIs(t, ins[third].err, context.Canceled)
	require.Equal(t, second, waitStart(ttl/2))
	restarted.cancel()

	require.False(t, twice.Load(), "fn ran twice at once")
	mu.Lock()
	defer mu.Unlock()
	// The third leader's observer saw every leader in turn, until it resigned.
	require.Equal(t, []string{strconv.Itoa(first), strconv.Itoa(second), strconv.Itoa(third)}, seen[third])
}

// TestLeadReturns: Lead returns fn's error, resigning, when fn returns on
// its own while leader; and at once for what cannot pass.
func TestLeadReturns(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	errFn := errors.New("fn failed")
	err := etcdlock.Lead(t.Context(), cli, name, "v", func(context.Context) error { return errFn })
	require.ErrorIs(t, err, errFn)
	require.Empty(t, keys(t, cli, name), "Lead did not resign")
	fn := func(context.Context) error { return nil }
	require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, "", "v", fn), etcdlock.ErrInvalidName)
	require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, name, "etcdlock/1 shared", fn), etcdlock.ErrInvalidValue)
	require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, name, "v", fn, etcdlock.WithObserver(nil)), etcdlock.ErrInvalidOption)
	require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, name, "v", fn, etcdlock.WithSessionOptions(etcdlock.WithTTL(0))), etcdlock.ErrInvalidOption)
	require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, name, "v", fn, etcdlock.WithSessionOptions(etcdlock.WithLease(1))), etcdlock.ErrInvalidOption)
}

// ExampleLead runs a primary/standby service: the work runs only while
// this instance leads, and stops the moment the leadership is lost.
func ExampleLead() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()

	err = etcdlock.Lead(ctx, cli, "example/scheduler", "instance-a", func(ctx context.Context) error {
		fmt.Println("leading")
		// ... the primary's work, until ctx ends (leadership lost, or
		// Lead's ctx ended) or the work is done ...
		return nil // done: Lead resigns and returns
	}, etcdlock.WithSessionOptions(etcdlock.WithTTL(5*time.Second)))
	fmt.Println("Lead returned:", err)
	// Output:
	// leading
	// Lead returned: <nil>
}
