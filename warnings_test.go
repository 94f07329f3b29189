package etcdlock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestNoWarningsThreeMembers is TestNoWarnings for every primitive, on
// three members, with clients that spread their calls over all of them:
// etcd's client logs every unary call that fails, so a read that one
// member refuses (a read at a revision it has not applied yet: "required
// revision is a future revision") is a warning in the user's log, though
// the library then reads again. Observe did that when it read the new
// leader at the revision of the old one's deletion: its watch runs on one
// member, and its serializable read went to another that could lag.
func TestNoWarningsThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member cluster")
	}
	c := etcdtest.Start(t, 3)
	core, logs := observer.New(zapcore.InfoLevel)
	cfg := clientv3.Config{Logger: zap.New(core)}
	cli, wcli, ocli := c.Client(t, cfg), c.Client(t, cfg), c.Client(t, cfg)
	ctx := t.Context()
	// A loaded machine can make the members elect a leader again (their
	// election timeout is short): etcd's client then logs the calls that
	// failed with the leader's loss, which the library retries. Those are
	// forgiven when the raft term moved.
	term := raftTerm(t, c)
	s, err := etcdlock.NewSession(ctx, cli)
	require.NoError(t, err)
	ws, err := etcdlock.NewSession(ctx, wcli)
	require.NoError(t, err)
	name := lockName(t)

	t.Run("RWMutex", func(t *testing.T) {
		rw, other := etcdlock.NewRWMutex(s, name+"/rw"), etcdlock.NewRWMutex(ws, name+"/rw")
		for range 10 {
			require.NoError(t, rw.Lock(ctx))
			require.ErrorIs(t, other.TryRLock(ctx), etcdlock.ErrLocked)
			w := startRWaiter(ctx, other)
			require.NoError(t, rw.Unlock(ctx))
			require.NoError(t, <-w)
			require.NoError(t, rw.RLock(ctx)) // a second reader
			require.NoError(t, rw.RUnlock(ctx))
			require.NoError(t, other.RUnlock(ctx))
		}
	})
	t.Run("Semaphore", func(t *testing.T) {
		a, b := etcdlock.NewSemaphore(s, name+"/sem", 3), etcdlock.NewSemaphore(ws, name+"/sem", 3)
		for range 10 {
			require.NoError(t, a.Acquire(ctx, 2))
			require.ErrorIs(t, b.TryAcquire(ctx, 2), etcdlock.ErrLocked)
			done := make(chan error, 1)
			go func() { done <- b.Acquire(ctx, 2) }()
			require.NoError(t, a.Release(ctx))
			require.NoError(t, <-done)
			require.NoError(t, b.Release(ctx))
		}
	})
	t.Run("Election", func(t *testing.T) {
		en := name + "/election"
		// An observer on a client of its own, which follows every
		// change of leader: each one is a deletion of the leader's key,
		// after which the new leader is read at that revision.
		octx, stop := context.WithCancel(ctx)
		seen := make(chan etcdlock.Leader, 100)
		obsDone := make(chan error, 1)
		go func() {
			defer close(obsDone)
			for l, err := range etcdlock.ObserveLeader(octx, ocli, en) {
				if err != nil {
					obsDone <- err
					return
				}
				seen <- l
			}
		}()
		e1, e2 := etcdlock.NewElection(s, en), etcdlock.NewElection(ws, en)
		waitLeader := func(want string) {
			t.Helper()
			for {
				select {
				case l := <-seen:
					if string(l.Value) == want {
						return
					}
				case err := <-obsDone:
					t.Fatalf("Observe ended: %v", err)
				case <-time.After(10 * time.Second):
					t.Fatalf("Observe did not yield %q in 10s", want)
				}
			}
		}
		require.NoError(t, e1.Campaign(ctx, "e1"))
		waitLeader("e1")
		for range 15 {
			// e2 waits behind e1; e1 resigns: e2 leads, read at the
			// revision of e1's deletion. And back.
			w := make(chan error, 1)
			go func() { w <- e2.Campaign(ctx, "e2") }()
			require.NoError(t, e1.Resign(ctx))
			require.NoError(t, <-w)
			waitLeader("e2")
			go func() { w <- e1.Campaign(ctx, "e1") }()
			require.NoError(t, e2.Resign(ctx))
			require.NoError(t, <-w)
			waitLeader("e1")
		}
		require.NoError(t, e1.Proclaim(ctx, "e1 again"))
		waitLeader("e1 again")
		_, err := etcdlock.CurrentLeader(ctx, cli, en)
		require.NoError(t, err)
		require.NoError(t, e1.Resign(ctx))
		waitLeader("")
		// The end of its ctx ends the sequence quietly. (Not while it
		// reads: etcd's client logs a call whose ctx ends in flight.)
		stop()
		require.NoError(t, <-obsDone)
	})
	t.Run("Lead", func(t *testing.T) {
		for range 3 {
			require.NoError(t, etcdlock.Lead(ctx, cli, name+"/lead", "v", func(context.Context) error { return nil }))
		}
	})
	t.Run("InspectLock", func(t *testing.T) {
		// Pages of 2 keys: a queue of 5 is read in 3, every one at the
		// first page's revision, each call on the next member. A
		// serializable later page could reach a member that has not
		// applied that revision yet.
		defer etcdlock.SetInspectPage(2)()
		in := name + "/inspect"
		m := etcdlock.NewMutex(s, in)
		require.NoError(t, m.Lock(ctx))
		for i := range 20 {
			_, err := cli.Put(ctx, fmt.Sprintf("%s/w%02d", in, i), "")
			require.NoError(t, err)
			if i < 3 {
				continue
			}
			for _, opts := range [][]etcdlock.InspectOption{nil, {etcdlock.Serializable()}} {
				q, err := etcdlock.InspectLock(ctx, wcli, in, append(opts, etcdlock.WithoutLeases())...)
				require.NoError(t, err)
				require.GreaterOrEqual(t, len(q.Keys), 4)
			}
		}
		require.NoError(t, m.Unlock(ctx))
		_, err := cli.Delete(ctx, in+"/", clientv3.WithPrefix())
		require.NoError(t, err)
	})
	require.NoError(t, s.Close())
	require.NoError(t, ws.Close())

	elected := raftTerm(t, c) != term
	var warned int
	for _, e := range logs.All() {
		if e.Level >= zapcore.WarnLevel {
			warned++
			if elected && leaderLossWarning(e) {
				t.Logf("etcd elected a leader during the test; forgiven: %s %q %v", e.Level, e.Message, e.ContextMap())
				continue
			}
			t.Errorf("etcd's client logged %s %q %v", e.Level, e.Message, e.ContextMap())
		}
	}
	// The capture works: a call the program cancels itself is logged.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = cli.Get(cctx, name)
	require.ErrorIs(t, err, context.Canceled)
	n := 0
	for _, e := range logs.All() {
		if e.Level >= zapcore.WarnLevel {
			n++
		}
	}
	require.Equal(t, warned+1, n, "etcd's client logs no longer reach the test")
}

// startRWaiter starts rw.RLock in a goroutine and returns its result.
func startRWaiter(ctx context.Context, rw *etcdlock.RWMutex) <-chan error {
	done := make(chan error, 1)
	go func() { done <- rw.RLock(ctx) }()
	return done
}

// raftTerm returns the highest raft term c's members report.
func raftTerm(t *testing.T, c *etcdtest.Cluster) uint64 {
	t.Helper()
	cli := c.Client(t)
	var term uint64
	for _, ep := range c.Endpoints() {
		st, err := cli.Status(t.Context(), ep)
		require.NoError(t, err)
		term = max(term, st.RaftTerm)
	}
	return term
}

// leaderLossWarning reports whether e is etcd's client logging a call
// that failed because the members were electing a leader.
func leaderLossWarning(e observer.LoggedEntry) bool {
	msg := fmt.Sprint(e.ContextMap()["error"])
	for _, s := range []string{"leader changed", "no leader", "request timed out", "timed out waiting for read index", "raft proposal dropped"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
