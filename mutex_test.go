package etcdlock_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestLockUnlock(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)

	require.Equal(t, fmt.Sprintf("%s/%x", name, int64(s.Lease())), m.Key())
	require.Zero(t, m.Token())
	require.Nil(t, m.Header())

	require.NoError(t, m.Lock(t.Context()))
	resp, err := cli.Get(t.Context(), m.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, resp.Kvs[0].CreateRevision, m.Token(), "token is the key's create revision")
	require.Equal(t, clientv3.LeaseID(resp.Kvs[0].Lease), s.Lease(), "key is bound to the session's lease")
	require.NotNil(t, m.Header())

	// IsOwner guards a write while held...
	tr, err := cli.Txn(t.Context()).If(m.IsOwner()).Then(clientv3.OpPut(name+"-data", "a")).Commit()
	require.NoError(t, err)
	require.True(t, tr.Succeeded)

	require.NoError(t, m.Unlock(t.Context()))
	require.Zero(t, m.Token())
	require.Empty(t, keys(t, cli, name))

	// ...and never after: not even though the key is now missing.
	tr, err = cli.Txn(t.Context()).If(m.IsOwner()).Then(clientv3.OpPut(name+"-data", "b")).Commit()
	require.NoError(t, err)
	require.False(t, tr.Succeeded)
}

func TestUncontendedIsTwoRPCs(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	s := newSession(t, cli)
	m := etcdlock.NewMutex(s, lockName(t))
	before := rpcs.Total()
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.EqualValues(t, 2, rpcs.Total()-before)
}

// TestNoWarnings: a correct program makes etcd's client log no warning.
// The clients log at info, as etcd's default client logger does (unless
// ETCD_CLIENT_DEBUG says otherwise). etcd's client logs every
// unary call that fails, also one the library cancelled itself: before,
// Unlock cancelled the read of Done's loss watch when it was in flight (7
// of 20 Lock, Done, Unlock cycles logged "retrying of unary invoker
// failed ... KV/Range ... context canceled"), and Close after the lease
// was revoked logged LeaseRevoke's NotFound.
func TestNoWarnings(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := clientv3.Config{Logger: zap.New(core)}
	cli, wcli := cluster.Client(t, cfg), cluster.Client(t, cfg)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name)

	for range 25 {
		require.NoError(t, m.Lock(t.Context()))
		m.Done()
		require.NoError(t, m.Unlock(t.Context()))
	}
	for range 10 {
		require.NoError(t, m.Do(t.Context(), func(context.Context) error { return nil }))
	}
	capped := etcdlock.NewMutex(s, name+"-capped", etcdlock.WithMaxHold(time.Minute))
	for range 5 {
		require.NoError(t, capped.Lock(t.Context()))
		capped.Done()
		require.NoError(t, capped.Unlock(t.Context()))
	}

	// Contention: a handoff, TryLock on a held lock, and a waiter that
	// gives up.
	ws := newSession(t, wcli)
	require.NoError(t, m.Lock(t.Context()))
	w := startWaiter(t.Context(), etcdlock.NewMutex(ws, name))
	w.waitIdle(t)
	require.ErrorIs(t, etcdlock.NewMutex(newSession(t, wcli), name).TryLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	ctx, cancel := context.WithCancel(t.Context())
	gaveUp := startWaiter(ctx, m)
	gaveUp.waitIdle(t)
	cancel()
	require.ErrorIs(t, gaveUp.result(t, 10*time.Second), context.Canceled)
	require.NoError(t, w.m.Unlock(t.Context()))

	// Close after the lease was revoked, with a hold that learns it and
	// without.
	require.NoError(t, m.Lock(t.Context()))
	held := m.Done()
	_, err = newClient(t).Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the hold did not end with its lease")
	}
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.NoError(t, s.Close())
	s2, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	_, err = newClient(t).Revoke(t.Context(), s2.Lease())
	require.NoError(t, err)
	require.NoError(t, s2.Close())

	warnings := func() []observer.LoggedEntry {
		var ws []observer.LoggedEntry
		for _, e := range logs.All() {
			if e.Level >= zapcore.WarnLevel {
				ws = append(ws, e)
			}
		}
		return ws
	}
	for _, e := range warnings() {
		t.Errorf("etcd's client logged %s %q %v", e.Level, e.Message, e.ContextMap())
	}
	// The capture works: a call the program cancels itself is logged.
	n := len(warnings())
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = cli.Get(cctx, name)
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, warnings(), n+1, "etcd's client logs no longer reach the test")
}

// TestFIFO queues more than a hundred waiters, each with its own session,
// and checks that they acquire in queue order, that each watches only the
// key just ahead of it, and that tokens strictly increase.
func TestFIFO(t *testing.T) {
	testFIFO(t, cluster, 120)
}

func testFIFO(t *testing.T, c *etcdtest.Cluster, n int) {
	name := lockName(t)
	clis := make([]*clientv3.Client, 4)
	for i := range clis {
		// Spread clients over the members of a multi-member cluster.
		clis[i] = c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(i % c.Size())}})
	}
	holder := etcdlock.NewMutex(newSession(t, clis[0]), name)
	require.NoError(t, holder.Lock(t.Context()))

	var (
		mu    sync.Mutex
		order []int
	)
	waiters := make([]*waiter, n)
	prev := holder.Key()
	for i := range waiters {
		m := etcdlock.NewMutex(newSession(t, clis[i%len(clis)]), name)
		w := startWaiter(t.Context(), m)
		waiters[i] = w
		require.Equal(t, prev, w.waitIdle(t), "waiter %d must watch only the key just ahead of it", i)
		prev = m.Key()
	}
	for _, w := range waiters {
		w.assertWaiting(t)
	}

	tokens := []int64{holder.Token()}
	require.NoError(t, holder.Unlock(t.Context()))
	for i, w := range waiters {
		require.NoError(t, w.result(t, 10*time.Second), "waiter %d", i)
		// Nobody behind the new holder may have acquired.
		for _, later := range waiters[i+1:] {
			later.assertWaiting(t)
		}
		mu.Lock()
		order = append(order, i)
		mu.Unlock()
		tok := w.m.Token()
		resp, err := clis[0].Get(t.Context(), w.m.Key())
		require.NoError(t, err)
		require.Equal(t, resp.Kvs[0].CreateRevision, tok)
		require.Greater(t, tok, tokens[len(tokens)-1], "tokens strictly increase")
		tokens = append(tokens, tok)
		require.NoError(t, w.m.Unlock(t.Context()))
	}
	require.Len(t, order, n)
	require.Empty(t, keys(t, clis[0], name))
}

// TestReleaseWakesOne checks that a release makes exactly one waiter talk
// to etcd: the others, which watch other keys, stay silent.
func TestReleaseWakesOne(t *testing.T) {
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, newClient(t)), name)
	require.NoError(t, holder.Lock(t.Context()))

	const n = 5
	counters := make([]*etcdtest.RPCCounter, n)
	waiters := make([]*waiter, n)
	for i := range waiters {
		counters[i] = new(etcdtest.RPCCounter)
		cli := cluster.Client(t, clientv3.Config{DialOptions: counters[i].DialOptions()})
		waiters[i] = startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
		waiters[i].waitIdle(t)
	}
	before := make([]int64, n)
	for i, c := range counters {
		before[i] = c.Unary()
	}
	require.NoError(t, holder.Unlock(t.Context()))
	require.NoError(t, waiters[0].result(t, 10*time.Second))
	// One read (see RPCCounter.Reads: under load a serializable read can
	// come back before the member applied the release it was woken by,
	// and is asked again, linearizable).
	require.EqualValues(t, 1, counters[0].Reads(before[0]), "the next waiter needs one RPC to take over: %v", counters[0].UnaryMethods(before[0]))
	for i := 1; i < n; i++ {
		require.Equal(t, before[i], counters[i].Unary(), "waiter %d was woken", i)
		waiters[i].assertWaiting(t)
	}
	require.NoError(t, waiters[0].m.Unlock(t.Context()))
	for i := 1; i < n; i++ {
		require.NoError(t, waiters[i].result(t, 10*time.Second))
		require.NoError(t, waiters[i].m.Unlock(t.Context()))
	}
}

// TestContention has contenders, each with its own client and session,
// take turns and checks no two are ever inside at once.
func TestContention(t *testing.T) {
	testContention(t, cluster, 4, 25)
}

func testContention(t *testing.T, c *etcdtest.Cluster, contenders, rounds int) {
	name := lockName(t)
	var inside, total atomic.Int64
	errc := make(chan error, contenders)
	for i := range contenders {
		cli := c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(i % c.Size())}})
		m := etcdlock.NewMutex(newSession(t, cli), name)
		go func() {
			for range rounds {
				if err := m.Lock(t.Context()); err != nil {
					errc <- err
					return
				}
				if n := inside.Add(1); n != 1 {
					errc <- fmt.Errorf("%d holders inside at once", n)
					return
				}
				total.Add(1)
				inside.Add(-1)
				if err := m.Unlock(t.Context()); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range contenders {
		require.NoError(t, <-errc)
	}
	require.EqualValues(t, contenders*rounds, total.Load())
}

// TestInterop mixes this Mutex and etcd's concurrency.Mutex on one name:
// they exclude and queue in both directions.
func TestInterop(t *testing.T) { testInterop(t, lockName(t)) }

// TestInteropEtcdNames: names as etcd's Mutex and `etcdctl lock` take
// them, those of etcd's own examples ("/my-lock/") included, are one
// queue with etcd's Mutex, whose key is name + "/" + the lease in hex.
// They were refused as names that end in "/" or hold "//" (issue 30),
// which broke code moving over from etcd's package; and renaming such a
// lock ("/my-lock") would make it a queue apart from the old processes'.
func TestInteropEtcdNames(t *testing.T) {
	for _, name := range []string{"/my-lock/", "/" + lockName(t) + "/", lockName(t) + "//b", "/", "//" + lockName(t)} {
		t.Run(strings.ReplaceAll(name, "/", "_"), func(t *testing.T) { testInterop(t, name) })
	}
}

func testInterop(t *testing.T, name string) {
	cli := newClient(t)
	es, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer es.Close()
	theirs := concurrency.NewMutex(es, name)
	ours := etcdlock.NewMutex(newSession(t, cli), name)

	// Theirs holds: ours cannot take it, and waits. One key layout:
	// name + "/" + the lease in hex.
	require.NoError(t, theirs.Lock(t.Context()))
	require.Equal(t, fmt.Sprintf("%s/%x", name, int64(es.Lease())), theirs.Key())
	require.True(t, strings.HasPrefix(ours.Key(), name+"/"), ours.Key())
	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, q.Holders(), 1)
	require.Equal(t, theirs.Key(), q.Holders()[0].Key)
	require.ErrorIs(t, ours.TryLock(t.Context()), etcdlock.ErrLocked)
	w := startWaiter(t.Context(), ours)
	require.Equal(t, theirs.Key(), w.waitIdle(t))
	w.assertWaiting(t)
	require.NoError(t, theirs.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))

	// Ours holds: theirs cannot take it, and waits.
	require.ErrorIs(t, theirs.TryLock(t.Context()), concurrency.ErrLocked)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	require.ErrorIs(t, theirs.Lock(ctx), context.DeadlineExceeded)
	cancel()
	got := make(chan error, 1)
	go func() { got <- theirs.Lock(t.Context()) }()
	// Wait until their key is queued behind ours.
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("etcd's Mutex acquired (%v) while ours holds", err)
	default:
	}
	require.NoError(t, ours.Unlock(t.Context()))
	require.NoError(t, <-got)
	require.NoError(t, theirs.Unlock(t.Context()))
}

// TestSameMutexConcurrent: a *Mutex is safe for concurrent use, and two
// Mutex values of one session and name exclude each other (etcd issues
// 11360 and 12017).
func TestSameMutexConcurrent(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	require.NoError(t, m.Lock(t.Context()))

	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked)
	got := make(chan error, 1)
	go func() { got <- m.Lock(t.Context()) }()

	m2 := etcdlock.NewMutex(s, name)
	require.ErrorIs(t, m2.TryLock(t.Context()), etcdlock.ErrLocked)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	require.ErrorIs(t, m2.Lock(ctx), context.DeadlineExceeded)
	cancel()
	select {
	case err := <-got:
		t.Fatalf("second Lock on a held Mutex returned %v", err)
	default:
	}
	require.Len(t, keys(t, cli, name), 1)

	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, <-got)
	require.NoError(t, m.Unlock(t.Context()))
	require.ErrorIs(t, m2.Unlock(t.Context()), etcdlock.ErrLockReleased)
}

// TestUnlockNeverDeletesAnothersKey: Unlock compares the create revision,
// so a key recreated under the same name (same lease, as in etcd issue
// 22082) or another holder's key survives it.
func TestUnlockNeverDeletesAnothersKey(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s1 := newSession(t, cli)
	m1 := etcdlock.NewMutex(s1, name)
	require.NoError(t, m1.Lock(t.Context()))

	// An operator deletes the key; another session takes the lock.
	_, err := cli.Delete(t.Context(), m1.Key())
	require.NoError(t, err)
	other := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, other.Lock(t.Context()))
	require.ErrorIs(t, m1.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.Equal(t, []string{other.Key()}, keys(t, cli, name))
	require.NoError(t, other.Unlock(t.Context()))

	// The same key name, recreated by another user of the same lease
	// (etcd's Mutex in another process that was handed the lease).
	require.NoError(t, m1.Lock(t.Context()))
	_, err = cli.Delete(t.Context(), m1.Key())
	require.NoError(t, err)
	put, err := cli.Put(t.Context(), m1.Key(), "", clientv3.WithLease(s1.Lease()))
	require.NoError(t, err)
	require.ErrorIs(t, m1.Unlock(t.Context()), etcdlock.ErrLockLost)
	resp, err := cli.Get(t.Context(), m1.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "Unlock deleted a key it did not create")
	require.Equal(t, put.Header.Revision, resp.Kvs[0].CreateRevision)
	_, err = cli.Delete(t.Context(), m1.Key())
	require.NoError(t, err)
}

// TestLockCtxEndsLeavesNoKey: a Lock whose ctx ends returns ctx's error and
// leaves no key.
func TestLockCtxEndsLeavesNoKey(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, holder.Lock(t.Context()))

	m := etcdlock.NewMutex(newSession(t, cli), name)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	err := m.Lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, []string{holder.Key()}, keys(t, cli, name))

	ctx, cancel = context.WithCancel(t.Context())
	w := startWaiter(ctx, m)
	w.waitIdle(t)
	cancel()
	require.ErrorIs(t, w.result(t, 10*time.Second), context.Canceled)
	require.Equal(t, []string{holder.Key()}, keys(t, cli, name))
	require.Zero(t, m.Token())

	// Already-ended ctx: no RPC, no key.
	require.ErrorIs(t, m.Lock(ctx), context.Canceled)
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestLockGrantedAsCtxEnds races a waiter's cancellation against the
// holder's release. Whichever wins, Lock's result and etcd agree: an error
// leaves no key, success leaves the waiter holding.
func TestLockGrantedAsCtxEnds(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	m := etcdlock.NewMutex(newSession(t, cli), name)
	var won, lost int
	for range 20 {
		require.NoError(t, holder.Lock(t.Context()))
		ctx, cancel := context.WithCancel(t.Context())
		w := startWaiter(ctx, m)
		w.waitIdle(t)
		go cancel()
		require.NoError(t, holder.Unlock(t.Context()))
		err := w.result(t, 10*time.Second)
		if err != nil {
			require.ErrorIs(t, err, context.Canceled)
			require.Empty(t, keys(t, cli, name), "a failed Lock left its key")
			lost++
			continue
		}
		won++
		require.Equal(t, []string{m.Key()}, keys(t, cli, name))
		require.NoError(t, m.Unlock(t.Context()))
	}
	t.Logf("cancel won %d times, acquisition %d times", lost, won)
}

// TestWaiterNoticesOwnLeaseEnd: a waiter whose lease is revoked returns
// ErrSessionExpired while the holder still holds (etcd issue 19597).
func TestWaiterNoticesOwnLeaseEnd(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, holder.Lock(t.Context()))

	s := newSession(t, cli)
	w := startWaiter(t.Context(), etcdlock.NewMutex(s, name))
	w.waitIdle(t)
	_, err := cli.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	require.ErrorIs(t, w.result(t, 10*time.Second), etcdlock.ErrSessionExpired)
	select {
	case <-s.Done():
	default:
		t.Fatal("the session did not end with its lease")
	}
	require.Equal(t, []string{holder.Key()}, keys(t, cli, name))

	// A waiter whose key an operator deletes learns it too.
	w = startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	w.waitIdle(t)
	_, err = cli.Delete(t.Context(), w.m.Key())
	require.NoError(t, err)
	require.ErrorIs(t, w.result(t, 10*time.Second), etcdlock.ErrLockLost)
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestHolderDiesHandsOver: a holder that stops renewing hands the lock to
// the next waiter when its lease runs out.
func TestHolderDiesHandsOver(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	hs := newSession(t, cli, etcdlock.WithTTL(2*time.Second))
	holder := etcdlock.NewMutex(hs, name)
	require.NoError(t, holder.Lock(t.Context()))

	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	w.waitIdle(t)
	hs.Orphan() // the holder "dies": no more keepalives, no unlock
	start := time.Now()
	require.NoError(t, w.result(t, hs.TTL()+2*time.Second))
	t.Logf("handed over %v after the holder died (TTL %v)", time.Since(start).Round(time.Millisecond), hs.TTL())
	require.ErrorIs(t, holder.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.NoError(t, w.m.Unlock(t.Context()))
}

// TestCompactionNeverFailsWaiter compacts at the current revision every few
// milliseconds while contenders take turns.
func TestCompactionNeverFailsWaiter(t *testing.T) {
	cli := newClient(t)
	stopCompactor := startCompactor(t, cli)
	testContention(t, cluster, 4, 20)
	compactions := stopCompactor()
	require.Positive(t, compactions)
	t.Logf("%d compactions during the run", compactions)
}

// TestNestedNames: a lock named "jobs" is never blocked by one named
// "jobs/<x>", also when more nested keys exist than one read returns.
func TestNestedNames(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	var nested []*etcdlock.Mutex
	for i := range 12 {
		m := etcdlock.NewMutex(newSession(t, cli), fmt.Sprintf("%s/n%d", name, i))
		require.NoError(t, m.Lock(t.Context()))
		nested = append(nested, m)
	}
	s := newSession(t, cli)
	m := etcdlock.NewMutex(s, name)
	require.NoError(t, m.TryLock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, m.Lock(t.Context()))

	// A waiter on "jobs" behind the holder, with nested keys created in
	// between, still watches the holder and gets the lock from it.
	for i := range 12 {
		n := etcdlock.NewMutex(newSession(t, cli), fmt.Sprintf("%s/later%d", name, i))
		require.NoError(t, n.Lock(t.Context()))
	}
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	require.Equal(t, m.Key(), w.waitIdle(t))
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.NoError(t, w.m.Unlock(t.Context()))

	// And a nested lock is not blocked by its parent.
	require.NoError(t, m.Lock(t.Context()))
	sub := etcdlock.NewMutex(newSession(t, cli), name+"/sub")
	require.NoError(t, sub.TryLock(t.Context()))
	require.NoError(t, sub.Unlock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	for _, n := range nested {
		require.NoError(t, n.Unlock(t.Context()))
	}
}

func TestTryLock(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, cli), name)
	m := etcdlock.NewMutex(newSession(t, cli), name)

	before := rpcs.Total()
	require.NoError(t, m.TryLock(t.Context()))
	require.EqualValues(t, 2, rpcs.Total()-before, "TryLock on a free lock: one read, one write")
	require.Positive(t, m.Token())

	r0, err := cli.Get(t.Context(), "x")
	require.NoError(t, err)
	before = rpcs.Total()
	require.ErrorIs(t, holder.TryLock(t.Context()), etcdlock.ErrLocked)
	require.EqualValues(t, 1, rpcs.Total()-before, "TryLock on a held lock: one read")
	r1, err := cli.Get(t.Context(), "x")
	require.NoError(t, err)
	require.Equal(t, r0.Header.Revision, r1.Header.Revision, "TryLock on a held lock consumed a revision")
	require.Equal(t, []string{m.Key()}, keys(t, cli, name))

	// TryLock never jumps the queue: with the holder gone but a waiter
	// queued, the lock goes to the waiter.
	w := startWaiter(t.Context(), holder)
	w.waitIdle(t)
	third := etcdlock.NewMutex(newSession(t, cli), name)
	require.ErrorIs(t, third.TryLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.ErrorIs(t, third.TryLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, holder.Unlock(t.Context()))
}

func TestBadInput(t *testing.T) {
	cli := newClient(t)

	_, err := etcdlock.NewSession(t.Context(), nil)
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
	//nolint:staticcheck // a nil context is the bad input under test
	_, err = etcdlock.NewSession(nil, cli)
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
	for _, ttl := range []time.Duration{0, -time.Second, 500 * time.Millisecond} {
		_, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithTTL(ttl))
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption, "TTL %v", ttl)
	}
	_, err = etcdlock.NewSession(t.Context(), cli, etcdlock.WithLease(0))
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
	_, err = etcdlock.NewSession(t.Context(), cli, etcdlock.WithLease(0x7eadbeef))
	require.ErrorIs(t, err, etcdlock.ErrSessionExpired)
	//nolint:staticcheck // a nil context is the bad input under test
	_, err = etcdlock.NewSession(t.Context(), cli, etcdlock.WithContext(nil))
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)

	s := newSession(t, cli, etcdlock.WithTTL(2500*time.Millisecond))
	require.Equal(t, 3*time.Second, s.TTL(), "fractions of a second round up")

	// The library's own range: "__etcdlock" would queue over every
	// request and delay record (issue 30).
	for _, name := range []string{"", strings.Repeat("x", etcdlock.MaxNameLen+1), "__etcdlock", "__etcdlock/x", "__etcdlock/"} {
		m := etcdlock.NewMutex(s, name)
		require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, etcdlock.NewSemaphore(s, name, 2).Acquire(t.Context(), 1), etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, etcdlock.NewRWMutex(s, name).RLock(t.Context()), etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, etcdlock.NewElection(s, name).Campaign(t.Context(), "v"), etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, etcdlock.Lead(t.Context(), cli, name, "v", func(context.Context) error { return nil }), etcdlock.ErrInvalidName, "%q", name)
		_, err := etcdlock.InspectLock(t.Context(), cli, name)
		require.ErrorIs(t, err, etcdlock.ErrInvalidName, "%q", name)
		require.ErrorIs(t, etcdlock.RequestRelease(t.Context(), cli, name), etcdlock.ErrInvalidName, "%q", name)
	}
	// Every other name is taken as etcd's Mutex takes it: a leading "/",
	// slashes inside, a trailing "/" and "//" (TestInteropEtcdNames).
	for _, name := range []string{"/" + lockName(t), lockName(t) + "/a/b", lockName(t) + "/", lockName(t) + "//c", "__etcdlockx", "x/__etcdlock"} {
		m := etcdlock.NewMutex(s, name)
		require.NoError(t, m.Lock(t.Context()), "%q", name)
		require.NoError(t, m.Unlock(t.Context()), "%q", name)
	}
	// The longest valid name works.
	long := etcdlock.NewMutex(s, strings.Repeat("y", etcdlock.MaxNameLen))
	require.NoError(t, long.Lock(t.Context()))
	require.NoError(t, long.Unlock(t.Context()))

	m := etcdlock.NewMutex(s, lockName(t))
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockReleased, "Unlock before Lock")
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockReleased, "double Unlock")

	require.ErrorIs(t, etcdlock.NewMutex(nil, "x").Lock(t.Context()), etcdlock.ErrSessionExpired)

	require.NoError(t, s.Close())
	require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrSessionExpired)
	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrSessionExpired)
	require.NoError(t, s.Close(), "second Close")
}

// TestAuth: a user whose role grants readwrite on the lock's prefix only can
// lock; one without gets etcd's permission error and leaves nothing.
func TestAuth(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := "authlock"
	c := authCluster(t, name)

	alice := c.Client(t, clientv3.Config{Username: "alice", Password: "alice-pw"})
	a1 := etcdlock.NewMutex(newSession(t, alice), name)
	a2 := etcdlock.NewMutex(newSession(t, alice), name)
	require.NoError(t, a1.Lock(ctx))
	require.ErrorIs(t, a2.TryLock(ctx), etcdlock.ErrLocked)
	w := startWaiter(ctx, a2)
	w.waitIdle(t)
	require.NoError(t, a1.Unlock(ctx))
	require.NoError(t, w.result(t, 10*time.Second))
	require.NoError(t, a2.Unlock(ctx))
	require.NoError(t, a1.TryLock(ctx))
	require.NoError(t, a1.Unlock(ctx))

	bob := c.Client(t, clientv3.Config{Username: "bob", Password: "bob-pw"})
	b := etcdlock.NewMutex(newSession(t, bob), name)
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.ErrorIs(t, b.Lock(lctx), rpctypes.ErrPermissionDenied)
	require.ErrorIs(t, b.TryLock(lctx), rpctypes.ErrPermissionDenied)
	rootAuthed := c.Client(t, clientv3.Config{Username: "root", Password: "root-pw"})
	require.Empty(t, keys(t, rootAuthed, name))
}

// TestNoSpace checks what a cluster out of space does (etcd's NOSPACE
// alarm, raised here as etcd raises it when its backend passes its quota):
// Lock, TryLock and NewSession, whose writes etcd refuses, return its
// error at once and leave no key, rather than waiting for an operator until
// their ctx ends; Unlock, a delete, still releases. The ctx of each call is
// long: were the error waited on, the call would return the ctx's error.
func TestNoSpace(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx := t.Context()
	a := etcdlock.NewMutex(newSession(t, cli), "nospace-held")
	require.NoError(t, a.Lock(ctx))
	b := etcdlock.NewMutex(newSession(t, cli), "nospace")

	resp, err := cli.Get(ctx, "any")
	require.NoError(t, err)
	alarm := func(action pb.AlarmRequest_AlarmAction) {
		_, err := pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
			Action: action, MemberID: resp.Header.MemberId, Alarm: pb.AlarmType_NOSPACE})
		require.NoError(t, err)
	}
	alarm(pb.AlarmRequest_ACTIVATE) // the cluster is this test's own

	long, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.ErrorIs(t, b.Lock(long), rpctypes.ErrNoSpace)
	require.ErrorIs(t, b.TryLock(long), rpctypes.ErrNoSpace)
	require.Empty(t, keys(t, cli, "nospace"))
	_, err = etcdlock.NewSession(long, cli)
	require.ErrorIs(t, err, rpctypes.ErrNoSpace)
	require.NoError(t, long.Err(), "the calls waited for their ctx")

	require.NoError(t, a.Unlock(ctx))
	require.Empty(t, keys(t, cli, "nospace-held"))

	alarm(pb.AlarmRequest_DEACTIVATE)
	require.NoError(t, b.Lock(ctx))
	require.NoError(t, b.Unlock(ctx))
}

// TestThreeMembers runs the contract on a three-member cluster, with the
// clients spread over the members.
func TestThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member cluster")
	}
	c := etcdtest.Start(t, 3)
	t.Run("FIFO", func(t *testing.T) { testFIFO(t, c, 30) })
	t.Run("Contention", func(t *testing.T) { testContention(t, c, 4, 20) })
}
