package etcdlock

import (
	"context"
	"errors"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A write handed off: a Try whose ctx ends before its write's answer
// returns, and the session finishes the write's work.

// handedOff is the error of a write whose caller's ctx ended before its
// answer came (writeOrHandOff): ctx's error, as the caller sees it. The
// session finishes what the write may have done.
type handedOff struct{ err error }

func (e *handedOff) Error() string { return e.err.Error() }
func (e *handedOff) Unwrap() error { return e.err }

// isHandedOff reports whether err is a write's that was handed off.
func isHandedOff(err error) bool {
	var off *handedOff
	return errors.As(err, &off)
}

// writeOrHandOff sends a write whose outcome must be known (send, given a
// writeCtx) and returns its answer. If ctx ends first, it returns at once
// with ctx's error, a *handedOff, and a goroutine of the session waits for
// the answer and runs after with it: the caller's deadline bounds the
// call, and what the write may have done is undone as soon as etcd
// answers, or goes with the lease. With a ctx that never ends, or once the
// session shuts down, it waits for the answer itself.
func (q *queue) writeOrHandOff(ctx context.Context, send func(context.Context) (*clientv3.TxnResponse, error), after func(*clientv3.TxnResponse, error)) (*clientv3.TxnResponse, error) {
	wctx, cancel := q.writeCtx(ctx)
	if ctx.Done() == nil {
		defer cancel()
		return send(wctx)
	}
	var (
		mu       sync.Mutex // guards the fields below
		answered bool
		left     bool // the caller returned: after takes the answer
		resp     *clientv3.TxnResponse
		err      error
	)
	ready := make(chan struct{})
	if !q.s.spawn(func() {
		r, e := send(wctx)
		cancel()
		mu.Lock()
		if left {
			mu.Unlock()
			after(r, e)
			return
		}
		resp, err, answered = r, e, true
		mu.Unlock()
		close(ready)
	}) {
		defer cancel()
		return send(wctx)
	}
	select {
	case <-ready:
		return resp, err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	if answered {
		return resp, err
	}
	left = true
	return nil, &handedOff{ctx.Err()}
}
