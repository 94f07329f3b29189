package etcdlock

import (
	"context"
	"errors"
	"slices"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/internal/tuning"
)

// The session's release batcher: when many of a session's locks are
// released at once, their Txns go to etcd together. It knows Txns, not
// holds.

// releasesInFlight is how many of a session's releases go to etcd at once
// each in a Txn of its own. A release made while that many are in flight
// goes in a batch: one Txn that carries it with every other release made
// meanwhile, sent at once when no batch is in flight, else as soon as the
// one in flight answers. etcd's work per request (the RPC, the raft
// entry, the apply) is then paid once for them all. Below the bound a
// release waits for nothing, so an Unlock alone, or a few at once, is
// unchanged: with two or four goroutines unlocking at once, batches gain
// nothing and their wait costs (measured: docs/performance.md).
const releasesInFlight = 4

// maxBatch bounds the releases in one batch: etcd refuses a Txn with more
// operations than its --max-txn-ops (128 by default) in one list. When
// etcd refuses a batch as too large anyway, the session's bound halves.
const maxBatch = 64

// errBatchRefused tells a release that etcd refused its batch for a
// reason that may be another release's (a permission, the batch's size):
// it is sent again alone, and gets its own answer.
var errBatchRefused = errors.New("etcdlock: the batch was refused")

// A batcher sends a session's releases: each alone while few are in
// flight, and the rest in batches, one batch in flight at a time, from a
// goroutine (the flusher) that runs while any wait and ends with the
// session. A release
// in a batch is the Txn it would have been alone, nested in the batch's
// Then: its compares guard its own operations only, so one release that
// finds its key gone (Else) does not stop the others. All of a batch's
// releases are applied at one revision, or none is. It is safe for
// concurrent use.
type batcher struct {
	cli *clientv3.Client
	end context.Context // the session's end: a batch's RPC ends with it

	mu       sync.Mutex // guards the fields below
	inFlight int        // releases alone in flight
	limit    int        // releasesInFlight (0 in tests: every release in a batch)
	max      int        // releases in a batch at most: maxBatch, or less once etcd refused one as too large
	queue    []*batched // waiting for the flusher
	flushing bool       // the flusher runs
	closed   bool       // the session has ended and waited for the flusher: no batch more
	done     chan struct{}
}

// A batched is one release waiting for, or in, a batch.
type batched struct {
	op   clientv3.Op   // the release's Txn, nested
	done chan struct{} // closed when resp and err are set
	resp *clientv3.TxnResponse
	err  error
	in   *batch // its batch once sent; guarded by batcher.mu
}

// A batch is the RPC of batched releases.
type batch struct {
	cancel context.CancelFunc
	n      int // releases in it
	left   int // those whose callers gave up waiting; guarded by batcher.mu
}

// newBatcher returns the batcher of a session made with ctx (NewSession's,
// which may carry a benchmark's setting: tuning.WithReleasesInFlight); its
// end is set once the session's is made.
func newBatcher(ctx context.Context, cli *clientv3.Client) *batcher {
	return &batcher{cli: cli, limit: tuning.ReleasesInFlight(ctx, releasesInFlight), max: maxBatch}
}

// txn sends the Txn if cmps then else els, alone or in a batch, and
// returns its answer as if it went alone: the same Succeeded and
// Responses, and the batch's header. An error leaves its outcome unknown,
// as any RPC's: the release sends it again. If ctx ends while it waits
// for a batch, it returns ctx's error; the batch goes on without it, or,
// not yet sent, leaves it out.
func (b *batcher) txn(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	b.mu.Lock()
	if b.inFlight < b.limit && len(b.queue) == 0 || b.closed {
		b.inFlight++
		b.mu.Unlock()
		defer b.answered()
		return b.alone(ctx, cmps, then, els)
	}
	r := &batched{op: clientv3.OpTxn(cmps, then, els), done: make(chan struct{})}
	b.queue = append(b.queue, r)
	if !b.flushing {
		b.flushing = true
		b.done = make(chan struct{})
		go b.flush(b.done)
	}
	b.mu.Unlock()
	select {
	case <-r.done:
	case <-ctx.Done():
		b.leave(r)
		return nil, ctx.Err()
	}
	if r.err == errBatchRefused {
		return b.alone(ctx, cmps, then, els)
	}
	return r.resp, r.err
}

// alone sends the Txn as a request of its own.
func (b *batcher) alone(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	return b.cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
}

// answered ends a release sent alone.
func (b *batcher) answered() {
	b.mu.Lock()
	b.inFlight--
	b.mu.Unlock()
}

// leave takes r out of the queue, or counts it out of its batch, whose
// RPC is cancelled once every release in it has been given up.
func (b *batcher) leave(r *batched) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.in == nil {
		if i := slices.Index(b.queue, r); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		return
	}
	r.in.left++
	if r.in.left == r.in.n {
		r.in.cancel()
	}
}

// flush sends the waiting releases, a batch at a time, until none waits.
func (b *batcher) flush(done chan struct{}) {
	defer close(done)
	for {
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		if n == 0 {
			b.flushing = false
			b.mu.Unlock()
			return
		}
		rs := slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		ctx, cancel := context.WithCancel(b.end)
		in := &batch{cancel: cancel, n: n}
		for _, r := range rs {
			r.in = in
		}
		b.mu.Unlock()
		b.send(ctx, rs)
		cancel()
	}
}

// send sends rs in one Txn and gives each its answer.
func (b *batcher) send(ctx context.Context, rs []*batched) {
	ops := make([]clientv3.Op, len(rs))
	for i, r := range rs {
		ops[i] = r.op
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	switch {
	case err == nil:
		for i, r := range rs {
			r.resp, r.err = nested(resp, i)
		}
	case transient(err) || ctx.Err() != nil:
		// Its outcome is unknown, as a release's alone would be: each
		// sends it again.
		for _, r := range rs {
			r.err = err
		}
	default:
		// Refused, for a reason that may be one release's: each goes
		// alone, and gets its own answer.
		if errors.Is(err, rpctypes.ErrGRPCTooManyOps) || errors.Is(err, rpctypes.ErrTooManyOps) ||
			errors.Is(err, rpctypes.ErrGRPCRequestTooLarge) || errors.Is(err, rpctypes.ErrRequestTooLarge) {
			b.mu.Lock()
			b.max = max(1, len(rs)/2)
			b.mu.Unlock()
		}
		for _, r := range rs {
			r.err = errBatchRefused
		}
	}
	for _, r := range rs {
		close(r.done)
	}
}

// nested returns the answer of the i-th Txn of a batch, as its own.
func nested(resp *clientv3.TxnResponse, i int) (*clientv3.TxnResponse, error) {
	if i >= len(resp.Responses) || resp.Responses[i].GetResponseTxn() == nil {
		return nil, errBatchRefused // not etcd's answer to a batch: ask alone
	}
	t := resp.Responses[i].GetResponseTxn()
	return (*clientv3.TxnResponse)(&pb.TxnResponse{Header: resp.Header, Succeeded: t.Succeeded, Responses: t.Responses}), nil
}

// wait waits until the flusher has returned, once the session has ended:
// the batch in flight ends with it. Releases sent later go alone.
func (b *batcher) wait() {
	b.mu.Lock()
	b.closed = true
	flushing, done := b.flushing, b.done
	b.mu.Unlock()
	if flushing {
		<-done
	}
}
