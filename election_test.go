package etcdlock_test

import (
	"context"
	"fmt"
	"iter"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// campaign starts e.Campaign(ctx, value) in a goroutine.
func campaign(ctx context.Context, e *etcdlock.Election, value string) *qwaiter {
	return startQ(ctx, e, func(ctx context.Context) error { return e.Campaign(ctx, value) })
}

// observation is one item of an ObserveLeader sequence.
type observation struct {
	l   etcdlock.Leader
	err error
}

// observe runs seq in a goroutine and hands over what it yields one at a
// time: while the test does not read, the sequence waits in its yield, as
// a slow caller's loop would, and etcd's events queue up behind it. The
// loop breaks when the test ends.
func observe(t *testing.T, seq func(ctx context.Context) iter.Seq2[etcdlock.Leader, error]) <-chan observation {
	t.Helper()
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	ch := make(chan observation)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for l, err := range seq(ctx) {
			select {
			case ch <- observation{l, err}:
			case <-ctx.Done():
				return // break: the watch ends with the loop
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ch
}

// next returns the next Leader ch yields, failing on an error.
func next(t *testing.T, ch <-chan observation) etcdlock.Leader {
	t.Helper()
	select {
	case o := <-ch:
		require.NoError(t, o.err)
		return o.l
	case <-time.After(10 * time.Second):
		t.Fatal("no observation in 10s")
	}
	return etcdlock.Leader{}
}

// requireLeader asserts l is e's leadership with value.
func requireLeader(t *testing.T, l etcdlock.Leader, e *etcdlock.Election, value string) {
	t.Helper()
	require.Equal(t, e.Key(), l.Key, "leader key")
	require.Equal(t, value, string(l.Value))
	require.Equal(t, e.Token(), l.Token)
	require.GreaterOrEqual(t, l.Revision, l.Token)
}

// requireNoLeader asserts l says there is no leader.
func requireNoLeader(t *testing.T, l etcdlock.Leader) {
	t.Helper()
	require.Empty(t, l.Key, "a leader where there is none: %+v", l)
	require.Zero(t, l.Token)
	require.Positive(t, l.Revision)
}

func TestElectionCampaignResign(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s := newSession(t, cli)
	e := etcdlock.NewElection(s, name)
	ctx := t.Context()

	_, err := e.Leader(ctx)
	require.ErrorIs(t, err, etcdlock.ErrNoLeader)
	require.NoError(t, e.Resign(ctx), "Resign before Campaign is a no-op")
	require.Zero(t, e.Token())
	require.Nil(t, e.Header())

	require.NoError(t, e.Campaign(ctx, "alpha"))
	require.Positive(t, e.Token())
	require.NotNil(t, e.Header())
	require.NoError(t, e.Err())
	l, err := e.Leader(ctx)
	require.NoError(t, err)
	requireLeader(t, l, e, "alpha")
	require.Equal(t, s.Lease(), l.Lease)
	l2, err := etcdlock.CurrentLeader(ctx, cli, name)
	require.NoError(t, err)
	require.Equal(t, l.Key, l2.Key)

	// IsOwner guards a write while leader.
	resp, err := cli.Txn(ctx).If(e.IsOwner()).Then(clientv3.OpPut(name+"-data", "x")).Commit()
	require.NoError(t, err)
	require.True(t, resp.Succeeded)

	// Campaign while leader proclaims, as etcd's does.
	token := e.Token()
	require.NoError(t, e.Campaign(ctx, "beta"))
	require.Equal(t, token, e.Token())
	l, err = e.Leader(ctx)
	require.NoError(t, err)
	requireLeader(t, l, e, "beta")

	done := e.Done()
	require.NoError(t, e.Resign(ctx))
	select {
	case <-done:
	default:
		t.Fatal("Done open after Resign")
	}
	require.NoError(t, e.Err())
	require.Empty(t, keys(t, cli, name))
	require.Zero(t, e.Token())
	resp, err = cli.Txn(ctx).If(e.IsOwner()).Then(clientv3.OpPut(name+"-data", "y")).Commit()
	require.NoError(t, err)
	require.False(t, resp.Succeeded, "IsOwner holds after Resign")
	require.NoError(t, e.Resign(ctx), "Resign is idempotent")
	l, err = e.Leader(ctx)
	require.ErrorIs(t, err, etcdlock.ErrNoLeader)
	requireNoLeader(t, l)
}

func TestElectionInvalid(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	ctx := t.Context()
	require.ErrorIs(t, etcdlock.NewElection(s, "").Campaign(ctx, "v"), etcdlock.ErrInvalidName)
	_, err := etcdlock.CurrentLeader(ctx, cli, "")
	require.ErrorIs(t, err, etcdlock.ErrInvalidName)
	for _, err := range etcdlock.ObserveLeader(ctx, cli, "") {
		require.ErrorIs(t, err, etcdlock.ErrInvalidName)
	}
	// A value that could read as a lock's mode is refused: Proclaim
	// must never change a key's mode.
	e := etcdlock.NewElection(s, lockName(t))
	require.ErrorIs(t, e.Campaign(ctx, "etcdlock/1 shared"), etcdlock.ErrInvalidValue)
	require.Empty(t, keys(t, cli, lockName(t)))
	require.NoError(t, e.Campaign(ctx, "v"))
	require.ErrorIs(t, e.Proclaim(ctx, "etcdlock/1 permits 1 of 2"), etcdlock.ErrInvalidValue)
	require.NoError(t, e.Resign(ctx))
}

// TestElectionFIFO: candidates win in the order they campaigned; each
// waits until every earlier one resigned; observers see each in turn.
func TestElectionFIFO(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, name)
	})
	requireNoLeader(t, next(t, obs))

	es := make([]*etcdlock.Election, 4)
	for i := range es {
		es[i] = etcdlock.NewElection(newSession(t, cli), name)
	}
	require.NoError(t, es[0].Campaign(ctx, "c0"))
	requireLeader(t, next(t, obs), es[0], "c0")
	ws := make([]*qwaiter, len(es))
	for i := 1; i < len(es); i++ {
		ws[i] = campaign(ctx, es[i], "c"+string(rune('0'+i)))
		ws[i].waitIdle(t)
	}
	for i := 1; i < len(es); i++ {
		for j := i; j < len(es); j++ {
			ws[j].assertWaiting(t)
		}
		prev := es[i-1].Token()
		require.NoError(t, es[i-1].Resign(ctx))
		require.NoError(t, ws[i].result(t, 10*time.Second))
		requireLeader(t, next(t, obs), es[i], "c"+string(rune('0'+i)))
		require.Greater(t, es[i].Token(), prev)
	}
	require.NoError(t, es[len(es)-1].Resign(ctx))
	requireNoLeader(t, next(t, obs))
}

// TestElectionProclaim: only the leader proclaims; the value changes, the
// key's place, lease and token do not; a leader whose key went is told.
func TestElectionProclaim(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	s := newSession(t, cli)
	e := etcdlock.NewElection(s, name)
	require.ErrorIs(t, e.Proclaim(ctx, "x"), etcdlock.ErrNotLeader)
	require.Empty(t, keys(t, cli, name))

	obs := observe(t, e.Observe)
	requireNoLeader(t, next(t, obs))
	require.NoError(t, e.Campaign(ctx, "one"))
	requireLeader(t, next(t, obs), e, "one")

	other := etcdlock.NewElection(newSession(t, cli), name)
	w := campaign(ctx, other, "other")
	w.waitIdle(t)
	require.ErrorIs(t, other.Proclaim(ctx, "x"), etcdlock.ErrNotLeader, "a waiting candidate is not the leader")

	token := e.Token()
	require.NoError(t, e.Proclaim(ctx, "two"))
	require.Equal(t, token, e.Token())
	l := next(t, obs)
	requireLeader(t, l, e, "two")
	require.Equal(t, s.Lease(), l.Lease)
	w.assertWaiting(t)

	// The key is deleted behind the leader's back: Proclaim says so and
	// does not write, and the leadership ends.
	_, err := cli.Delete(ctx, e.Key())
	require.NoError(t, err)
	require.NoError(t, w.result(t, 10*time.Second))
	requireLeader(t, next(t, obs), other, "other")
	err = e.Proclaim(ctx, "three")
	require.ErrorIs(t, err, etcdlock.ErrNotLeader)
	require.ErrorIs(t, err, etcdlock.ErrLockLost)
	select {
	case <-e.Done():
	default:
		t.Fatal("Done open after Proclaim found the key gone")
	}
	require.ErrorIs(t, e.Err(), etcdlock.ErrLockLost)
	require.Equal(t, []string{other.Key()}, keys(t, cli, name), "Proclaim wrote a key it did not own")
	require.ErrorIs(t, e.Resign(ctx), etcdlock.ErrLockLost)
	require.NoError(t, e.Resign(ctx))
	require.NoError(t, other.Resign(ctx))
	requireNoLeader(t, next(t, obs))
}

// TestElectionCampaignLeaseGoes is the regression test of etcd issues
// 19597 and 11007: etcd's Campaign does not check its own key after
// waiting; when the candidate's lease goes while it waits, it blocks
// forever, or returns nil holding nothing once the keys ahead go too
// (11007: every candidate "won" after an etcd leader failover). Campaign
// must return ErrSessionExpired at once, and leave no key.
func TestElectionCampaignLeaseGoes(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	leaderS := newSession(t, cli)
	leader := etcdlock.NewElection(leaderS, name)
	require.NoError(t, leader.Campaign(ctx, "leader"))

	ws := newSession(t, cli)
	e := etcdlock.NewElection(ws, name)
	w := campaign(ctx, e, "waiter")
	w.waitIdle(t)
	// Both leases go, the waiter's first: the queue empties.
	_, err := cli.Revoke(ctx, ws.Lease())
	require.NoError(t, err)
	_, err = cli.Revoke(ctx, leaderS.Lease())
	require.NoError(t, err)
	err = w.result(t, 10*time.Second)
	require.ErrorIs(t, err, etcdlock.ErrSessionExpired)
	require.Zero(t, e.Token())
	require.Empty(t, keys(t, cli, name))
	_, err = etcdlock.CurrentLeader(ctx, cli, name)
	require.ErrorIs(t, err, etcdlock.ErrNoLeader)
}

// txnFailer fails, once armed, the next Txn that reads and writes
// nothing else (a waiter's check of its turn) with an error that does not
// pass, as a misbehaving member or a permission change would.
type txnFailer struct{ armed atomic.Bool }

func (f *txnFailer) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*pb.TxnRequest); ok && len(txn.Success) == 1 && txn.Success[0].GetRequestRange() != nil && f.armed.CompareAndSwap(true, false) {
			return status.Error(codes.Internal, "test: the check failed")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})}
}

// TestElectionFailedCampaignLeavesNoKey is the regression test of etcd
// issue 21128: etcd's Campaign, failing on an error that is not its ctx's,
// leaves its key, which later wins with nobody acting on it.
func TestElectionFailedCampaignLeavesNoKey(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	leader := etcdlock.NewElection(newSession(t, cli), name)
	require.NoError(t, leader.Campaign(ctx, "leader"))

	var f txnFailer
	wcli := cluster.Client(t, clientv3.Config{DialOptions: f.DialOptions()})
	e := etcdlock.NewElection(newSession(t, wcli), name)
	w := campaign(ctx, e, "waiter")
	w.waitIdle(t)
	f.armed.Store(true)
	require.NoError(t, leader.Resign(ctx)) // the waiter checks its turn, and fails
	err := w.result(t, 10*time.Second)
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	require.False(t, f.armed.Load())
	require.Empty(t, keys(t, cli, name), "the failed Campaign left its key")
	require.Zero(t, e.Token())
}

// TestElectionResignRetry is the regression test of etcd issue 22123:
// etcd's Resign forgets the leadership when its Txn fails, so a retry
// returns nil while the key may stay. Ours never leaves the key: a lost
// answer is sent again, and a Resign whose ctx ends first leaves the
// release to the background, which a retried Resign waits for.
func TestElectionResignRetry(t *testing.T) {
	ctx := t.Context()
	t.Run("AnswerLost", func(t *testing.T) {
		loser := &replyLoser{}
		cli := cluster.Client(t, clientv3.Config{DialOptions: loser.DialOptions()})
		e := etcdlock.NewElection(newSession(t, cli), lockName(t))
		require.NoError(t, e.Campaign(ctx, "v"))
		loser.arm(e.Key())
		require.NoError(t, e.Resign(ctx))
		require.EqualValues(t, 1, loser.lost.Load())
		require.Empty(t, keys(t, cli, lockName(t)))
		require.Zero(t, e.Token())
		require.NoError(t, e.Resign(ctx))
	})
	t.Run("CtxEnded", func(t *testing.T) {
		cli := newClient(t)
		e := etcdlock.NewElection(newSession(t, cli), lockName(t))
		require.NoError(t, e.Campaign(ctx, "v"))
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, e.Resign(cctx), context.Canceled)
		require.Zero(t, e.Token(), "not the leader once Resign returned")
		require.NoError(t, e.Resign(ctx), "the retry waits for the release")
		require.Empty(t, keys(t, cli, lockName(t)))
		require.NoError(t, e.Resign(ctx))
	})
}

// TestElectionObserveNoLeader is the regression test of trillian issue
// 1387: etcd's Observe never reports that there is no leader, so callers
// cache a dead one. Ours yields "no leader" first when there is none, and
// whenever the last candidate goes: resigned, or its lease expired.
func TestElectionObserveNoLeader(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, name)
	})
	requireNoLeader(t, next(t, obs))

	s := newSession(t, cli, etcdlock.WithTTL(2*time.Second))
	e := etcdlock.NewElection(s, name)
	require.NoError(t, e.Campaign(ctx, "v"))
	requireLeader(t, next(t, obs), e, "v")
	// The leader's process stops: its lease is revoked here, as it would
	// expire.
	_, err := cli.Revoke(ctx, s.Lease())
	require.NoError(t, err)
	requireNoLeader(t, next(t, obs))
	_, err = etcdlock.CurrentLeader(ctx, cli, name)
	require.ErrorIs(t, err, etcdlock.ErrNoLeader)
}

// TestElectionObserveWrongLeader is the regression test of etcd issue
// 18163: an observer that saw no leader falls behind while candidate 1
// and then candidate 2 campaign (etcd's Observe could report candidate 2).
// Ours reports candidate 1, then candidate 2 only when 1 resigns. A key
// of a nested election, older than both, is never reported (etcd PR
// 10297).
func TestElectionObserveWrongLeader(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, name)
	})
	requireNoLeader(t, next(t, obs))
	// The observer does not read on while all this happens.
	nested := etcdlock.NewElection(newSession(t, cli), name+"/nested")
	require.NoError(t, nested.Campaign(ctx, "nested"))
	c1 := etcdlock.NewElection(newSession(t, cli), name)
	require.NoError(t, c1.Campaign(ctx, "c1"))
	c2 := etcdlock.NewElection(newSession(t, cli), name)
	w := campaign(ctx, c2, "c2")
	w.waitIdle(t)
	c1Key, c1Token := c1.Key(), c1.Token()
	require.NoError(t, c1.Proclaim(ctx, "c1 again"))
	require.NoError(t, c1.Resign(ctx))
	require.NoError(t, w.result(t, 10*time.Second))

	// Now the observer reads on: it reports each state in turn.
	l := next(t, obs)
	require.Equal(t, c1Key, l.Key)
	require.Equal(t, c1Token, l.Token)
	require.Equal(t, "c1", string(l.Value))
	l = next(t, obs)
	require.Equal(t, c1Key, l.Key)
	require.Equal(t, "c1 again", string(l.Value))
	requireLeader(t, next(t, obs), c2, "c2")
	require.NoError(t, c2.Resign(ctx))
	requireNoLeader(t, next(t, obs)) // the nested election's leader is not ours
	require.NoError(t, nested.Resign(ctx))
}

// TestElectionInteropEtcd: this package's Election and etcd's
// concurrency.Election (what `etcdctl elect` uses) on one name queue
// behind each other, first come first served, both ways, and observe each
// other.
func TestElectionInteropEtcd(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, name)
	})
	requireNoLeader(t, next(t, obs))

	ours := etcdlock.NewElection(newSession(t, cli), name)
	require.NoError(t, ours.Campaign(ctx, "ours"))
	requireLeader(t, next(t, obs), ours, "ours")

	es, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer es.Close()
	theirs := concurrency.NewElection(es, name)
	// etcd's Observe sees our leader.
	octx, ocancel := context.WithCancel(ctx)
	defer ocancel()
	etcdObs := theirs.Observe(octx)
	r := <-etcdObs
	require.Equal(t, ours.Key(), string(r.Kvs[0].Key))
	require.Equal(t, "ours", string(r.Kvs[0].Value))

	// etcd's candidate queues behind ours ...
	theirsWon := make(chan error, 1)
	go func() { theirsWon <- theirs.Campaign(ctx, "theirs") }()
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	// ... and ours behind etcd's.
	ours2 := etcdlock.NewElection(newSession(t, cli), name)
	w := campaign(ctx, ours2, "ours2")
	theirsKey := keys(t, cli, name)[1]
	require.Equal(t, []string{theirsKey}, w.waitIdle(t), "ours2 does not wait for etcd's candidate")
	select {
	case err := <-theirsWon:
		t.Fatalf("etcd's Campaign returned %v while ours leads", err)
	default:
	}

	require.NoError(t, ours.Resign(ctx))
	select {
	case err := <-theirsWon:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("etcd's candidate did not win after ours resigned")
	}
	l := next(t, obs)
	require.Equal(t, theirsKey, l.Key)
	require.Equal(t, "theirs", string(l.Value))
	require.Equal(t, es.Lease(), l.Lease)
	require.Equal(t, theirs.Rev(), l.Token)
	w.assertWaiting(t)

	require.NoError(t, theirs.Proclaim(ctx, "theirs again"))
	l = next(t, obs)
	require.Equal(t, theirsKey, l.Key)
	require.Equal(t, "theirs again", string(l.Value))

	require.NoError(t, theirs.Resign(ctx))
	require.NoError(t, w.result(t, 10*time.Second))
	requireLeader(t, next(t, obs), ours2, "ours2")
	lr, err := theirs.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, ours2.Key(), string(lr.Kvs[0].Key))
	require.NoError(t, ours2.Resign(ctx))
	requireNoLeader(t, next(t, obs))
}

// TestElectionNestedNames is the regression test of etcd PR 10297: a
// name's prefix is name + "/", and only its direct children count, so
// elections named "a", "a/b" and "ab" each have their own leader, and
// observing one never reports another's.
func TestElectionNestedNames(t *testing.T) {
	cli := newClient(t)
	base := lockName(t)
	ctx := t.Context()
	names := []string{base + "/b", base + "b", base, base + "/b/c"}
	es := make([]*etcdlock.Election, len(names))
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, base)
	})
	requireNoLeader(t, next(t, obs))
	for i, name := range names {
		es[i] = etcdlock.NewElection(newSession(t, cli), name)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, es[i].Campaign(cctx, name), "%s waits for another name's leader", name)
		cancel()
	}
	for i, name := range names {
		l, err := etcdlock.CurrentLeader(ctx, cli, name)
		require.NoError(t, err)
		requireLeader(t, l, es[i], name)
	}
	requireLeader(t, next(t, obs), es[2], base)
	require.NoError(t, es[2].Resign(ctx))
	requireNoLeader(t, next(t, obs))
	for _, e := range es {
		require.NoError(t, e.Resign(ctx))
	}
}

// TestObserveEnds: the sequence never ends silently. Ending ctx yields
// ctx's error; closing the client yields an error; a break in the loop
// ends the watch, leaving no goroutine behind.
func TestObserveEnds(t *testing.T) {
	name := lockName(t)
	t.Run("Break", func(t *testing.T) {
		cli := newClient(t)
		_, err := cli.Get(t.Context(), name) // the client's own goroutines are up
		require.NoError(t, err)
		before := goleak.IgnoreCurrent()
		for l, err := range etcdlock.ObserveLeader(t.Context(), cli, name) {
			require.NoError(t, err)
			requireNoLeader(t, l)
			break
		}
		require.NoError(t, leakcheck.Find(before))
	})
	t.Run("CtxEnds", func(t *testing.T) {
		cli := newClient(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var got []error
		for _, err := range etcdlock.ObserveLeader(ctx, cli, name) {
			got = append(got, err)
			cancel()
		}
		// A cancel the caller asked for ends the sequence quietly: no
		// "context canceled" for every service to log at shutdown.
		require.Equal(t, []error{nil}, got)
		require.ErrorIs(t, ctx.Err(), context.Canceled)
	})
	t.Run("CtxEndedBefore", func(t *testing.T) {
		cli := newClient(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		for l, err := range etcdlock.ObserveLeader(ctx, cli, name) {
			t.Fatalf("an ended ctx yielded %+v, %v", l, err)
		}
	})
	t.Run("ClientClosed", func(t *testing.T) {
		cli, err := cluster.NewClient(clientv3.Config{})
		require.NoError(t, err)
		var got []error
		for _, err := range etcdlock.ObserveLeader(t.Context(), cli, name) {
			got = append(got, err)
			cli.Close() // etcd's Close may return context.Canceled
		}
		require.Len(t, got, 2)
		require.NoError(t, got[0])
		require.Error(t, got[1])
		t.Logf("after Close: %v", got[1])
	})
}

// TestObserveHistory checks an observer against etcd's history while
// candidates campaign, proclaim and resign concurrently: each state it
// yields is the oldest key (and its value) at the yielded revision,
// revisions increase, no state is yielded twice in a row, and no term or
// proclaimed value is missed.
func TestObserveHistory(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	ctx := t.Context()
	obs := observe(t, func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return etcdlock.ObserveLeader(ctx, cli, name)
	})
	var got []etcdlock.Leader
	got = append(got, next(t, obs))

	const candidates, rounds = 5, 8
	type term struct {
		token  int64
		values []string
	}
	terms := make(chan term, candidates*rounds)
	errs := make(chan error, candidates)
	for c := range candidates {
		s := newSession(t, cli)
		go func() {
			e := etcdlock.NewElection(s, name)
			for r := range rounds {
				v := fmt.Sprintf("c%d-r%d", c, r)
				if err := e.Campaign(ctx, v); err != nil {
					errs <- err
					return
				}
				tm := term{token: e.Token(), values: []string{v}}
				if r%2 == 0 {
					if err := e.Proclaim(ctx, v+"-again"); err != nil {
						errs <- err
						return
					}
					tm.values = append(tm.values, v+"-again")
				}
				terms <- tm
				if err := e.Resign(ctx); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	// Read on while they run: the observer must keep up or catch up.
	running := candidates
	for running > 0 {
		select {
		case err := <-errs:
			require.NoError(t, err)
			running--
		case o := <-obs:
			require.NoError(t, o.err)
			got = append(got, o.l)
		case <-time.After(20 * time.Second):
			t.Fatal("candidates did not finish in 20s")
		}
	}
	// The last state is "no leader".
	for got[len(got)-1].Key != "" || len(got) < 2 {
		got = append(got, next(t, obs))
	}

	seen := map[int64][]string{}
	for i, l := range got {
		if i > 0 {
			require.Greater(t, l.Revision, got[i-1].Revision)
			require.False(t, l.Key == got[i-1].Key && l.Token == got[i-1].Token && string(l.Value) == string(got[i-1].Value),
				"state yielded twice: %+v", l)
		}
		resp, err := cli.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(l.Revision),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			requireNoLeader(t, l)
			continue
		}
		kv := resp.Kvs[0]
		require.Equal(t, string(kv.Key), l.Key, "at revision %d", l.Revision)
		require.Equal(t, kv.CreateRevision, l.Token)
		require.Equal(t, string(kv.Value), string(l.Value))
		seen[l.Token] = append(seen[l.Token], string(l.Value))
	}
	close(terms)
	n := 0
	for tm := range terms {
		require.Equal(t, tm.values, seen[tm.token], "term %d", tm.token)
		n++
	}
	require.Equal(t, candidates*rounds, n)
	require.Len(t, seen, n)
}
