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
	"google.golang.org/grpc"
)

// TestLeadFailover runs three instances of a primary/standby service with
// Lead. The leader is cut off from etcd (a partition): its fn's ctx ends
// before a standby's fn starts, and a standby takes over once etcd has
// deleted the leader's key (its lease expired). The new leader's process
// dies (its client closes: no renewal, no revoke): the last standby takes
// over once etcd has deleted that key, and the dead one,
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

	// A partition of the leader. When etcd deletes its key is etcd's
	// affair; the standby's part is to lead once it is gone.
	deletion := watchDeletion(t, cli, keys(t, cli, name)[0])
	ins[first].px.Cut()
	cut := time.Now()
	deleted := deletion(ttl + 30*time.Second)
	second := waitStart(10 * time.Second)
	t.Logf("partition: instance %d took over %v after the cut of %d, %v after etcd deleted its key",
		second, time.Since(cut).Round(time.Millisecond), first, time.Since(deleted).Round(time.Millisecond))
	require.NotEqual(t, first, second)
	mu.Lock()
	require.Equal(t, []string{"start " + strconv.Itoa(first), "stop " + strconv.Itoa(first), "start " + strconv.Itoa(second)}, events)
	mu.Unlock()

	// The new leader's process dies.
	third := 3 - first - second
	deletion = watchDeletion(t, cli, keys(t, cli, name)[0])
	require.NoError(t, ins[second].cli.Close())
	killed := time.Now()
	deleted = deletion(ttl + 30*time.Second)
	require.Equal(t, third, waitStart(10*time.Second))
	t.Logf("kill: instance %d took over %v after %d died, %v after etcd deleted its key",
		third, time.Since(killed).Round(time.Millisecond), second, time.Since(deleted).Round(time.Millisecond))
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

// TestLeadEndReleases: a term that ends normally, by fn's return or by
// Lead's ctx, is a release to Hooks, not a loss: Lead resigns before it
// ends the session (else the session's end reported the leadership lost
// with cause session_closed). The key is gone when Lead returns.
func TestLeadEndReleases(t *testing.T) {
	for _, end := range []string{"fn returns", "ctx ends"} {
		t.Run(end, func(t *testing.T) {
			cli := newClient(t)
			name := lockName(t)
			var (
				mu    sync.Mutex
				holds []etcdlock.HoldDoneInfo
			)
			hooks := etcdlock.Hooks{HoldDone: func(i etcdlock.HoldDoneInfo) {
				mu.Lock()
				defer mu.Unlock()
				holds = append(holds, i)
			}}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			fn := func(context.Context) error { return nil }
			want := error(nil)
			if end == "ctx ends" {
				fn = func(fctx context.Context) error {
					cancel()
					<-fctx.Done()
					return context.Cause(fctx)
				}
				want = context.Canceled
			}
			err := etcdlock.Lead(ctx, cli, name, "v", fn, etcdlock.WithSessionOptions(etcdlock.WithHooks(hooks)))
			if want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, want)
			}
			require.Empty(t, keys(t, cli, name), "Lead did not resign")
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, holds, 1)
			require.Equal(t, etcdlock.KindElection, holds[0].Kind)
			require.Equal(t, etcdlock.Released.String(), holds[0].End.String(), "HoldDone: %v", holds[0].Err)
			require.NoError(t, holds[0].Err)
		})
	}
}

// TestLeadCutOff runs Lead on a client whose only link to etcd is cut:
// the leadership is lost within the TTL, and the Grant of the fresh
// session Lead then asks for goes unanswered. Lead gives each Grant up
// after the TTL and sends another, so that once the link is back (a new
// route to etcd: the cut connection stays silent) it leads again; before
// the fix the first Grant waited for ctx. Lead's ctx ending while a Grant
// waits makes Lead return at once; while it leads, within the 5s its
// resign may take, however long the TTL.
func TestLeadCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire")
	}
	const ttl = 2 * time.Second
	// waitFor waits for c within d.
	waitFor := func(t *testing.T, c <-chan struct{}, d time.Duration, what string) {
		t.Helper()
		select {
		case <-c:
		case <-time.After(d):
			t.Fatalf("no %s within %v", what, d)
		}
	}
	// cutOff starts Lead with ttl on a client through a proxy, cuts the
	// proxy once Lead leads and, if lose, waits for the loss and the Grant
	// that follows it. It returns the client, a channel that receives each
	// Grant the client sends and each term's start, Lead's cancel and its
	// result.
	cutOff := func(t *testing.T, ttl time.Duration, lose bool) (cli *clientv3.Client, grants, started <-chan struct{}, cancel context.CancelFunc, done <-chan error) {
		name := lockName(t)
		px := etcdtest.NewProxy(t, endpoints[0])
		grantc := make(chan struct{}, 16)
		countGrants := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == "/etcdserverpb.Lease/LeaseGrant" {
				grantc <- struct{}{}
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		})
		cli = cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}, DialOptions: []grpc.DialOption{countGrants}})
		startc, stopped := make(chan struct{}, 4), make(chan struct{}, 4)
		fn := func(ctx context.Context) error {
			startc <- struct{}{}
			<-ctx.Done()
			stopped <- struct{}{}
			return context.Cause(ctx)
		}
		ctx, cancel := context.WithCancel(t.Context())
		res, returned := make(chan error, 1), make(chan struct{})
		go func() {
			defer close(returned)
			res <- etcdlock.Lead(ctx, cli, name, "v", fn, etcdlock.WithSessionOptions(etcdlock.WithTTL(ttl)))
		}()
		t.Cleanup(func() {
			cancel()
			<-returned
		})
		waitFor(t, grantc, 10*time.Second, "Grant")
		waitFor(t, startc, 10*time.Second, "term")
		px.Cut()
		if !lose {
			return cli, grantc, startc, cancel, res
		}
		waitFor(t, stopped, ttl+10*time.Second, "loss of the leadership")
		// The fresh session's Grant goes into the cut link.
		waitFor(t, grantc, 10*time.Second, "Grant after the loss")
		return cli, grantc, startc, cancel, res
	}

	t.Run("ctx ends", func(t *testing.T) {
		_, _, _, cancel, done := cutOff(t, ttl, true)
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			t.Fatal("Lead did not return within 10s of its ctx's end")
		}
	})
	t.Run("ctx ends while leading", func(t *testing.T) {
		// The resign cannot reach etcd: it gives up after 5s, not the
		// TTL, and the lease is left to expire rather than revoked (a
		// revoke would wait for the TTL too).
		const ttl = 10 * time.Second
		_, _, _, cancel, done := cutOff(t, ttl, false)
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(9 * time.Second):
			t.Fatalf("Lead did not return within 9s of its ctx's end (TTL %v)", ttl)
		}
	})
	t.Run("link back", func(t *testing.T) {
		cli, grants, started, cancel, done := cutOff(t, ttl, true)
		// Given up after the TTL, the Grant is sent again after the
		// backoff (up to 5s).
		waitFor(t, grants, ttl+6*time.Second, "second Grant after the loss")
		// The link is back: a new route, as the client's reconnection
		// would find once the network heals.
		cli.SetEndpoints(endpoints[0])
		waitFor(t, started, 2*ttl+6*time.Second, "term after the link came back")
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
		require.Empty(t, keys(t, newClient(t), lockName(t)), "Lead did not resign")
	})
}

// TestLeadTerm: fn's ctx carries the term Lead won, as etcd has it (key,
// lease, create revision as the token), also through contexts derived
// from it. A write guarded by the term's IsOwner is applied while the term
// lasts and never after its key is deleted, not even once Lead leads again;
// the next term's token is larger. A ctx not given by Lead carries none.
func TestLeadTerm(t *testing.T) {
	t.Parallel()
	cli, other := newClient(t), newClient(t)
	name := lockName(t)
	data := name + "-data" // outside the election's prefix
	t.Cleanup(func() { other.Delete(context.WithoutCancel(t.Context()), data) })

	type run struct {
		ctx  context.Context
		term etcdlock.Term
		ok   bool
	}
	runs, release := make(chan run, 2), make(chan struct{})
	fn := func(ctx context.Context) error {
		term, ok := etcdlock.TermFromContext(ctx)
		runs <- run{ctx, term, ok}
		select {
		case <-ctx.Done():
			return context.Cause(ctx) // lost: Lead campaigns again
		case <-release:
			return nil // Lead resigns and returns nil
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done, returned := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(returned)
		done <- etcdlock.Lead(ctx, cli, name, "v", fn)
	}()
	t.Cleanup(func() {
		cancel()
		<-returned
	})
	next := func() run {
		t.Helper()
		select {
		case r := <-runs:
			require.True(t, r.ok, "fn's ctx carries no term")
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no term began within 10s")
		}
		return run{}
	}
	// put writes v to data, guarded by c, and reports whether it was applied.
	put := func(c clientv3.Cmp, v string) bool {
		t.Helper()
		resp, err := other.Txn(t.Context()).If(c).Then(clientv3.OpPut(data, v)).Commit()
		require.NoError(t, err)
		return resp.Succeeded
	}
	get := func() string {
		t.Helper()
		resp, err := other.Get(t.Context(), data)
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	first := next()
	term := first.term
	derived, cancelDerived := context.WithTimeout(first.ctx, time.Minute)
	defer cancelDerived()
	dt, ok := etcdlock.TermFromContext(derived)
	require.True(t, ok, "a context derived from fn's carries no term")
	require.Equal(t, term, dt)

	// The term is what etcd has for the leader's key.
	resp, err := other.Get(t.Context(), term.Key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "no key %s", term.Key)
	kv := resp.Kvs[0]
	require.Equal(t, fmt.Sprintf("%s/%x", name, int64(term.Lease)), term.Key)
	require.Equal(t, kv.CreateRevision, term.Token)
	require.Equal(t, kv.Lease, int64(term.Lease))
	require.Equal(t, "v", string(term.Value))
	require.Equal(t, "v", string(kv.Value))
	// Won at or after the key's creation, and before this read.
	require.GreaterOrEqual(t, term.Revision, term.Token)
	require.LessOrEqual(t, term.Revision, resp.Header.Revision)
	l, err := etcdlock.CurrentLeader(t.Context(), other, name)
	require.NoError(t, err)
	require.Equal(t, term.Key, l.Key)
	require.Equal(t, term.Token, l.Token)

	// While leading, a guarded write is applied.
	require.True(t, put(term.IsOwner(), "first"), "write guarded by the term's IsOwner refused while leading")
	require.Equal(t, "first", get())

	// Someone deletes the leader's key: the term is lost, fn's ctx ends,
	// and the term's guarded write is refused.
	_, err = other.Delete(t.Context(), term.Key)
	require.NoError(t, err)
	select {
	case <-first.ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("fn's ctx did not end within 10s of the loss")
	}
	require.ErrorIs(t, context.Cause(first.ctx), etcdlock.ErrLockLost)
	require.False(t, put(term.IsOwner(), "stale"), "write guarded by a lost term's IsOwner applied")
	require.Equal(t, "first", get())

	// Lead leads again, with a fresh session: a new key and a larger
	// token. The lost term's guard still never holds; the new one's does.
	second := next()
	require.Greater(t, second.term.Token, term.Token)
	require.NotEqual(t, term.Key, second.term.Key)
	require.False(t, put(term.IsOwner(), "stale"), "write guarded by a lost term's IsOwner applied under the next term")
	require.True(t, put(second.term.IsOwner(), "second"), "write guarded by the new term's IsOwner refused")
	require.Equal(t, "second", get())

	// fn returns: Lead resigns, and the term's guard holds no more.
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Lead did not return within 10s of fn's return")
	}
	require.False(t, put(second.term.IsOwner(), "stale"), "write guarded by a resigned term's IsOwner applied")
	require.Equal(t, "second", get())

	// Contexts Lead did not give fn carry no term, and a write guarded by
	// the zero Term, which names no key, is refused by etcd.
	zero, ok := etcdlock.TermFromContext(context.Background())
	require.False(t, ok)
	require.Equal(t, etcdlock.Term{}, zero)
	_, ok = etcdlock.TermFromContext(ctx)
	require.False(t, ok, "Lead's own ctx carries a term")
	_, err = other.Txn(t.Context()).If(zero.IsOwner()).Then(clientv3.OpPut(data, "zero")).Commit()
	require.Error(t, err, "write guarded by the zero Term's IsOwner")
	require.Equal(t, "second", get())
}
