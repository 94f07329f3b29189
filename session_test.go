package etcdlock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// closed reports whether c is closed, without waiting.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestSessionCloseReleasesAtOnce(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name)
	capped := etcdlock.NewMutex(s, name+"-capped", etcdlock.WithMaxHold(time.Minute))
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, capped.Lock(t.Context()))
	require.False(t, closed(s.Done()))
	require.NoError(t, s.Err())

	require.NoError(t, s.Close())
	require.True(t, closed(s.Done()))
	// A clean close is not called an expiry, but still matches
	// ErrSessionExpired as every ended session does.
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionClosed)
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionExpired)
	require.Equal(t, "etcdlock: session closed", s.Err().Error())
	// Both keys went with Close: the session's lease and the max hold
	// lease the second key was moved to.
	require.Empty(t, keys(t, cli, name))
	require.Empty(t, keys(t, cli, name+"-capped"))
	ttl, err := cli.TimeToLive(t.Context(), s.Lease())
	require.NoError(t, err)
	require.EqualValues(t, -1, ttl.TTL)
	// The holds know they are lost without having watched.
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.ErrorIs(t, m.Err(), etcdlock.ErrSessionClosed)
	require.NotContains(t, m.Err().Error(), "expired")
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.ErrorIs(t, etcdlock.NewMutex(s, name).Lock(t.Context()), etcdlock.ErrSessionClosed)
}

func TestSessionOrphanLeavesLease(t *testing.T) {
	cli := newClient(t)
	s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithTTL(5*time.Second))
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	s.Orphan()
	require.True(t, closed(s.Done()))
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionClosed)
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost, "the hold is lost once the session has ended")
	ttl, err := cli.TimeToLive(t.Context(), s.Lease())
	require.NoError(t, err)
	require.Positive(t, ttl.TTL, "Orphan must not revoke the lease")
	require.Equal(t, []string{m.Key()}, keys(t, cli, lockName(t)))
	_, err = cli.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
}

// TestSessionCloseAfterOrphan: Close after Orphan revokes the lease, as
// etcd's Session does, and releases the locks at once rather than a TTL
// later. Before, Close after Orphan did nothing.
func TestSessionCloseAfterOrphan(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithTTL(30*time.Second))
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name)
	require.NoError(t, m.Lock(t.Context()))
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, cli), name))
	require.Equal(t, m.Key(), w.waitIdle(t))

	s.Orphan()
	ttl, err := cli.TimeToLive(t.Context(), s.Lease())
	require.NoError(t, err)
	require.Positive(t, ttl.TTL, "Orphan must not revoke the lease")
	w.assertWaiting(t)

	require.NoError(t, s.Close())
	ttl, err = cli.TimeToLive(t.Context(), s.Lease())
	require.NoError(t, err)
	require.EqualValues(t, -1, ttl.TTL, "Close after Orphan did not revoke the lease")
	// The lock passes on now, not when the 30s TTL runs out.
	require.NoError(t, w.result(t, 5*time.Second))
	require.Equal(t, []string{w.m.Key()}, keys(t, cli, name))

	require.NoError(t, s.Close(), "second Close")
	s.Orphan() // after Close: nothing to do
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.NoError(t, w.m.Unlock(t.Context()))
}

func TestSessionEndsWhenLeaseRevoked(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	// TTL 3s: the session renews every second and learns at the next
	// renewal that the lease is gone.
	s := newSession(t, cli, etcdlock.WithTTL(3*time.Second))
	_, err := cli.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session did not end after its lease was revoked")
	}
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionExpired)
	require.NotErrorIs(t, s.Err(), etcdlock.ErrSessionClosed, "a lost lease is no clean close")
}

func TestSessionWithContext(t *testing.T) {
	cli := newClient(t)
	ctx, cancel := context.WithCancel(t.Context())
	s := newSession(t, cli, etcdlock.WithContext(ctx))
	cancel()
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("session did not end with its context")
	}
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionExpired)
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionClosed)
	require.ErrorIs(t, s.Err(), context.Canceled)
	require.Equal(t, "etcdlock: session closed: its context ended: context canceled", s.Err().Error())
	require.ErrorIs(t, etcdlock.NewMutex(s, lockName(t)).Lock(t.Context()), etcdlock.ErrSessionExpired)
}

// TestNewSessionStart: NewSession's ctx bounds its start and nothing else.
// Before it took a ctx, NewSession with etcd down blocked for as long as
// the client retried (over 20s), and WithContext, the only bound, also
// ended the session later; an error of a leader failover made it fail.
func TestNewSessionStart(t *testing.T) {
	t.Parallel()
	const methodGrant = "/etcdserverpb.Lease/LeaseGrant"

	// Errors that pass are ridden out. The client sends a Grant again
	// itself after an Unavailable (a failover's timeout, a member without
	// a leader, and here an answer lost after etcd granted the lease), but
	// returns the others at once: those NewSession used to return.
	for _, tc := range []struct {
		name string
		act  etcdtest.Action
	}{
		{"ProposalDropped", etcdtest.Action{Fail: status.Error(codes.Unknown, "raft proposal dropped")}},
		{"TooManyRequests", etcdtest.Action{Fail: rpctypes.ErrGRPCRequestTooManyRequests}},
		{"TimedOutLeaderFail", etcdtest.Action{Fail: rpctypes.ErrGRPCTimeoutDueToLeaderFail}},
		{"NoLeader", etcdtest.Action{Fail: rpctypes.ErrGRPCNoLeader}},
		{"AnswerLost", etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
			if err != nil {
				return err
			}
			return rpctypes.ErrGRPCTimeout
		}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var in etcdtest.Injector
			cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			fired := in.At(etcdtest.Method(methodGrant), tc.act)
			var grants atomic.Int32
			in.Trace(func(r etcdtest.RPC) {
				if r.Method == methodGrant {
					grants.Add(1)
				}
			})
			s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithTTL(3*time.Second))
			require.NoError(t, err)
			defer s.Close()
			require.True(t, closed(fired), "the injection did not fire")
			require.EqualValues(t, 2, grants.Load())
			ttl, err := cli.TimeToLive(t.Context(), s.Lease())
			require.NoError(t, err)
			require.Positive(t, ttl.TTL)
			m := etcdlock.NewMutex(s, lockName(t))
			require.NoError(t, m.Lock(t.Context()))
			require.NoError(t, m.Unlock(t.Context()))
		})
	}

	t.Run("Refused", func(t *testing.T) {
		// An error no retry will mend is returned at once.
		t.Parallel()
		var in etcdtest.Injector
		cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
		in.At(etcdtest.Method(methodGrant), etcdtest.Action{Fail: rpctypes.ErrGRPCPermissionDenied})
		s, err := etcdlock.NewSession(t.Context(), cli)
		require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
		require.Nil(t, s)
		require.EqualValues(t, 1, in.Count())
	})

	t.Run("EtcdDown", func(t *testing.T) {
		// Nothing listens at the endpoint: the start ends with ctx, with
		// ctx's error, and not before, for a new lease and an adopted one.
		t.Parallel()
		port, err := etcdtest.FreePort()
		require.NoError(t, err)
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Logger: zap.NewNop()})
		require.NoError(t, err)
		defer cli.Close()
		for _, opts := range [][]etcdlock.SessionOption{nil, {etcdlock.WithLease(0x7eadbeef)}} {
			const bound = time.Second
			start := time.Now() // before the deadline is set: took >= bound
			ctx, cancel := context.WithTimeout(t.Context(), bound)
			s, err := etcdlock.NewSession(ctx, cli, opts...)
			took := time.Since(start)
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Nil(t, s)
			require.GreaterOrEqual(t, took, bound, "NewSession gave up before its ctx ended: %v", err)
			t.Logf("%v after %v", err, took)
		}
	})

	t.Run("OnlyTheStart", func(t *testing.T) {
		// After NewSession has returned, its ctx's end does not end the
		// session: it goes on renewing its lease.
		t.Parallel()
		var in etcdtest.Injector
		cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
		ctx, cancel := context.WithCancel(t.Context())
		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithTTL(3*time.Second))
		require.NoError(t, err)
		defer s.Close()
		cancel()
		renewed := make(chan struct{}, 2)
		in.Trace(func(r etcdtest.RPC) {
			if r.Method == etcdtest.MethodKeepAlive {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		})
		for range 2 {
			select {
			case <-renewed:
			case <-s.Done():
				t.Fatalf("the session ended with NewSession's ctx: %v", s.Err())
			case <-time.After(10 * time.Second):
				t.Fatal("no renewal in 10s")
			}
		}
		require.NoError(t, s.Err())
	})

	t.Run("SessionContextEnded", func(t *testing.T) {
		// WithContext bounds the start too: a session whose context has
		// ended would end at once.
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		s, err := etcdlock.NewSession(t.Context(), newClient(t), etcdlock.WithContext(ctx))
		require.ErrorIs(t, err, context.Canceled)
		require.Nil(t, s)
	})
}

// TestSessionWithLeaseNearExpiry adopts a lease with less time left than
// the first renewal interval its granted TTL would give: the session
// renews it at once. The lease has 2-3 s left, so that a loaded machine's
// stall does not let it expire first, and a renewal at the first interval
// (10 s / 3) would come too late.
func TestSessionWithLeaseNearExpiry(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	g, err := cli.Grant(t.Context(), 10)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, err := cli.TimeToLive(t.Context(), g.ID)
		return err == nil && r.TTL <= 2 // alive, under 3 s left
	}, 15*time.Second, 20*time.Millisecond)
	s := newSession(t, cli, etcdlock.WithLease(g.ID))
	require.Equal(t, g.ID, s.Lease())
	r, err := cli.TimeToLive(t.Context(), g.ID)
	require.NoError(t, err)
	require.GreaterOrEqual(t, r.TTL, int64(3), "the adopted lease was not renewed")
	require.False(t, closed(s.Done()))
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
}

// TestSessionKeepsLeaseAlive holds a lock over several TTLs.
func TestSessionKeepsLeaseAlive(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli, etcdlock.WithTTL(aliveTTL))
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	done := m.Done()
	deadline := time.Now().Add(2 * s.TTL())
	for time.Now().Before(deadline) {
		require.False(t, closed(done), "hold lost while the session renewed: %v", m.Err())
		r, err := cli.Get(t.Context(), m.Key())
		require.NoError(t, err)
		require.Len(t, r.Kvs, 1)
		time.Sleep(100 * time.Millisecond) // observe over time; the assertion is above
	}
	require.NoError(t, m.Unlock(t.Context()))
	require.True(t, closed(done))
	require.NoError(t, m.Err())
}

// TestSessionEndsWithClient: a program that closes only its client (etcd's
// own tests do) ends its sessions with it, as etcd's Session does: Done
// closes at once, Err says the client was closed, the holds and waits of
// the session end with it, and no goroutine of the session outlives it.
// Before, the session renewed on the closed client until its TTL ran out.
func TestSessionEndsWithClient(t *testing.T) {
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, newClient(t)), name+"-other")
	require.NoError(t, holder.Lock(t.Context()))
	// Everything running from here on is this test's client and session.
	running := goleak.IgnoreCurrent()

	cli, err := cluster.NewClient(clientv3.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })               // should the test fail before it closes it
	s, err := etcdlock.NewSession(t.Context(), cli) // never closed: only the client is
	require.NoError(t, err)
	m := etcdlock.NewMutex(s, name)
	require.NoError(t, m.Lock(t.Context()))
	held := m.Done()
	w := startWaiter(t.Context(), etcdlock.NewMutex(s, name+"-other"))
	require.Equal(t, holder.Key(), w.waitIdle(t))

	require.NoError(t, cli.Close())
	closed := time.Now()
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("session still running 10s after its client was closed (TTL %v)", s.TTL())
	}
	t.Logf("session ended %v after its client was closed", time.Since(closed))
	require.ErrorIs(t, s.Err(), etcdlock.ErrSessionExpired)
	require.Contains(t, s.Err().Error(), "client closed")
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the hold did not end with the session")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.ErrorIs(t, m.Err(), etcdlock.ErrSessionExpired)
	require.ErrorIs(t, w.result(t, 10*time.Second), etcdlock.ErrSessionExpired)
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)

	// Nothing of the session is left running (goleak waits a moment for
	// goroutines that are ending).
	require.NoError(t, leakcheck.Find(running))

	// Close can no longer revoke the lease, and says so: the lease, and
	// the keys on it, live until its TTL runs out, as with etcd's Session.
	err = s.Close()
	require.Error(t, err)
	require.Contains(t, err.Error(), "client closed")
	other := newClient(t)
	require.Len(t, keys(t, other, name), 1)
	// Revoke it here, so that a rerun (-count) does not queue behind it.
	_, err = other.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestWatchStreamIdle: a session watches its keys on a stream of its own
// while it has any to watch (Done, a waiter's own key); once it has had
// none for a few seconds, the stream and its goroutines end, and the next
// Done opens it again.
func TestWatchStreamIdle(t *testing.T) {
	cli := newClient(t)
	m := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithTTL(3*time.Minute)), lockName(t))
	// The keepalive stream opens at the first renewal, a minute from now:
	// everything that starts from here on is the watch stream's.
	running := goleak.IgnoreCurrent()
	require.NoError(t, m.Lock(t.Context()))
	m.Done()
	require.NoError(t, m.Unlock(t.Context()))
	waitStreamGone(t, running, "after Unlock")

	require.NoError(t, m.Lock(t.Context()))
	held := m.Done()
	_, err := cli.Delete(t.Context(), m.Key())
	require.NoError(t, err)
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed within 10s of the key's deletion, on a reopened stream")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)

	// A watch that ends while its key is looked into (here, a loss) also
	// leaves the stream idle, and it ends: the sender must be woken to
	// start its idle timer (it waited without one, as there was a watch).
	// An Unlock racing its own deletion's event takes the same path.
	waitStreamGone(t, running, "after a loss")
}

// waitStreamGone waits until the goroutines started since running have
// ended: the watch stream, idle for idleStreamTimeout (5s), closed.
func waitStreamGone(t *testing.T, running goleak.Option, when string) {
	t.Helper()
	// (Find waits a moment for goroutines that are ending, before it fails.)
	deadline := time.Now().Add(15 * time.Second)
	for err := leakcheck.Find(running); err != nil; err = leakcheck.Find(running) {
		if time.Now().After(deadline) {
			t.Fatalf("the watch stream outlived its last watch, %s, by more than 15s: %v", when, err)
		}
	}
}

// TestOneSessionPerLease (issue 17, item 3): two Sessions on one lease
// share every key name/<lease>, and their Mutexes would not exclude each
// other: the second locked at once while the first held, and its Unlock
// deleted the first's key without the first's Done closing. NewSession
// refuses a lease that a Session of this process still uses, through any
// client of the cluster; once that Session has ended, the lease may be
// adopted.
func TestOneSessionPerLease(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s1 := newSession(t, cli)
	m1 := etcdlock.NewMutex(s1, lockName(t))
	require.NoError(t, m1.Lock(t.Context()))

	for _, c := range []*clientv3.Client{cli, newClient(t)} {
		s2, err := etcdlock.NewSession(t.Context(), c, etcdlock.WithLease(s1.Lease()))
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
		require.Nil(t, s2)
	}
	require.NoError(t, m1.Err())
	require.Equal(t, []string{m1.Key()}, keys(t, cli, lockName(t)))

	// Ended, without revoking the lease: it may be adopted, with what is
	// left under it.
	require.NoError(t, m1.Unlock(t.Context()))
	s1.Orphan()
	s3 := newSession(t, cli, etcdlock.WithLease(s1.Lease()))
	require.Equal(t, s1.Lease(), s3.Lease())
	m3 := etcdlock.NewMutex(s3, lockName(t))
	require.NoError(t, m3.Lock(t.Context()))
	require.NoError(t, m3.Unlock(t.Context()))
}

// Expiry is the lease's known life: send time of the grant (or the newest
// confirmed renewal) plus the TTL, never later than etcd could count it,
// and it moves on with each confirmed renewal. Here against the clock the
// test reads around the grant, and the hook that reports a renewal.
func TestSessionExpiry(t *testing.T) {
	t.Parallel()
	renewed := make(chan etcdlock.RenewDoneInfo, 16)
	before := time.Now()
	s := newSession(t, newClient(t), etcdlock.WithTTL(3*time.Second), etcdlock.WithHooks(etcdlock.Hooks{
		RenewDone: func(i etcdlock.RenewDoneInfo) {
			select {
			case renewed <- i:
			default:
			}
		},
	}))
	after := time.Now()
	first := s.Expiry()
	require.False(t, first.Before(before.Add(s.TTL())), "Expiry %v is before the grant was sent + TTL", first.Sub(before))
	require.False(t, first.After(after.Add(s.TTL())), "Expiry %v is later than the grant's answer + TTL", first.Sub(before))

	var i etcdlock.RenewDoneInfo
	select {
	case i = <-renewed:
	case <-time.After(time.Minute):
		t.Fatal("no renewal reported")
	}
	require.NoError(t, i.Err)
	require.True(t, s.Expiry().After(first), "Expiry did not move on with a renewal")
	require.False(t, s.Expiry().After(time.Now().Add(s.TTL())), "Expiry is later than now + TTL")
}
