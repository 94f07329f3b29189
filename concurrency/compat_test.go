package concurrency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcd "go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/concurrency"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

// session returns a Session of this package on cli, closed when t ends.
func session(t *testing.T, cli *clientv3.Client, opts ...concurrency.SessionOption) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// Two Mutexes of one Session on one name share the hold, as etcd's share
// the key: the second Lock returns at once, either Unlock releases it for
// both, and the other's Unlock then deletes nothing.
func TestSameSessionSharesHold(t *testing.T) {
	ctx := t.Context()
	cli := client(t)
	s := session(t, cli)
	m1 := concurrency.NewMutex(s, "shared")
	m2 := concurrency.NewMutex(s, "shared")
	require.NoError(t, m1.Lock(ctx))
	require.NoError(t, m2.Lock(ctx))
	require.Equal(t, m1.Key(), m2.Key())
	require.Same(t, m1.Etcdlock(), m2.Etcdlock())

	other := concurrency.NewMutex(session(t, cli), "shared")
	require.ErrorIs(t, other.TryLock(ctx), concurrency.ErrLocked)
	require.NoError(t, m2.Unlock(ctx))
	require.NoError(t, other.TryLock(ctx))
	require.NoError(t, m1.Unlock(ctx)) // as etcd's: the key is gone already
	resp, err := cli.Get(ctx, other.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "m1's late Unlock deleted the next holder's key")
	require.ErrorIs(t, m1.Unlock(ctx), concurrency.ErrLockReleased)
}

// An orphaned Session takes no new lock: its lease is renewed by no one,
// and no one would be told of its end.
func TestOrphanedSessionTakesNoLock(t *testing.T) {
	s := session(t, client(t))
	s.Orphan()
	select {
	case <-s.Ctx().Done():
	default:
		t.Fatal("Ctx not cancelled by Orphan")
	}
	m := concurrency.NewMutex(s, "orphaned")
	require.ErrorIs(t, m.Lock(t.Context()), concurrency.ErrSessionExpired)
	require.ErrorIs(t, concurrency.NewElection(s, "orphaned-e").Campaign(t.Context(), "v"), concurrency.ErrSessionExpired)
}

// Observe is a channel of the leader's GetResponse: its value, version and
// revision change with each Proclaim, and "no leader" is not sent.
func TestObserveChannel(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cli := client(t)
	e := concurrency.NewElection(session(t, cli), "observed")
	obs := e.Observe(ctx)
	require.NoError(t, e.Campaign(ctx, "a"))
	first := <-obs
	require.Equal(t, "a", string(first.Kvs[0].Value))
	require.Equal(t, e.Key(), string(first.Kvs[0].Key))
	require.Equal(t, e.Rev(), first.Kvs[0].CreateRevision)
	require.NoError(t, e.Proclaim(ctx, "b"))
	second := <-obs
	require.Equal(t, "b", string(second.Kvs[0].Value))
	require.Equal(t, int64(2), second.Kvs[0].Version)
	require.Less(t, first.Header.Revision, second.Header.Revision)
	lr, err := e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, second.Kvs[0].ModRevision, lr.Kvs[0].ModRevision)
	require.NoError(t, e.Resign(ctx))
	_, err = e.Leader(ctx)
	require.ErrorIs(t, err, concurrency.ErrElectionNoLeader)
	require.ErrorIs(t, e.Proclaim(ctx, "c"), concurrency.ErrElectionNotLeader)
	cancel()
	for range obs { // closes once ctx has ended
	}
}

// ResumeElection of a leadership the session holds shares it; of one
// this process did not win (a restart with the lease), it acts on the key
// as etcd's does, and hands out no fencing token of the old hold: a
// Campaign takes the leadership anew, with a larger token.
func TestResumeElection(t *testing.T) {
	ctx := t.Context()
	cli := client(t)
	s := session(t, cli)
	e := concurrency.NewElection(s, "resumed")
	require.NoError(t, e.Campaign(ctx, "old"))
	same := concurrency.ResumeElection(s, "resumed", e.Key(), e.Rev())
	require.Same(t, e.Etcdlock(), same.Etcdlock())

	// The process restarts: its session is orphaned, a new one adopts
	// the lease.
	lease, key, rev := s.Lease(), e.Key(), e.Rev()
	s.Orphan()
	s2 := session(t, cli, concurrency.WithLease(lease))
	r := concurrency.ResumeElection(s2, "resumed", key, rev)
	require.Nil(t, r.Etcdlock(), "a resumed leadership handed out the old hold's token")
	require.NoError(t, r.Proclaim(ctx, "resumed"))
	lr, err := r.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "resumed", string(lr.Kvs[0].Value))
	require.NoError(t, r.Campaign(ctx, "new"))
	require.NotNil(t, r.Etcdlock())
	require.Greater(t, r.Etcdlock().Token(), rev)
	require.Greater(t, r.Rev(), rev)
	require.NoError(t, r.Resign(ctx))
}

// A Session WithLease on a lease a live Session of this process keeps
// alive shares it, and its holds: etcd's restart test does this in one
// process.
func TestWithLeaseSharesLiveSession(t *testing.T) {
	ctx := t.Context()
	cli := client(t)
	s := session(t, cli)
	e := concurrency.NewElection(s, "restart")
	require.NoError(t, e.Campaign(ctx, "abc"))
	s2 := session(t, cli, concurrency.WithLease(s.Lease()))
	e2 := concurrency.NewElection(s2, "restart")
	require.NoError(t, e2.Campaign(ctx, "def")) // a Proclaim: it is the leader
	require.Equal(t, e.Rev(), e2.Rev())
	s2.Orphan()
	select {
	case <-s.Done():
		t.Fatal("orphaning one sharer ended the other")
	default:
	}
	require.NoError(t, e.Proclaim(ctx, "ghi"))
}

// TryLock's and Lock's errors are this package's values, and ctx's own.
func TestErrors(t *testing.T) {
	ctx := t.Context()
	cli := client(t)
	m := concurrency.NewMutex(session(t, cli), "errs")
	require.True(t, errors.Is(m.Unlock(ctx), concurrency.ErrLockReleased))
	require.NoError(t, m.Lock(ctx))
	w := concurrency.NewMutex(session(t, cli), "errs")
	require.Equal(t, concurrency.ErrLocked, w.TryLock(ctx))
	require.Equal(t, "\x00", w.Key())
	short, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, w.Lock(short), context.Canceled)
	require.NoError(t, m.Unlock(ctx))
	_ = etcd.ErrLocked
	_ = etcdlock.ErrLocked
}

// What etcd's TestElectionWithAuthEnabled is about, without its orphaned
// sessions (which this package refuses, see Orphan): users whose roles
// cover only their own prefix campaign, twice each on one election, and
// the second candidate of each leads once the first resigns.
func TestCampaignWithPrefixRoles(t *testing.T) {
	ctx := t.Context()
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	rw := clientv3.PermissionType(clientv3.PermReadWrite)
	require.NoError(t, etcdtest.AddUser(ctx, root, "user1", "123", "role1", etcdtest.Grant{Prefix: "/foo1", Perm: rw}))
	require.NoError(t, etcdtest.AddUser(ctx, root, "user2", "456", "role2", etcdtest.Grant{Prefix: "/bar1", Perm: rw}))
	require.NoError(t, etcdtest.EnableAuth(ctx, root, "root-pw"))
	for _, u := range []struct{ user, password, pfx string }{{"user1", "123", "/foo1/a"}, {"user2", "456", "/bar1/b"}} {
		cli := c.Client(t, clientv3.Config{Username: u.user, Password: u.password})
		first := concurrency.NewElection(session(t, cli, concurrency.WithTTL(10)), u.pfx)
		require.NoError(t, first.Campaign(ctx, "first"), u.user)
		second := concurrency.NewElection(session(t, cli, concurrency.WithTTL(10)), u.pfx)
		won := make(chan error, 1)
		go func() { won <- second.Campaign(ctx, "second") }()
		// The second candidate's key is queued behind the first's.
		require.Eventually(t, func() bool {
			resp, err := cli.Get(ctx, u.pfx+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && resp.Count == 2
		}, 10*time.Second, 10*time.Millisecond)
		select {
		case err := <-won:
			t.Fatalf("%s: the second candidate won while the first led: %v", u.user, err)
		default:
		}
		require.NoError(t, first.Resign(ctx))
		require.NoError(t, <-won)
		lr, err := second.Leader(ctx)
		require.NoError(t, err)
		require.Equal(t, "second", string(lr.Kvs[0].Value))
		require.NoError(t, second.Resign(ctx))
	}
}
