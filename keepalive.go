package etcdlock

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// The sessions of one client renew their leases on one LeaseKeepAlive
// stream, as etcd's own lessor does, rather than each renewal opening a
// stream of its own (KeepAliveOnce): opening a stream costs etcd far more
// than a request on an open one, and under auth it costs an Authenticate
// call too (the client fetches a token for every stream it opens).
//
// etcd's lessor cannot be used as it is: it reports when an answer
// arrived, not when the request it answers was sent, and a session must
// count its lease's life from the send (see Session). The keeper records
// the time each request is handed to the stream. etcd serves a keepalive
// stream's requests one after the other and answers each one, in order
// (an error ends the stream instead), so the first unanswered request for
// a lease is the one an answer for that lease answers. Requests whose
// answers never come, because the stream broke, prove nothing: their
// sessions are told so and try again on the next stream.
//
// A stream can also stop answering without breaking: over a TCP
// connection gone half-open, which gRPC notices only with keepalive
// (clientv3.Config.DialKeepAliveTime), requests go out and nothing comes
// back. The keeper gives such a stream up as if it had broken (see
// stuckAfter) and opens another, which the client's balancer may put on
// another connection, to another endpoint.

// keepers holds the keeper of each client that has sessions.
var keepers struct {
	mu sync.Mutex // guards m and every keeper's refs
	m  map[*clientv3.Client]*keeper
}

// A keeper sends the lease renewals of the sessions of one client on one
// LeaseKeepAlive stream, and opens another when it breaks or is stuck
// (see stuckAfter). It opens the stream when there is a first renewal to
// send, not when it starts: a session makes no call beyond its Grant
// until its first renewal. It
// starts with the client's first session and ends when the last one ends
// or the client is closed. It is safe for concurrent use.
type keeper struct {
	cli    *clientv3.Client
	lease  pb.LeaseClient  // nil: renew with cli.KeepAliveOnce
	ctx    context.Context // ends when the last session leaves, or with the client
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	wake   chan struct{} // tells run, or the stream's sender, the queue has grown; capacity 1

	refs int // sessions using the keeper; guarded by keepers.mu

	mu      sync.Mutex                      // guards queue, pending, sending, heard, check, checkAt and every renewal's sent and abandoned
	queue   []*renewal                      // asked for, not yet sent
	pending map[clientv3.LeaseID][]*renewal // sent on the open stream, not yet answered: per lease, oldest first
	sending bool                            // a stream is open and its sender may send
	heard   time.Time                       // when a stream last delivered an answer
	check   *time.Timer                     // tells serve to look whether the open stream is stuck
	checkAt time.Time                       // when check fires; zero when it is stopped
}

// A renewal is one keepalive request of a session.
type renewal struct {
	id        clientv3.LeaseID
	patience  time.Duration // how long it waits for an answer on a silent stream: see stuckAfter
	sent      time.Time     // when it was handed to the stream
	abandoned bool          // its session stopped waiting before it was sent: not sent
	res       chan renewed  // receives the outcome, once; capacity 1
}

// renewed is the outcome of a renewal: the lease's TTL from when the
// request was sent (0 or less: the lease does not exist), or an error.
type renewed struct {
	sent time.Time
	ttl  int64
	err  error
}

// errStreamBroken is why a renewal fails that was sent on a stream that
// broke before answering it.
var errStreamBroken = errors.New("lease keepalive stream broke before answering")

// stuckAfter is how long a renewal of a lease of TTL ttl waits for its
// answer, with nothing at all coming on the stream meanwhile, before the
// keeper takes the stream for stuck and gives it up: every request pending
// on it fails, as when a stream breaks, and their sessions ask again at
// once, on the next stream.
//
// The wait must outlast answers that are only late (etcd under load, a
// slow link), and leave the session time to renew on a new stream before
// it gives up. A session sends a renewal TTL/3 after the last one etcd
// confirmed, the request goes out up to sendBatchDelay later, and the
// session gives up at TTL less its margin (100ms up to a TTL of 5s, TTL/50
// above). Waiting TTL/2 − 200ms leaves it TTL/6 + 200ms less those two for
// the keeper's backoff (25ms after a stream that answered), a new stream
// and a round trip: 167ms at etcd's minimum TTL of 1s, 500ms at 3s, 2.3s at
// the default 15s. And an answer that takes up to 1.3s still counts at a
// TTL of 3s, 7.3s at 15s. No plain fraction of the TTL does both: TTL/3
// gives up on answers 1s late at 3s, TTL/2 leaves no time at all at 1s.
//
// Answers to other requests are signs of life: a stream that keeps
// answering is not stuck, however far behind it is (etcd answers a
// stream's requests in order, and a burst of them waits in line).
func stuckAfter(ttl time.Duration) time.Duration {
	return ttl/2 - 200*time.Millisecond
}

// sendBatchDelay is how long the sender lets requests gather before it
// sends them: see send.
const sendBatchDelay = 100 * time.Millisecond

// Backoff between keepalive streams when one breaks.
const (
	minStreamBackoff = 25 * time.Millisecond
	maxStreamBackoff = time.Second
)

// acquireKeeper returns the keeper of cli, starting it if cli has none.
// The caller must call release once when done with it. A client without
// a gRPC connection of its own (clientv3.NewCtxClient, as etcd's v3client
// makes for an embedded server) gets a keeper that renews through the
// client's Lease, one KeepAliveOnce per renewal, as before there were
// keepers.
func acquireKeeper(cli *clientv3.Client) *keeper {
	if cli.ActiveConnection() == nil {
		return &keeper{cli: cli}
	}
	keepers.mu.Lock()
	defer keepers.mu.Unlock()
	if k := keepers.m[cli]; k != nil {
		k.refs++
		return k
	}
	if keepers.m == nil {
		keepers.m = make(map[*clientv3.Client]*keeper)
	}
	// The stream ends with the client: nothing can be renewed on a closed
	// client, and its goroutine must not outlive it.
	ctx, cancel := context.WithCancel(cli.Ctx())
	k := &keeper{
		cli:     cli,
		lease:   pb.NewLeaseClient(cli.ActiveConnection()),
		ctx:     ctx,
		cancel:  cancel,
		done:    make(chan struct{}),
		wake:    make(chan struct{}, 1),
		refs:    1,
		pending: make(map[clientv3.LeaseID][]*renewal),
		check:   time.NewTimer(time.Hour),
	}
	k.check.Stop()
	keepers.m[cli] = k
	go k.run()
	return k
}

// release gives back a keeper acquireKeeper returned. The last session
// to release it stops it, and waits until its goroutines have ended.
func (k *keeper) release() {
	if k.lease == nil {
		return
	}
	keepers.mu.Lock()
	k.refs--
	last := k.refs == 0
	if last {
		// A session that starts from now on gets a keeper of its own.
		delete(keepers.m, k.cli)
	}
	keepers.mu.Unlock()
	if last {
		k.cancel()
		<-k.done
	}
}

// renew sends a keepalive request for lease id and waits for its answer
// until ctx ends. It returns when the request was sent and the TTL etcd
// answered (0 or less when the lease does not exist), or an error: the
// stream broke or was given up as stuck, or ctx ended. patience is how
// long the request may wait for its answer on a silent stream before the
// stream counts as stuck (see stuckAfter). A request waits for a stream
// to be open; one not sent when ctx ends never is. A failed renewal
// proves nothing; the caller may try again.
func (k *keeper) renew(ctx context.Context, id clientv3.LeaseID, patience time.Duration) (sent time.Time, ttl int64, err error) {
	if k.lease == nil {
		sent = time.Now()
		resp, err := k.cli.KeepAliveOnce(ctx, id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return sent, 0, nil
		}
		if err != nil {
			return time.Time{}, 0, err
		}
		return sent, resp.TTL, nil
	}
	r := &renewal{id: id, patience: patience, res: make(chan renewed, 1)}
	k.mu.Lock()
	k.queue = append(k.queue, r)
	k.mu.Unlock()
	k.signal()
	select {
	case res := <-r.res:
		return res.sent, res.ttl, res.err
	case <-ctx.Done():
		// If it was sent, its answer goes to res, which nobody reads.
		k.mu.Lock()
		r.abandoned = true
		k.mu.Unlock()
		return time.Time{}, 0, ctx.Err()
	}
}

// signal wakes run, or the open stream's sender.
func (k *keeper) signal() {
	select {
	case k.wake <- struct{}{}:
	default: // woken already
	}
}

// run opens a stream when there is a renewal to send, serves it until it
// breaks, and waits a little before the next one, until the keeper is
// stopped or its client is closed.
func (k *keeper) run() {
	defer close(k.done)
	backoff := minStreamBackoff
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-k.wake:
		}
		if k.serve() {
			backoff = minStreamBackoff
		}
		t := time.NewTimer(backoff)
		select {
		case <-k.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxStreamBackoff)
		k.mu.Lock()
		left := len(k.queue) > 0
		k.mu.Unlock()
		if left {
			k.signal() // the requests not sent go on the next stream
		}
	}
}

// serve opens one stream and serves it until it breaks, it is stuck or
// the keeper stops. It reports whether etcd answered anything on it. The
// requests sent on it and not answered fail: they prove nothing.
func (k *keeper) serve() (answered bool) {
	// A member without a leader cannot renew a lease: with
	// WithRequireLeader it ends the stream, and the next one may go to a
	// member that can.
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(k.ctx))
	defer cancel()
	// WaitForReady: while the client has no connection, wait for one
	// rather than fail at once (as etcd's client does for its calls).
	stream, err := k.lease.LeaseKeepAlive(ctx, grpc.WaitForReady(true))
	if err != nil {
		k.signal() // the requests are still to be sent
		return false
	}
	k.mu.Lock()
	k.sending = true
	k.mu.Unlock()
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		k.send(ctx, stream)
		cancel() // a failed send breaks the stream: Recv returns too
	}()
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			answered = true
			k.answer(resp)
		}
	}()
	// Watch for a stuck stream here, not in the sender or the receiver:
	// either may be blocked on the stream for good (Send too, once the
	// stream's flow control window is used up).
	for done := false; !done; {
		select {
		case <-recvDone:
			done = true
		case <-k.check.C:
			if k.stuck(time.Now()) {
				cancel() // Recv returns
				<-recvDone
				done = true
			}
		}
	}

	k.mu.Lock()
	k.sending = false // from now on the sender sends nothing
	var failed []*renewal
	for _, q := range k.pending {
		failed = append(failed, q...)
	}
	clear(k.pending)
	k.check.Stop()
	k.checkAt = time.Time{}
	k.mu.Unlock()
	cancel()
	<-sendDone
	for _, r := range failed {
		r.res <- renewed{err: errStreamBroken}
	}
	return answered
}

// send sends the queued requests on stream, in order, until ctx ends, a
// send fails or serve stops it.
func (k *keeper) send(ctx context.Context, stream pb.Lease_LeaseKeepAliveClient) {
	for {
		for {
			k.mu.Lock()
			if !k.sending {
				k.mu.Unlock()
				return
			}
			var r *renewal
			for r == nil && len(k.queue) > 0 {
				r = k.queue[0]
				k.queue[0] = nil
				k.queue = k.queue[1:]
				if r.abandoned {
					r = nil
				}
			}
			if r == nil {
				k.mu.Unlock()
				break
			}
			// Taken before the request goes out: etcd receives it, and
			// extends the lease from then, no earlier than this.
			r.sent = time.Now()
			k.pending[r.id] = append(k.pending[r.id], r)
			if due := r.sent.Add(r.patience); k.checkAt.IsZero() || due.Before(k.checkAt) {
				k.checkAt = due
				k.check.Reset(r.patience)
			}
			k.mu.Unlock()
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(r.id)}); err != nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-k.wake:
		}
		// Gather the requests of the next moment and send them together:
		// etcd serves a burst of requests on a stream at a fraction of the
		// cost of the same requests one by one (a read, a wakeup and a
		// write each), and so does the client: at 1000 idle sessions,
		// 100ms of gathering halves the CPU per renewal on both sides. A request sent later is counted from then: the delay
		// costs its session sendBatchDelay of its renewal interval
		// (TTL/3, 333ms at least), nothing of its safety.
		t := time.NewTimer(sendBatchDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// answer hands etcd's answer to the oldest request for its lease that is
// still unanswered on the stream: etcd answers a stream's requests in
// order.
func (k *keeper) answer(resp *pb.LeaseKeepAliveResponse) {
	id := clientv3.LeaseID(resp.ID)
	k.mu.Lock()
	k.heard = time.Now()
	q := k.pending[id]
	if len(q) == 0 {
		// Not a request of ours: nothing to learn from it.
		k.mu.Unlock()
		return
	}
	r := q[0]
	if len(q) == 1 {
		delete(k.pending, id)
		if len(k.pending) == 0 && !k.checkAt.IsZero() {
			// Nothing left to be stuck on: no need to look.
			k.check.Stop()
			k.checkAt = time.Time{}
		}
	} else {
		q[0] = nil
		k.pending[id] = q[1:]
	}
	sent := r.sent
	k.mu.Unlock()
	r.res <- renewed{sent: sent, ttl: resp.TTL}
}

// stuck reports whether the open stream is stuck at now: a request on it
// has waited for its patience for an answer, and the stream has delivered
// nothing for as long. Then its sender sends nothing more. Otherwise it
// sets check to fire when the next request is due.
func (k *keeper) stuck(now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	var next time.Time
	for _, q := range k.pending {
		for _, r := range q {
			due := r.sent
			if k.heard.After(due) {
				due = k.heard
			}
			due = due.Add(r.patience)
			if !due.After(now) {
				k.sending = false
				return true
			}
			if next.IsZero() || due.Before(next) {
				next = due
			}
		}
	}
	k.checkAt = next
	if !next.IsZero() {
		k.check.Reset(next.Sub(now))
	}
	return false
}
