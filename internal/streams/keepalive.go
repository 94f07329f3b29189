package streams

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
// count its lease's life from the send (see Session). The Keeper records
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
// back. The Keeper gives such a stream up as if it had broken (see
// StuckAfter) and opens another, which the client's balancer may put on
// another connection, to another endpoint.

// keepers holds the Keeper of each client that has sessions.
var keepers Shared[*Keeper]

// A Keeper sends the lease renewals of the sessions of one client on one
// LeaseKeepAlive stream (its runner's), and opens another when it breaks
// or is stuck (see StuckAfter). It opens the stream when there is a first
// renewal to send, not when it starts: a session makes no call beyond its
// Grant until its first renewal. It starts with the client's first
// session and ends when the last one ends or the client is closed. It is
// safe for concurrent use.
type Keeper struct {
	cli    *clientv3.Client
	lease  pb.LeaseClient  // nil: renew with cli.KeepAliveOnce
	ctx    context.Context // ends when the last session leaves, or with the client
	cancel context.CancelFunc
	r      *Runner[*pb.LeaseKeepAliveRequest, *pb.LeaseKeepAliveResponse]

	mu      sync.Mutex  // guards the fields below, and every renewal's sent and abandoned
	queue   []*renewal  // asked for, not yet sent
	sent    keptStream  // what was sent on the open stream and not answered
	check   *time.Timer // looks whether the open stream is stuck (checkStuck)
	checkAt time.Time   // when check fires; zero when it is stopped
}

// A keptStream is what the Keeper sent on one stream and still waits for.
type keptStream struct {
	// pending holds the requests sent and not answered, per lease, oldest
	// first: etcd answers a stream's requests in order.
	pending map[clientv3.LeaseID][]*renewal
	heard   time.Time // when an answer last came on the stream
}

// A renewal is one keepalive request of a session.
type renewal struct {
	id        clientv3.LeaseID
	patience  time.Duration // how long it waits for an answer on a silent stream: see StuckAfter
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

// ErrStreamBroken is why a renewal fails that was sent on a stream that
// broke before answering it.
var ErrStreamBroken = errors.New("lease keepalive stream broke before answering")

// StuckAfter is how long a renewal of a lease of TTL ttl waits for its
// answer, with nothing at all coming on the stream meanwhile, before the
// Keeper takes the stream for stuck and gives it up: every request pending
// on it fails, as when a stream breaks, and their sessions ask again at
// once, on the next stream.
//
// The wait must outlast answers that are only late (etcd under load, a
// slow link), and leave the session time to renew on a new stream before
// it gives up. A session sends a renewal TTL/3 after the last one etcd
// confirmed, the request goes out up to sendBatchDelay later, and the
// session gives up at TTL less its margin (100ms up to a TTL of 5s, TTL/50
// above). Waiting TTL/2 − 200ms leaves it TTL/6 + 200ms less those two for
// the runner's backoff (25ms after a stream that answered), a new stream
// and a round trip: 167ms at etcd's minimum TTL of 1s, 500ms at 3s, 2.3s
// at the default 15s. An answer later than the wait could not have saved a
// session whose every answer is as late anyway: a session renews once its
// last renewal is answered, so two answers in a row must come within its
// TTL, and TTL/2 − 200ms is within 100ms of the most each may take.
//
// Answers to other requests are signs of life: a stream that keeps
// answering is not stuck, however far behind it is (etcd answers a
// stream's requests in order, and a burst of them waits in line).
func StuckAfter(ttl time.Duration) time.Duration {
	return ttl/2 - 200*time.Millisecond
}

// sendBatchDelay is how long the sender lets requests gather before it
// sends them. etcd serves a burst of requests on a stream at a fraction of
// the cost of the same requests one by one (a read, a wakeup and a write
// each), and so does the client. A request sent later is counted from
// then: the delay costs its session sendBatchDelay of its renewal interval
// (TTL/3, 333ms at least), nothing of its safety.
const sendBatchDelay = 100 * time.Millisecond

// Backoff between streams when one breaks.
const (
	MinBackoff = 25 * time.Millisecond
	MaxBackoff = time.Second
)

// AcquireKeeper returns the Keeper of cli, starting it if cli has none.
// The caller must call release once when done with it. A client without
// a gRPC connection of its own (clientv3.NewCtxClient, as etcd's v3client
// makes for an embedded server) gets a Keeper that renews through the
// client's Lease, one KeepAliveOnce per renewal.
func AcquireKeeper(cli *clientv3.Client) *Keeper {
	conn := cli.ActiveConnection()
	if conn == nil {
		return &Keeper{cli: cli}
	}
	return keepers.Acquire(cli, func() *Keeper {
		// The stream ends with the client: nothing can be renewed on a
		// closed client, and its goroutines must not outlive it.
		ctx, cancel := context.WithCancel(cli.Ctx())
		k := &Keeper{
			cli:    cli,
			lease:  pb.NewLeaseClient(conn),
			ctx:    ctx,
			cancel: cancel,
			sent:   keptStream{pending: make(map[clientv3.LeaseID][]*renewal)},
		}
		k.r = NewRunner(ctx, &k.mu, User[*pb.LeaseKeepAliveRequest, *pb.LeaseKeepAliveResponse](k))
		k.r.Batch = sendBatchDelay
		k.check = time.AfterFunc(time.Hour, k.checkStuck)
		k.check.Stop()
		return k
	})
}

// release gives back a Keeper AcquireKeeper returned. The last session
// to release it stops it, and waits until its goroutines have ended.
func (k *Keeper) Release() {
	if k.lease == nil || !keepers.Release(k.cli) {
		return
	}
	k.cancel()
	k.r.Stop()
	k.check.Stop()
}

// renew sends a keepalive request for lease id and waits for its answer
// until ctx ends or expired fires (the session gives up at giveUp). It
// returns when the request was sent and the TTL etcd answered (0 or less
// when the lease does not exist), or an error: the stream broke or was
// given up as stuck, ctx ended, or context.DeadlineExceeded when expired
// fired. patience is how long the request may wait for its answer on a
// silent stream before the stream counts as stuck (see StuckAfter). A
// request waits for a stream to be open; one not sent when renew returns
// never is. A failed renewal proves nothing; the caller may try again.
func (k *Keeper) Renew(ctx context.Context, id clientv3.LeaseID, patience time.Duration, giveUp time.Time, expired <-chan time.Time) (sent time.Time, ttl int64, err error) {
	if k.lease == nil {
		ctx, cancel := context.WithDeadline(ctx, giveUp)
		defer cancel()
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
	k.r.Start()
	k.mu.Unlock()
	k.r.Signal()
	select {
	case res := <-r.res:
		return res.sent, res.ttl, res.err
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = context.DeadlineExceeded
	}
	// If it was sent, its answer goes to res, which nobody reads.
	k.mu.Lock()
	r.abandoned = true
	k.mu.Unlock()
	return time.Time{}, 0, err
}

// open opens a LeaseKeepAlive stream (User).
func (k *Keeper) Open(ctx context.Context) (Bidi[*pb.LeaseKeepAliveRequest, *pb.LeaseKeepAliveResponse], error) {
	// A member without a leader cannot renew a lease: with
	// WithRequireLeader it ends the stream, and the next one may go to a
	// member that can. WaitForReady: while the client has no connection,
	// wait for one rather than fail at once (as etcd's client does for
	// its calls).
	return k.lease.LeaseKeepAlive(clientv3.WithRequireLeader(ctx), grpc.WaitForReady(true))
}

// next returns the next renewal to send on the open stream, with k.mu
// held (User).
func (k *Keeper) Next() (*pb.LeaseKeepAliveRequest, bool) {
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
		return nil, false
	}
	// Taken before the request goes out: etcd receives it, and extends
	// the lease from then, no earlier than this.
	r.sent = time.Now()
	k.sent.pending[r.id] = append(k.sent.pending[r.id], r)
	if due := r.sent.Add(r.patience); k.checkAt.IsZero() || due.Before(k.checkAt) {
		k.checkAt = due
		k.check.Reset(r.patience)
	}
	return &pb.LeaseKeepAliveRequest{ID: int64(r.id)}, true
}

// waiting reports, with k.mu held, whether there are renewals to send
// (User).
func (k *Keeper) Waiting() bool { return len(k.queue) > 0 }

// idle is never true: the Keeper's stream stays open while it has
// sessions, which renew every TTL/3 (User).
func (k *Keeper) Idle() bool { return false }

// receive hands etcd's answer to the oldest request for its lease that is
// still unanswered on the stream, since etcd answers a stream's requests
// in order (User).
func (k *Keeper) Receive(resp *pb.LeaseKeepAliveResponse) bool {
	k.mu.Lock()
	r := k.sent.answer(resp)
	if len(k.sent.pending) == 0 && !k.checkAt.IsZero() {
		// Nothing left to be stuck on: no need to look.
		k.check.Stop()
		k.checkAt = time.Time{}
	}
	var sent time.Time
	if r != nil {
		sent = r.sent
	}
	k.mu.Unlock()
	if r != nil {
		r.res <- renewed{sent: sent, ttl: resp.TTL}
	}
	return true
}

// answer takes the request resp answers off ks and returns it, or nil if
// it answers no request of ours.
func (ks *keptStream) answer(resp *pb.LeaseKeepAliveResponse) *renewal {
	ks.heard = time.Now()
	id := clientv3.LeaseID(resp.ID)
	q := ks.pending[id]
	if len(q) == 0 {
		return nil
	}
	r := q[0]
	if len(q) == 1 {
		delete(ks.pending, id)
	} else {
		q[0] = nil
		ks.pending[id] = q[1:]
	}
	return r
}

// ended fails the renewals sent on the stream that ended and not answered:
// they prove nothing (User).
func (k *Keeper) Ended() {
	k.mu.Lock()
	var failed []*renewal
	for _, q := range k.sent.pending {
		failed = append(failed, q...)
	}
	clear(k.sent.pending)
	k.check.Stop()
	k.checkAt = time.Time{}
	k.mu.Unlock()
	for _, r := range failed {
		r.res <- renewed{err: ErrStreamBroken}
	}
}

// checkStuck looks, when check fires, whether the open stream is stuck. If
// it is, the Keeper gives it up; otherwise it sets check to fire when the
// next request is due. It runs on a timer's goroutine, not on the stream's
// sender or receiver: either may be blocked on the stream for good (Send
// too, once the stream's flow control window is used up).
func (k *Keeper) checkStuck() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.checkAt = time.Time{}
	stuck, next := k.sent.stuck(time.Now())
	switch {
	case stuck:
		k.r.GiveUp()
	case !next.IsZero():
		k.checkAt = next
		k.check.Reset(time.Until(next))
	}
}

// stuck reports whether the stream of ks is stuck at now: a request on it
// has waited for its patience for an answer, and the stream has delivered
// nothing for as long. Otherwise it returns when the next request is due,
// or the zero time if none waits.
func (ks *keptStream) stuck(now time.Time) (stuck bool, next time.Time) {
	for _, q := range ks.pending {
		for _, r := range q {
			due := r.sent
			if ks.heard.After(due) {
				due = ks.heard
			}
			due = due.Add(r.patience)
			if !due.After(now) {
				return true, time.Time{}
			}
			if next.IsZero() || due.Before(next) {
				next = due
			}
		}
	}
	return false, next
}
