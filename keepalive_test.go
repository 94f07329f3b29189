package etcdlock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

// keepAliveCount counts a client's lease keepalive requests and answers,
// over all its LeaseKeepAlive streams.
type keepAliveCount struct {
	sent, answered atomic.Int64
}

func (c *keepAliveCount) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return cs, err
		}
		return &countedStream{ClientStream: cs, c: c}, nil
	})}
}

type countedStream struct {
	grpc.ClientStream
	c *keepAliveCount
}

func (s *countedStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err == nil {
		s.c.sent.Add(1)
	}
	return err
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.c.answered.Add(1)
	}
	return err
}

// countedClient returns a client of c whose streams and keepalives are
// counted, closed at the end of the test.
func countedClient(t *testing.T, c *etcdtest.Cluster) (*clientv3.Client, *etcdtest.RPCCounter, *keepAliveCount) {
	t.Helper()
	rpcs, kas := new(etcdtest.RPCCounter), new(keepAliveCount)
	cli := c.Client(t, clientv3.Config{DialOptions: append(rpcs.DialOptions(), kas.DialOptions()...)})
	return cli, rpcs, kas
}

// waitAnswered waits until kas has counted n more answers than from.
func waitAnswered(t *testing.T, kas *keepAliveCount, from, n int64, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return kas.answered.Load()-from >= n }, within, 10*time.Millisecond,
		"%d keepalives answered in %v, want %d", kas.answered.Load()-from, within, n)
}

// requireAlive asserts every session runs and etcd still has its lease.
func requireAlive(t *testing.T, cli *clientv3.Client, ss []*etcdlock.Session) {
	t.Helper()
	for _, s := range ss {
		require.NoError(t, s.Err())
		r, err := cli.TimeToLive(t.Context(), s.Lease())
		require.NoError(t, err)
		// -1: no such lease; 0 is a live one with under a second left.
		require.GreaterOrEqual(t, r.TTL, int64(0), "lease %x is gone", s.Lease())
	}
}

// TestSessionsShareKeepAliveStream: the sessions of a client renew their
// leases on one LeaseKeepAlive stream, over many renewals, and another
// client's sessions on one of its own. Before, each renewal opened a
// stream (KeepAliveOnce): TTL/3 apart, per session. The stream ends with
// the last session of its client, and a later session opens a new one.
func TestSessionsShareKeepAliveStream(t *testing.T) {
	const n = 5
	cli1, rpcs1, kas1 := countedClient(t, cluster)
	cli2, rpcs2, kas2 := countedClient(t, cluster)
	var ss1, ss2 []*etcdlock.Session
	for range n {
		ss1 = append(ss1, newSession(t, cli1, etcdlock.WithTTL(time.Second)))
		ss2 = append(ss2, newSession(t, cli2, etcdlock.WithTTL(time.Second)))
	}
	// TTL 1s: a renewal every 333ms, so 4 rounds in under 2s.
	waitAnswered(t, kas1, 0, 4*n, 10*time.Second)
	waitAnswered(t, kas2, 0, 4*n, 10*time.Second)
	requireAlive(t, cli1, ss1)
	requireAlive(t, cli2, ss2)
	require.EqualValues(t, 1, rpcs1.Streams(), "streams opened by the first client's %d sessions", n)
	require.EqualValues(t, 1, rpcs2.Streams(), "streams opened by the second client's %d sessions", n)
	t.Logf("%d and %d keepalives, on one stream per client", kas1.sent.Load(), kas2.sent.Load())

	// The keepalive goroutines of the first client end with its last
	// session; the second client's go on.
	running := goleak.IgnoreCurrent()
	for _, s := range ss1[1:] {
		require.NoError(t, s.Close())
	}
	require.NoError(t, leakcheck.Find(running), "nothing ends while a session remains")
	ss1[0].Orphan()
	_, err := cli1.Revoke(t.Context(), ss1[0].Lease())
	require.NoError(t, err)
	// What may remain is what ran before: nothing of the first client's
	// keepalives is new, and the goroutines they had must be gone.
	require.NoError(t, leakcheck.Find(running))

	s := newSession(t, cli1, etcdlock.WithTTL(time.Second))
	from := kas1.answered.Load()
	waitAnswered(t, kas1, from, 3, 10*time.Second)
	requireAlive(t, cli1, []*etcdlock.Session{s})
	require.EqualValues(t, 2, rpcs1.Streams(), "a session after the last one ended opens a new stream")
	require.EqualValues(t, 1, rpcs2.Streams())
}

// TestKeepAliveStreamReopened kills and restarts the member: the shared
// stream breaks, is opened again once etcd is back, and the sessions keep
// their leases and renew on the new stream.
func TestKeepAliveStreamReopened(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts a member")
	}
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli, rpcs, kas := countedClient(t, c)
	var ss []*etcdlock.Session
	for range 3 {
		ss = append(ss, newSession(t, cli, etcdlock.WithTTL(6*time.Second)))
	}
	waitAnswered(t, kas, 0, 3, 10*time.Second)
	require.EqualValues(t, 1, rpcs.Streams())

	c.KillMember(0)
	killed := time.Now()
	require.NoError(t, c.RestartMember(0))
	t.Logf("member back %v after it was killed", time.Since(killed).Round(time.Millisecond))
	// Two rounds of renewals on the new stream (one every 2s).
	from := kas.answered.Load()
	waitAnswered(t, kas, from, 2*int64(len(ss)), 15*time.Second)
	requireAlive(t, cli, ss)
	streams := rpcs.Streams()
	require.GreaterOrEqual(t, streams, int64(2), "the stream was not opened again")
	// A stream opened before the member has a leader ends at once; more
	// than a few means the keeper does not back off.
	require.LessOrEqual(t, streams, int64(10))
	t.Logf("%d streams opened in all", streams)
	// And the renewals go on on one stream.
	from = kas.answered.Load()
	waitAnswered(t, kas, from, 2*int64(len(ss)), 15*time.Second)
	require.Equal(t, streams, rpcs.Streams())
}

// TestSessionRenewsUnderAuth: under etcd auth the shared stream carries
// the client's token, and renewing costs no call to etcd: before, every
// renewal opened a stream, and the client authenticated anew (a bcrypt
// check on the server) for each stream it opened.
func TestSessionRenewsUnderAuth(t *testing.T) {
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	require.NoError(t, etcdtest.EnableAuth(t.Context(), root, "root-pw"))
	rpcs, kas := new(etcdtest.RPCCounter), new(keepAliveCount)
	cli := c.Client(t, clientv3.Config{
		Username: "root", Password: "root-pw",
		DialOptions: append(rpcs.DialOptions(), kas.DialOptions()...),
	})
	ss := []*etcdlock.Session{newSession(t, cli, etcdlock.WithTTL(time.Second)), newSession(t, cli, etcdlock.WithTTL(time.Second))}
	// The stream opens (and the client authenticates for it) after the
	// sessions have started: count from its first answer on.
	waitAnswered(t, kas, 0, 1, 10*time.Second)
	unary, from := rpcs.Unary(), kas.answered.Load()
	waitAnswered(t, kas, from, 8, 10*time.Second)
	require.Equal(t, unary, rpcs.Unary(), "renewals made unary calls (Authenticate?)")
	require.EqualValues(t, 1, rpcs.Streams())
	requireAlive(t, cli, ss)
}

// TestSessionWithoutConnection: a client with no gRPC connection of its
// own (clientv3.NewCtxClient, as etcd's v3client makes for an embedded
// server) has no stream to share: its sessions renew through its Lease.
func TestSessionWithoutConnection(t *testing.T) {
	t.Parallel()
	real := newClient(t)
	cli := clientv3.NewCtxClient(t.Context())
	t.Cleanup(func() { cli.Close() })
	cli.KV, cli.Lease, cli.Watcher = real.KV, real.Lease, real.Watcher
	s := newSession(t, cli, etcdlock.WithTTL(time.Second))
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	time.Sleep(3 * s.TTL()) // the lease would have expired twice over without renewals
	requireAlive(t, real, []*etcdlock.Session{s})
	require.NoError(t, m.Err())
	require.NoError(t, m.Unlock(t.Context()))
}

// TestDoneWithoutConnection: on a client with no gRPC connection of its
// own there is no stream for the session to watch its keys on: Done
// watches through the client's Watcher, and still reports a deleted key
// and ends with Unlock.
func TestDoneWithoutConnection(t *testing.T) {
	real := newClient(t)
	cli := clientv3.NewCtxClient(t.Context())
	t.Cleanup(func() { cli.Close() })
	cli.KV, cli.Lease, cli.Watcher = real.KV, real.Lease, real.Watcher
	m := etcdlock.NewMutex(newSession(t, cli), lockName(t))

	require.NoError(t, m.Lock(t.Context()))
	done := m.Done()
	require.NoError(t, m.Unlock(t.Context()))
	select {
	case <-done:
	default:
		t.Fatal("Done not closed when Unlock returned")
	}

	require.NoError(t, m.Lock(t.Context()))
	done = m.Done()
	_, err := real.Delete(t.Context(), m.Key())
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Done not closed within 2s of the key's deletion")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.Contains(t, m.Err().Error(), "was deleted")
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
}
