package etcdlock

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/streams"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Asking a holder to release. A request is a key of its own for each hold
// it is addressed to: ReleaseRequestPrefix + the hold's key, whose value
// is the hold's token (the key's create revision), bound to the hold
// key's lease. Outside every lock's queue (see ReleaseRequestPrefix), it
// never queues; naming the token, it reaches only the hold it was made
// for, never a later hold of the same session on the same key; bound to
// the lease, it goes with the holder's session.

// requestOps is the most holds one Txn of RequestRelease addresses: a
// comparison and a Put each, within etcd's default --max-txn-ops (128).
const requestOps = 64

// RequestRelease asks the holders of the lock called name to release it:
// every hold current when the request is made (the holder of a Mutex, a
// MultiMutex holding the name, an election's leader, every reader holding
// an RWMutex, every holder of a Semaphore's permits), and no later hold.
// Each holder learns it from ReleaseRequested, and decides: nothing is
// released by the request itself. It needs no Session.
//
// Who holds is what InspectLock shows. While a lock delay is pending
// (WithLockDelay), the waiter it keeps out holds nothing; and a
// MultiMutex first in the name's queue that still waits for another of
// its names holds nothing either (others wait behind it, but it has not
// begun). A request made then is for nobody: RequestRelease returns
// ErrNotHeld, and no request reaches the hold that begins later.
//
// Asking again while a hold lasts is the same request. RequestRelease
// returns nil once etcd has recorded the request for every hold current
// at one revision, ErrNotHeld when nothing holds the lock, ErrInvalidName
// for a name no lock can have, or etcd's error. It rides out errors that
// pass while ctx lasts, and reads the queue again when a holder leaves
// before the request is recorded.
//
// A holder that is not of this package (etcd's Mutex, `etcdctl lock`)
// never reads the request; it goes with its lease.
func RequestRelease(ctx context.Context, cli *clientv3.Client, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	backoff := minBackoff
	for changed := 0; ; {
		done, err := requestOnce(ctx, cli, name)
		switch {
		case err == nil && done:
			return nil
		case err == nil:
			// A holder left (or its lease ended), or readers or permits
			// joined the holders, before the request was recorded: the
			// holders are others now.
			if changed++; changed == 5 {
				return errorf("etcdlock: the holders of %s kept changing", name)
			}
			if !pause(ctx, &backoff) {
				return ctx.Err()
			}
			continue
		case refused(err):
			return requestRefusedErr(ctx, cli, name, err)
		case !transient(err):
			return err
		}
		if !pause(ctx, &backoff) {
			return errors.Join(ctx.Err(), err)
		}
	}
}

// requestOnce reads name's holders and records a request for each, in
// Txns guarded by each hold being current. It reports whether every
// request was recorded.
func requestOnce(ctx context.Context, cli *clientv3.Client, name string) (bool, error) {
	// Who holds, as InspectLock tells it: a waiter that a pending lock
	// delay keeps out holds nothing, and a request made now must not
	// reach the hold it will become. Not the leases, nor the requests
	// already made.
	q, err := readLock(ctx, cli, name, inspectOptions{})
	if err != nil {
		return false, err
	}
	holders := q.Holders()
	switch {
	case len(holders) == 0 && len(q.Keys) > 0 && q.Keys[0].WaitsFor != "":
		return false, errorf("%w: %s: first in line is a MultiMutex (%s) that still waits for %s", ErrNotHeld, name, q.Keys[0].Key, q.Keys[0].WaitsFor)
	case len(holders) == 0:
		return false, errorf("%w: %s", ErrNotHeld, name)
	}
	// Holders that share the lock (readers, permits) admit more holders
	// as keys join, with no holder leaving: then nothing under the prefix
	// may have changed since the read either. Exclusive holders admit no
	// one while they stay.
	var shared []clientv3.Cmp
	for _, h := range holders {
		if !h.Mode.Exclusive() {
			shared = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(name+"/"), "<", q.Revision+1).WithPrefix()}
			break
		}
	}
	asked := 0
	for len(holders) > 0 {
		n := min(len(holders), requestOps)
		cmps := slices.Clone(shared)
		var puts []clientv3.Op
		for _, h := range holders[:n] {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(h.Key), "=", h.Token))
			if h.Lease != 0 { // without a lease, never a hold of this package
				puts = append(puts, clientv3.OpPut(requestKey(h.Key), strconv.FormatInt(h.Token, 10), clientv3.WithLease(h.Lease)))
			}
		}
		holders = holders[n:]
		asked += len(puts)
		resp, err := cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			return false, nil // a holder's lease ended: read again
		case err != nil:
			return false, err
		case !resp.Succeeded:
			return false, nil
		}
	}
	if asked == 0 {
		return false, errorf("%w: %s is held only by keys without a lease, which no holder of this package reads", ErrNotHeld, name)
	}
	return true, nil
}

// A holdRequest is the watch of a hold's request keys that
// ReleaseRequested started: a goroutine per key, which ends with the
// hold's finishing (stop) or the session.
type holdRequest struct {
	ch     chan struct{} // closed when a request for the hold is seen
	once   sync.Once
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// ReleaseRequested returns a channel closed when the current hold is asked
// to release (RequestRelease). The first call of a hold starts watching
// for the request: a goroutine per key of the hold (a MultiMutex has
// several), which ends when the hold is released or lost and the release
// ended, or the session ends. When nothing is held, it returns the channel
// of the last hold, or nil (which never closes) if there was none.
func (q *queue) ReleaseRequested() <-chan struct{} {
	q.mu.Lock()
	defer q.mu.Unlock()
	h := q.recent()
	if h == nil {
		return nil
	}
	if h.req == nil {
		h.req = &holdRequest{ch: make(chan struct{})}
		if h.state < holdFinished {
			q.watchRequests(h)
		}
	}
	return h.req.ch
}

// watchRequests starts the goroutines that watch h's request keys, with
// q.mu held. They are the session watcher's (its busy group), so that the
// session's end waits for them.
func (q *queue) watchRequests(h *hold) {
	w := q.s.watcher
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return
	}
	ctx, cancel := context.WithCancel(q.s.watchCtx)
	h.req.cancel = cancel
	for _, p := range q.parts() {
		w.busy.Add(1)
		h.req.wg.Add(1)
		go func() {
			defer w.busy.Done()
			defer h.req.wg.Done()
			if q.s.awaitRequest(ctx, requestKey(p.key), h.rev) {
				h.req.once.Do(func() { close(h.req.ch) })
			}
		}()
	}
}

// stop stops the watch of a hold's request keys, if any, and waits for
// its goroutines.
func (r *holdRequest) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.wg.Wait()
}

// awaitRequest waits until key holds a request for the hold of token: a
// value that is the token. It reports false if ctx ends first, or at once
// when etcd refuses to let the session's user read the request (no read
// permission on ReleaseRequestPrefix + name + "/"): a watch made again
// would be refused again, for as long as the hold lasts.
//
// The watch starts "now", so that etcd counts it as synced and sends the
// request's event at once (a watch from an older revision waits for
// etcd's next resync pass, up to 100 ms: see watchTurn); once etcd has
// made it, one read of the key covers the time before. A watch that
// breaks is made again the same way.
func (s *Session) awaitRequest(ctx context.Context, key string, token int64) bool {
	want := strconv.FormatInt(token, 10)
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(streams.RequireLeader(ctx))
		for wr := range s.cli.Watch(wctx, key, clientv3.WithCreatedNotify(), clientv3.WithFilterDelete()) {
			if refused(wr.Err()) {
				cancel()
				return false // no read permission on the requests: none is seen
			}
			if wr.Canceled || wr.CompactRevision != 0 {
				break
			}
			if wr.Created {
				resp, err := s.cli.Get(wctx, key)
				if refused(err) {
					cancel()
					return false
				}
				if err != nil {
					break
				}
				if len(resp.Kvs) > 0 && string(resp.Kvs[0].Value) == want {
					cancel()
					return true
				}
				backoff = 50 * time.Millisecond
			}
			for _, ev := range wr.Events {
				if string(ev.Kv.Value) == want {
					cancel()
					return true
				}
			}
		}
		cancel()
		// The watch broke (a member without a leader, say), or its read
		// failed: watch again after a pause.
		if !pauseUpTo(ctx, &backoff, time.Second) {
			return false
		}
	}
	return false
}
