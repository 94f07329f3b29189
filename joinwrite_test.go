package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Tests of the write that joins the queue on a slow etcd: Lock sets no
// deadline of its own, and never gives up on a write whose fate is
// unknown while the session lives.

// slowSession returns a session whose client reaches etcd through a proxy
// that the test can make answer late, and a client that reaches etcd
// directly.
func slowSession(t *testing.T, opts ...etcdlock.SessionOption) (*etcdtest.Proxy, *etcdlock.Session, *clientv3.Client) {
	t.Helper()
	px := etcdtest.NewProxy(t, endpoints[0])
	cli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
	return px, newSession(t, cli, opts...), newClient(t)
}

// history returns the events under name + "/" after revision from, up to
// the first that satisfies last; it fails if none does within 20s.
func history(t *testing.T, cli *clientv3.Client, name string, from int64, last func(*clientv3.Event) bool) []*clientv3.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var evs []*clientv3.Event
	for wr := range cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			evs = append(evs, ev)
			if last(ev) {
				return evs
			}
		}
	}
	t.Fatalf("no such event under %s/ in 20s; saw %v", name, evs)
	return nil
}

// revision returns etcd's current revision.
func revision(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(t.Context(), "revision-probe")
	require.NoError(t, err)
	return resp.Header.Revision
}

// TestLockWaitsForSlowJoinWrite: with every answer of etcd later than 5s
// (the cap the write that joins the queue once had, which failed Locks of
// a burst with a context.DeadlineExceeded nobody asked for), a Lock
// without a deadline waits for the answer and holds.
func TestLockWaitsForSlowJoinWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd answers 6s late")
	}
	t.Parallel()
	const late = 6 * time.Second
	name := lockName(t)
	// Renewals answered 6s late keep a 30s lease alive.
	px, s, cli := slowSession(t, etcdlock.WithTTL(30*time.Second))
	m := etcdlock.NewMutex(s, name)

	px.DelayAnswers(late)
	start := time.Now()
	require.NoError(t, m.Lock(context.Background()))
	// Uncontended, Lock is one round trip: its answer was late.
	require.GreaterOrEqual(t, time.Since(start), late)
	require.Equal(t, []string{m.Key()}, keys(t, cli, name))
	px.DelayAnswers(0)
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name))
}

// TestLockCancelledMidJoinWrite: a Lock whose ctx ends while the answer
// to its join write is late waits for that answer, removes the key the
// write put, and returns ctx's error: no key is left behind.
func TestLockCancelledMidJoinWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd answers 3s late")
	}
	t.Parallel()
	const late = 3 * time.Second
	name := lockName(t)
	px, s, cli := slowSession(t, etcdlock.WithTTL(30*time.Second))
	m := etcdlock.NewMutex(s, name)
	from := revision(t, cli)

	px.DelayAnswers(late)
	ctx, cancel := context.WithTimeout(t.Context(), late/6)
	defer cancel()
	start := time.Now()
	err := m.Lock(ctx)
	took := time.Since(start)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotErrorIs(t, err, etcdlock.ErrSessionExpired)
	// It waited for the late answer, past ctx's end, before it returned.
	require.GreaterOrEqual(t, took, late)
	require.Empty(t, keys(t, cli, name))
	// The write landed, and Lock removed its key.
	evs := history(t, cli, name, from, func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE })
	require.Len(t, evs, 2)
	require.Equal(t, mvccpb.PUT, evs[0].Type)
	require.Equal(t, m.Key(), string(evs[0].Kv.Key))
	require.Equal(t, m.Key(), string(evs[1].Kv.Key))
	require.NoError(t, s.Err())
}

// TestLockSessionEndsMidJoinWrite: when the answer to the join write does
// not come before the session ends, Lock returns an error that matches
// both ctx's error and ErrSessionExpired and says the key goes with the
// lease; and it does.
func TestLockSessionEndsMidJoinWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease TTL")
	}
	t.Parallel()
	name := lockName(t)
	px, s, cli := slowSession(t, etcdlock.WithTTL(3*time.Second))
	// Its answers held back, the session cannot revoke its lease: do not
	// wait for it.
	defer s.Orphan()
	m := etcdlock.NewMutex(s, name)
	from := revision(t, cli)

	// Requests still reach etcd, so the lease is renewed there, but the
	// session sees no answer and ends within its TTL.
	px.DelayAnswers(time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	err := m.Lock(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, etcdlock.ErrSessionExpired)
	require.ErrorContains(t, err, "goes with the lease")
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionExpired)
	// The write put the key; the lease, no longer renewed, takes it.
	evs := history(t, cli, name, from, func(ev *clientv3.Event) bool { return ev.Type == mvccpb.DELETE })
	require.Len(t, evs, 2)
	require.Equal(t, mvccpb.PUT, evs[0].Type)
	require.Equal(t, m.Key(), string(evs[0].Kv.Key))
	require.Empty(t, keys(t, cli, name))
}

// TestDoUnlockWaitsForSlowAnswer: Do's release, which retries until etcd
// answers, waits for a late answer instead of giving up on each attempt
// after a fixed 5s. With every answer 6s late, such attempts all timed out,
// and the lock stayed held until the session ended.
func TestDoUnlockWaitsForSlowAnswer(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd answers 6s late")
	}
	t.Parallel()
	const late = 6 * time.Second
	name := lockName(t)
	// Renewals answered 6s late keep a 30s lease alive.
	px, s, cli := slowSession(t, etcdlock.WithTTL(30*time.Second))
	m := etcdlock.NewMutex(s, name)

	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- m.Do(context.Background(), func(context.Context) error {
			px.DelayAnswers(late) // the release's answer comes late
			return nil
		})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(4 * late):
		// Every attempt gave up before its answer came: Do cannot end
		// while the session lives (its renewals, late too, keep it).
		px.DelayAnswers(0)
		require.NoError(t, s.Close())
		<-done
		t.Fatalf("Do had not released the lock after %v", 4*late)
	}
	require.GreaterOrEqual(t, time.Since(start), late)
	px.DelayAnswers(0)
	require.Empty(t, keys(t, cli, name))
	require.NoError(t, s.Err(), "the session must have lived through it")
}

// TestJoinWriteSessionEndsMidWrite (issue 17, item 10): the session ends
// while the write that joins the queue is in flight (its answer lost, or
// never sent). Lock's error must match ErrSessionExpired and not
// context.Canceled, whose Lock's own ctx is alive: before, the write's
// context, bound to the session, ended with it, and Lock reported that as
// its caller's ctx's end.
func TestJoinWriteSessionEndsMidWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		try  bool
		act  func(s *etcdlock.Session) etcdtest.Action
	}{
		{"AnswerLost", false, func(s *etcdlock.Session) etcdtest.Action {
			return etcdtest.Action{After: func(etcdtest.RPC, error) error {
				s.Orphan()
				return status.Error(codes.Unavailable, "test: the answer was lost")
			}}
		}},
		{"NotSent", false, func(s *etcdlock.Session) etcdtest.Action {
			return etcdtest.Action{Before: func(etcdtest.RPC) { s.Orphan() }}
		}},
		{"TryAnswerLost", true, func(s *etcdlock.Session) etcdtest.Action {
			return etcdtest.Action{After: func(etcdtest.RPC, error) error {
				// Try's write runs on a goroutine of the session (it
				// returns if its ctx ends first), which Orphan waits
				// for: end the session beside it, then lose the answer.
				go s.Orphan()
				<-s.Done()
				return status.Error(codes.Unavailable, "test: the answer was lost")
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var in etcdtest.Injector
			cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			s, err := etcdlock.NewSession(t.Context(), cli)
			require.NoError(t, err)
			defer s.Close()
			m := etcdlock.NewMutex(s, lockName(t))
			// The joining write: the Txn that puts the key.
			fired := in.At(func(r etcdtest.RPC) bool { return puts(r.Req, m.Key()) }, tc.act(s))
			if tc.try {
				err = m.TryLock(t.Context())
			} else {
				err = m.Lock(t.Context())
			}
			<-fired
			require.ErrorIs(t, err, etcdlock.ErrSessionExpired)
			require.NotErrorIs(t, err, context.Canceled, "Lock's ctx is alive: %v", err)
			require.NoError(t, t.Context().Err())
		})
	}
}

// puts reports whether req is a Txn that puts key (in any branch, nested
// or not).
func puts(req any, key string) bool {
	txn, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	var in func(ops []*pb.RequestOp) bool
	in = func(ops []*pb.RequestOp) bool {
		for _, op := range ops {
			if p := op.GetRequestPut(); p != nil && string(p.Key) == key {
				return true
			}
			if t := op.GetRequestTxn(); t != nil && (in(t.Success) || in(t.Failure)) {
				return true
			}
		}
		return false
	}
	return in(txn.Success) || in(txn.Failure)
}
