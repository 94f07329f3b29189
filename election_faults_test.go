package etcdlock_test

import (
	"context"
	"errors"
	"iter"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// electionLocker is an Election seen as a locker: Campaign and Resign.
type electionLocker struct{ *etcdlock.Election }

func (e electionLocker) Lock(ctx context.Context) error { return e.Campaign(ctx, "candidate") }
func (e electionLocker) TryLock(context.Context) error {
	return errors.New("an Election has no TryLock")
}
func (e electionLocker) Unlock(ctx context.Context) error { return e.Resign(ctx) }

// electionL makes Elections; it takes no MutexOption.
var electionL newLocker = func(s *etcdlock.Session, name string, _ ...etcdlock.MutexOption) locker {
	return electionLocker{etcdlock.NewElection(s, name)}
}

// TestLeaderLearnsFirst runs TestHolderLearnsFirst's cases on an
// election: a leader cut off from etcd (after answers came 1s late, in one
// case) is told, by Done and Err, before the next candidate can win.
func TestLeaderLearnsFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a client off for a lease TTL")
	}
	t.Parallel()
	for _, c := range []cutOff{
		{name: "Cut"},
		{name: "CutAfterLateAnswers", late: time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testHolderLearnsFirst(t, c, flavor{"Election", electionL, electionL})
		})
	}
}

// resign resigns e with a ctx of 2s and does not retry, as a caller that
// ignores Resign's error would: across a crash of etcd's leader the RPC
// may fail or outlast the ctx, and the release then goes on in the
// background. Either way e no longer leads, and the next candidate wins
// once etcd has a leader again.
func resign(t *testing.T, e *etcdlock.Election) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := e.Resign(ctx); err != nil {
		require.ErrorIs(t, err, context.DeadlineExceeded)
		t.Logf("Resign: %v", err)
	}
	require.Zero(t, e.Token())
}

// TestElectionThreeMembers: on three members, candidates win in the
// order they campaigned across a crash of etcd's leader; an observer whose
// only member crashes and restarts resumes where it stopped (it reports the
// leader it missed), or, if etcd compacted that history meanwhile, reports
// the state it finds.
func TestElectionThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member cluster and stops members")
	}
	t.Parallel()
	c := etcdtest.Start(t, 3)
	name := lockName(t)
	ctx := t.Context()
	cli := c.Client(t)
	lead := c.Leader()
	require.GreaterOrEqual(t, lead, 0)
	pinned := c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(lead)}})
	seq := func(cli *clientv3.Client) func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
		return func(ctx context.Context) iter.Seq2[etcdlock.Leader, error] {
			return etcdlock.ObserveLeader(ctx, cli, name)
		}
	}
	obsAll, obsPinned := observe(t, seq(cli)), observe(t, seq(pinned))
	requireNoLeader(t, next(t, obsAll))
	requireNoLeader(t, next(t, obsPinned))

	es := make([]*etcdlock.Election, 4)
	ws := make([]*qwaiter, len(es))
	for i := range es {
		es[i] = etcdlock.NewElection(newSession(t, c.Client(t)), name)
		ws[i] = campaign(ctx, es[i], "c"+string(rune('0'+i)))
		if i == 0 {
			require.NoError(t, ws[0].result(t, 10*time.Second))
		} else {
			ws[i].waitIdle(t)
		}
	}
	requireLeader(t, next(t, obsAll), es[0], "c0")
	requireLeader(t, next(t, obsPinned), es[0], "c0")

	// etcd's leader crashes: the waiters keep their places.
	c.KillMember(lead)
	resign(t, es[0])
	require.NoError(t, ws[1].result(t, 15*time.Second))
	requireLeader(t, next(t, obsAll), es[1], "c1")
	ws[2].assertWaiting(t)
	ws[3].assertWaiting(t)
	// The pinned observer's member comes back: it reports what it missed.
	require.NoError(t, c.RestartMember(lead))
	requireLeader(t, next(t, obsPinned), es[1], "c1")

	// Its member crashes again; two leaders come and go, and etcd compacts
	// their history before it comes back.
	c.KillMember(lead)
	resign(t, es[1])
	require.NoError(t, ws[2].result(t, 15*time.Second))
	requireLeader(t, next(t, obsAll), es[2], "c2")
	ws[3].assertWaiting(t)
	resign(t, es[2])
	require.NoError(t, ws[3].result(t, 15*time.Second))
	requireLeader(t, next(t, obsAll), es[3], "c3")
	resp, err := cli.Get(ctx, "compact-probe")
	require.NoError(t, err)
	_, err = cli.Compact(ctx, resp.Header.Revision)
	require.NoError(t, err)
	require.NoError(t, c.RestartMember(lead))
	requireLeader(t, next(t, obsPinned), es[3], "c3")

	resign(t, es[3])
	requireNoLeader(t, next(t, obsAll))
	requireNoLeader(t, next(t, obsPinned))
}
