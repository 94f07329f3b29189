package etcdlock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// aliveTTL is the TTL of the sessions of tests that check that renewals
// keep a lease alive. A session gives up a margin before its TTL after the
// last confirmed renewal, and renews every TTL/3: at etcd's minimum of 1s
// a stall of about 600ms of the test process (two saturated cores) ended
// sessions that were renewing correctly. 3s leaves room for 2s stalls.
const aliveTTL = 3 * time.Second

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
		ss1 = append(ss1, newSession(t, cli1, etcdlock.WithTTL(aliveTTL)))
		ss2 = append(ss2, newSession(t, cli2, etcdlock.WithTTL(aliveTTL)))
	}
	// A renewal every second, so 4 rounds in about 4s.
	waitAnswered(t, kas1, 0, 4*n, 30*time.Second)
	waitAnswered(t, kas2, 0, 4*n, 30*time.Second)
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

	s := newSession(t, cli1, etcdlock.WithTTL(aliveTTL))
	from := kas1.answered.Load()
	waitAnswered(t, kas1, from, 3, 30*time.Second)
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
	ss := []*etcdlock.Session{newSession(t, cli, etcdlock.WithTTL(aliveTTL)), newSession(t, cli, etcdlock.WithTTL(aliveTTL))}
	// The stream opens (and the client authenticates for it) after the
	// sessions have started: count from its first answer on.
	waitAnswered(t, kas, 0, 1, 30*time.Second)
	unary, from := rpcs.Unary(), kas.answered.Load()
	waitAnswered(t, kas, from, 8, 30*time.Second)
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
	s := newSession(t, cli, etcdlock.WithTTL(aliveTTL))
	m := etcdlock.NewMutex(s, lockName(t))
	require.NoError(t, m.Lock(t.Context()))
	time.Sleep(2 * s.TTL()) // the lease would have expired without renewals
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
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed within 10s of the key's deletion")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.Contains(t, m.Err().Error(), "was deleted")
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
}

// stallingKeepAlive makes a client's LeaseKeepAlive stream stop answering,
// as a stream does whose TCP connection went half-open: once stall is
// called, the stream open at that moment delivers nothing more (its
// RecvMsg swallows every answer and returns only when the stream's context
// ends), while the streams opened after it work. It records every answer
// that reaches the client.
type stallingKeepAlive struct {
	answers chan keepAliveAnswer // every answer delivered, until full
	end     sync.Once            // closes ended
	ended   chan struct{}        // closed when the stalled stream has ended
	endedAt time.Time            // when it ended; read once ended is closed

	mu      sync.Mutex      // guards current, opened
	current *stallingStream // the newest stream
	opened  int             // streams opened
}

// A keepAliveAnswer is an answer delivered on the stream-th keepalive
// stream the client opened, counted from 1.
type keepAliveAnswer struct {
	lease  clientv3.LeaseID
	ttl    int64
	stream int
	at     time.Time
}

func newStallingKeepAlive() *stallingKeepAlive {
	return &stallingKeepAlive{answers: make(chan keepAliveAnswer, 1024), ended: make(chan struct{})}
}

func (p *stallingKeepAlive) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Lease/LeaseKeepAlive" {
			return cs, err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		p.opened++
		p.current = &stallingStream{ClientStream: cs, ctx: ctx, p: p, n: p.opened}
		return p.current, nil
	})}
}

// stall makes the stream open now deliver no more answers, and returns
// which stream it is.
func (p *stallingKeepAlive) stall(t *testing.T) int {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NotNil(t, p.current, "no keepalive stream to stall")
	p.current.stalled.Store(true)
	return p.current.n
}

// streams returns how many keepalive streams the client has opened.
func (p *stallingKeepAlive) streams() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.opened
}

type stallingStream struct {
	grpc.ClientStream
	ctx     context.Context
	p       *stallingKeepAlive
	n       int
	stalled atomic.Bool
}

func (s *stallingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if s.stalled.Load() {
		// An answer, or the stream's end, that never reaches the client:
		// it waits until the client gives the stream up.
		<-s.ctx.Done()
		s.p.end.Do(func() {
			s.p.endedAt = time.Now()
			close(s.p.ended)
		})
		return status.Error(codes.Canceled, s.ctx.Err().Error())
	}
	if err == nil {
		resp := m.(*pb.LeaseKeepAliveResponse)
		select {
		case s.p.answers <- keepAliveAnswer{lease: clientv3.LeaseID(resp.ID), ttl: resp.TTL, stream: s.n, at: time.Now()}:
		default:
		}
	}
	return err
}

// waitRenewed waits until etcd has renewed the lease of each session in
// ss with an answer delivered on a stream after the after-th and at or
// after since. It fails at once if a session ends, or after within.
func (p *stallingKeepAlive) waitRenewed(t *testing.T, ss []*etcdlock.Session, after int, since time.Time, within time.Duration) {
	t.Helper()
	ended := make(chan *etcdlock.Session, len(ss))
	for _, s := range ss {
		go func() {
			select {
			case <-s.Done():
				ended <- s
			case <-t.Context().Done():
			}
		}()
	}
	left := make(map[clientv3.LeaseID]bool)
	for _, s := range ss {
		left[s.Lease()] = true
	}
	timeout := time.After(within)
	for len(left) > 0 {
		select {
		case a := <-p.answers:
			if a.stream > after && !a.at.Before(since) && a.ttl > 0 {
				delete(left, a.lease)
			}
		case s := <-ended:
			t.Fatalf("session of lease %x ended: %v", s.Lease(), s.Err())
		case <-timeout:
			t.Fatalf("%d of %d leases not renewed on a stream after the %d-th, since %v, within %v", len(left), len(ss), after, since.Format(time.StampMilli), within)
		}
	}
}

// TestKeepAliveStuckStreamReplaced: a keepalive stream that stops
// answering (issue 17, item 8: a half-open TCP connection, which gRPC
// without keepalive does not notice) is given up and another opened, on
// which the sessions go on renewing. Before, the keeper kept the stream:
// every renewal waited on it for an answer that never came, and every
// session of the client ended when its lease's known life ran out, though
// a new stream would have renewed them.
func TestKeepAliveStuckStreamReplaced(t *testing.T) {
	if testing.Short() {
		t.Skip("waits two lease TTLs")
	}
	t.Parallel()
	for _, n := range []int{1, 2} {
		t.Run(fmt.Sprintf("Sessions%d", n), func(t *testing.T) {
			t.Parallel()
			p := newStallingKeepAlive()
			cli := cluster.Client(t, clientv3.Config{DialOptions: p.DialOptions()})
			var ss []*etcdlock.Session
			for range n {
				ss = append(ss, newSession(t, cli, etcdlock.WithTTL(3*time.Second)))
			}
			ttl := ss[0].TTL()
			p.waitRenewed(t, ss, 0, time.Time{}, 10*time.Second)

			stalled := p.stall(t)
			at := time.Now()
			// Each lease renewed by an answer that came twice its TTL after
			// the stream stalled: on another stream, since the stalled one
			// delivers nothing.
			p.waitRenewed(t, ss, stalled, at.Add(2*ttl), 2*ttl+10*time.Second)
			for _, s := range ss {
				require.False(t, closed(s.Done()), "session of lease %x ended", s.Lease())
				require.NoError(t, s.Err())
			}
			requireAlive(t, cli, ss)
			select {
			case <-p.ended:
				t.Logf("stalled stream given up %v after it stalled", p.endedAt.Sub(at).Round(time.Millisecond))
			case <-time.After(10 * time.Second):
				t.Fatal("the stalled stream was not given up")
			}
			require.Equal(t, stalled+1, p.streams(), "one new stream for the stalled one")
		})
	}
}
