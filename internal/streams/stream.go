// Package streams runs the gRPC streams a client's sessions share: one
// LeaseKeepAlive stream for their renewals (Keeper) and one Watch stream
// for their watches (Watches), both on a Runner; and the gRPC details the
// lock package needs (RequireLeader, TransientCode). It knows streams,
// leases, keys and revisions, and nothing of locks: the lock package
// adapts to it, as etcd's concurrency package uses the client's own
// streams.
package streams

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The sessions of one client share two gRPC streams to etcd: one
// LeaseKeepAlive stream for their renewals (Keeper) and one Watch stream
// for their key watches (Watches). On etcd a stream costs goroutines
// and memory for as long as it is open, and under auth opening one costs
// an Authenticate call too; a stream per session would make etcd pay for
// every session. Both run on a Runner, which knows streams and
// nothing of what they carry; each user keeps only its own bookkeeping
// (the renewals in flight; the watch registry).

// A Shared holds one T per client that has sessions: the first
// session makes it, the last one stops it.
type Shared[T any] struct {
	mu sync.Mutex
	m  map[*clientv3.Client]*sharedRef[T]
}

type sharedRef[T any] struct {
	v    T
	refs int
}

// acquire returns cli's T, made with make if cli has none. The caller must
// call release once when done with it.
func (c *Shared[T]) Acquire(cli *clientv3.Client, make func() T) T {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.m[cli]; r != nil {
		r.refs++
		return r.v
	}
	if c.m == nil {
		c.m = map[*clientv3.Client]*sharedRef[T]{}
	}
	r := &sharedRef[T]{v: make(), refs: 1}
	c.m[cli] = r
	return r.v
}

// release gives back cli's T, and reports whether it was the last
// reference: then the caller stops it, and a session that starts from now
// on gets a new one.
func (c *Shared[T]) Release(cli *clientv3.Client) (last bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.m[cli]
	r.refs--
	if r.refs > 0 {
		return false
	}
	delete(c.m, cli)
	return true
}

// A Bidi is a gRPC bidirectional stream: LeaseKeepAlive's or Watch's.
type Bidi[Req, Resp any] interface {
	Send(Req) error
	Recv() (Resp, error)
}

// A User is what a Runner carries on its streams. The methods
// marked "with mu held" are called with the runner's mu, which is the
// user's own lock.
type User[Req, Resp any] interface {
	// open opens a stream, which ends with ctx.
	Open(ctx context.Context) (Bidi[Req, Resp], error)
	// next returns, with mu held, the next request to send on the open
	// stream, if any.
	Next() (Req, bool)
	// receive handles an answer that came on the open stream. It reports
	// false if the stream must be given up.
	Receive(resp Resp) bool
	// ended is called once the open stream has ended and its sender and
	// receiver have returned: what was sent on it and not answered is the
	// user's to fail or send again.
	Ended()
	// waiting reports, with mu held, whether there are requests to send.
	Waiting() bool
	// idle reports, with mu held, whether there is nothing to carry: a
	// runner with an idle timeout then closes its stream after it.
	Idle() bool
}

// A Runner runs one user's stream: it opens one when there is a
// request to send, sends the requests next gives it, in order, hands the
// answers to receive, and when the stream breaks, or its user gives it up
// (giveUp), waits a little (25ms, doubling to 1s while streams answer
// nothing) and opens the next.
//
// Its goroutines, one that opens streams and two while a stream is open
// (one sends, one receives), all end when ctx ends (stop waits for them),
// and also when the runner has been idle after a stream ended.
type Runner[Req, Resp any] struct {
	user User[Req, Resp]
	mu   *sync.Mutex     // the user's lock; guards the fields below and each openStream's sending
	ctx  context.Context // ends when the runner must stop
	// Batch is how long the sender lets requests gather, after it was
	// woken, before it sends them; 0: at once.
	Batch time.Duration
	// IdleAfter is how long an open stream stays open while the user is
	// idle; 0: for as long as the runner runs.
	IdleAfter time.Duration
	wake      chan struct{} // there are requests to send; capacity 1

	running bool          // run is running
	done    chan struct{} // closed when the last run started has returned
	cur     *openStream   // the open stream, or nil
}

// An openStream is one stream of a runner.
type openStream struct {
	cancel  context.CancelFunc
	sending bool // its sender may send; guarded by the runner's mu
}

func NewRunner[Req, Resp any](ctx context.Context, mu *sync.Mutex, user User[Req, Resp]) *Runner[Req, Resp] {
	return &Runner[Req, Resp]{user: user, mu: mu, ctx: ctx, wake: make(chan struct{}, 1)}
}

// start starts the runner if it is not running, with mu held.
func (r *Runner[Req, Resp]) Start() {
	if r.running || r.ctx.Err() != nil {
		return
	}
	r.running = true
	r.done = make(chan struct{})
	go r.run(r.done)
}

// signal wakes the runner, or its open stream's sender: there are
// requests to send.
func (r *Runner[Req, Resp]) Signal() {
	select {
	case r.wake <- struct{}{}:
	default: // woken already
	}
}

// sending reports, with mu held, whether a stream is open and sending.
func (r *Runner[Req, Resp]) Sending() bool {
	return r.cur != nil && r.cur.sending
}

// stop waits until the runner's goroutines have returned. Its ctx has
// ended.
func (r *Runner[Req, Resp]) Stop() {
	r.mu.Lock()
	running, done := r.running, r.done
	r.mu.Unlock()
	if running {
		<-done
	}
}

// giveUp gives up the open stream, if any, with mu held: its user has
// judged it stuck. It ends as if it had broken, and the next one opens
// after the backoff.
func (r *Runner[Req, Resp]) GiveUp() {
	if r.cur != nil {
		r.cur.sending = false
		r.cur.cancel()
	}
}

// run opens a stream when there is a request to send, serves it until it
// breaks, and waits a little before the next one, until ctx ends or, with
// an idle timeout, the user is idle once a stream has ended (start starts
// it again).
func (r *Runner[Req, Resp]) run(done chan struct{}) {
	defer close(done)
	backoff := MinBackoff
	for r.ctx.Err() == nil {
		select {
		case <-r.ctx.Done():
			continue
		case <-r.wake:
		}
		if r.serve() {
			backoff = MinBackoff
		}
		t := time.NewTimer(backoff)
		select {
		case <-r.ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, MaxBackoff)
		r.mu.Lock()
		if r.IdleAfter > 0 && r.user.Idle() && r.ctx.Err() == nil {
			// Nothing to carry: a client that no longer uses the stream
			// costs neither a goroutine nor a stream.
			r.running = false
			r.mu.Unlock()
			return
		}
		left := r.user.Waiting()
		r.mu.Unlock()
		if left {
			r.Signal() // the requests not sent go on the next stream
		}
	}
}

// serve opens a stream and serves it until it ends. It reports whether
// an answer came on it. What was sent on it and not answered is the
// user's (ended).
func (r *Runner[Req, Resp]) serve() (answered bool) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	s, err := r.user.Open(ctx)
	if err != nil {
		return false
	}
	st := &openStream{cancel: cancel, sending: true}
	r.mu.Lock()
	r.cur = st
	r.mu.Unlock()
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		r.send(ctx, st, s)
		cancel() // a failed send breaks the stream: Recv returns too
	}()
	for {
		resp, err := s.Recv()
		if err != nil {
			break
		}
		answered = true
		if !r.user.Receive(resp) {
			break
		}
	}
	r.mu.Lock()
	st.sending = false // from now on the sender sends nothing
	r.cur = nil
	r.mu.Unlock()
	cancel()
	<-sendDone
	r.user.Ended()
	return answered
}

// send sends the requests next gives it on st, in order, until ctx ends, a
// send fails, st ends, or the user has been idle for IdleAfter.
func (r *Runner[Req, Resp]) send(ctx context.Context, st *openStream, s Bidi[Req, Resp]) {
	for {
		for {
			r.mu.Lock()
			if !st.sending {
				r.mu.Unlock()
				return
			}
			req, ok := r.user.Next()
			r.mu.Unlock()
			if !ok {
				break
			}
			if err := s.Send(req); err != nil {
				return
			}
		}
		if !r.await(ctx) {
			return
		}
		if r.Batch > 0 {
			t := time.NewTimer(r.Batch)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// await waits, for the sender, until there may be requests to send. It
// reports false when the sender must stop: ctx ended, or the user has been
// idle for IdleAfter (the stream then closes).
func (r *Runner[Req, Resp]) await(ctx context.Context) bool {
	var idleC <-chan time.Time
	r.mu.Lock()
	if r.IdleAfter > 0 && r.user.Idle() {
		idle := time.NewTimer(r.IdleAfter)
		defer idle.Stop()
		idleC = idle.C
	}
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		return false
	case <-r.wake:
		return true
	case <-idleC:
		r.mu.Lock()
		defer r.mu.Unlock()
		return !r.user.Idle()
	}
}
