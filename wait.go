package etcdlock

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errWatchBroken says a watch ended without the event it waited for: the
// stream broke, the member lost its leader, or a resumed watch hit a
// compacted revision. The waiter reads the queue again and re-watches.
var errWatchBroken = errors.New("etcdlock: watch broken")

// wait blocks until no key of the lock older than rev is left, that is until
// this Mutex holds the lock. pred is the key just ahead, seen at readRev.
// It returns the header of the response that showed the lock was ours.
//
// The waiter watches only its predecessor, not the whole prefix: a release
// wakes exactly the next waiter, and a waiter that leaves the queue wakes
// only the one behind it, which then watches the key ahead of the leaver.
// The waiter also watches its own key, so that it learns within moments
// that its lease expired or was revoked, while its predecessor still holds
// (etcd's Mutex only notices when every earlier key is gone: etcd issue
// 19597).
func (m *Mutex) wait(ctx context.Context, rev int64, pred string, readRev int64) (*pb.ResponseHeader, error) {
	const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second
	backoff := minBackoff
	for {
		started := time.Now()
		hdr, err := m.watchTurn(ctx, rev, pred, readRev)
		if !m.retryable(ctx, err) {
			return hdr, err
		}
		if time.Since(started) > maxBackoff {
			backoff = minBackoff
		}
		// A broken watch may have missed the event it waited for, and a
		// leader election fails reads for a moment: read the queue again,
		// as often as it takes, before watching again. Back off so that a
		// member without a leader is not asked in a tight loop. The queue
		// keeps our place meanwhile: only ctx or the session's end make
		// the waiter give it up.
		for {
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			backoff = min(2*backoff, maxBackoff)
			hdr, pred, err = m.check(ctx, rev, 0)
			if err == nil {
				break
			}
			if !m.retryable(ctx, err) {
				return nil, err
			}
		}
		if pred == "" {
			return hdr, nil
		}
		readRev = hdr.Revision
	}
}

// retryable reports whether a waiter may try again after err: a broken
// watch, or an etcd error that passes (no leader, leader changed, a
// timeout inside etcd, a member out of reach), while ctx and the session
// last.
func (m *Mutex) retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || m.s.Err() != nil {
		return false
	}
	if errors.Is(err, errWatchBroken) {
		return true
	}
	// "Not capable": a member that has just started and does not yet know
	// the cluster's version.
	if errors.Is(err, rpctypes.ErrNotCapable) {
		return true
	}
	// etcd's passing errors (no leader, leader changed, its own request
	// timeouts, too many requests) carry these codes; judging by the code
	// rather than a list keeps errors of newer etcd releases covered.
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	return false
}

// watchTurn waits for the predecessors of the key created at rev to go,
// starting from pred seen at readRev. It returns errWatchBroken when a
// watch fails.
func (m *Mutex) watchTurn(ctx context.Context, rev int64, pred string, readRev int64) (*pb.ResponseHeader, error) {
	// WithRequireLeader: a member cut off from the leader cancels the watch
	// rather than leaving it silent while the lock moves on elsewhere.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()

	own, ownRev, err := m.openWatch(wctx, m.key)
	if err != nil {
		return nil, err
	}
	watchedFrom := ownRev
	for {
		pctx, pcancel := context.WithCancel(wctx)
		predCh, predRev, err := m.openWatch(pctx, pred)
		if err != nil {
			pcancel()
			return nil, err
		}
		// The watches deliver events after the revision at which they were
		// created: they start "now", so the server counts them as synced
		// and sends events at once. A watch that started at readRev+1 would
		// be unsynced as soon as the store moved on, and its events would
		// wait for the next resync pass, up to 100 ms later (etcd's
		// watchResyncPeriod): that is the handoff delay of etcd's Mutex.
		// Starting now leaves a gap, (readRev, created]; one read closes it,
		// and only when the gap is not empty.
		watchedFrom = max(watchedFrom, predRev)
		if watchedFrom > readRev {
			hdr, next, err := m.check(ctx, rev, watchedFrom)
			if err != nil || next == "" {
				pcancel()
				return hdr, err
			}
			readRev = hdr.Revision
			if next != pred {
				pcancel()
				pred = next
				continue
			}
		}

		if m.testHookWait != nil {
			m.testHookWait(pred)
		}
		deleted, at, err := m.waitDelete(ctx, own, predCh, readRev)
		pcancel()
		if err != nil {
			return nil, err
		}
		if deleted == m.key {
			return nil, m.lostWhileWaiting(ctx)
		}
		// The predecessor is gone (released, expired, or left the queue).
		// One round trip checks that our key is still ours and finds who,
		// if anyone, is now ahead.
		hdr, next, err := m.check(ctx, rev, at)
		if err != nil || next == "" {
			return hdr, err
		}
		pred, readRev, watchedFrom = next, hdr.Revision, 0
	}
}

// openWatch watches key for deletions from the current revision on and
// returns the watch and the revision at which it was created. Like every
// wait of a Mutex, it relies on ctx being bound to the session
// (Session.bound): the watch channel closes when ctx ends.
func (m *Mutex) openWatch(ctx context.Context, key string) (clientv3.WatchChan, int64, error) {
	ch := m.s.cli.Watch(ctx, key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	wr, ok := <-ch
	if !ok || wr.Err() != nil || !wr.Created {
		return nil, 0, m.watchErr(ctx, wr)
	}
	return ch, wr.Header.Revision, nil
}

// waitDelete returns the key and revision of the first deletion seen on own
// or pred after readRev, when both keys were seen alive.
func (m *Mutex) waitDelete(ctx context.Context, own, pred clientv3.WatchChan, readRev int64) (string, int64, error) {
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-own:
		case wr, ok = <-pred:
		case <-ctx.Done():
			return "", 0, ctx.Err()
		}
		if !ok || wr.Err() != nil {
			return "", 0, m.watchErr(ctx, wr)
		}
		for _, ev := range wr.Events {
			// A watch from "now" starts at the serving member's revision,
			// which may lag behind readRev: a deletion at or before readRev
			// is of an earlier key of the same name, replayed.
			if ev.Type == mvccpb.DELETE && ev.Kv.ModRevision > readRev {
				return string(ev.Kv.Key), ev.Kv.ModRevision, nil
			}
		}
	}
}

// watchErr explains why a watch ended: the caller's ctx, or a broken watch.
func (m *Mutex) watchErr(ctx context.Context, wr clientv3.WatchResponse) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return errorf("%w: %w", errWatchBroken, wr.Err())
}

// check reads, in one round trip, whether the key created at rev is still
// ours and which key, if any, is now just ahead of it ("" when none: the
// lock is ours).
//
// The answer must reflect the store at minRev or later (the deletion or
// watch creation that prompted the check), and nothing more: keys created
// later are behind ours, so a state at any revision from minRev on gives
// the same verdict as the newest. That lets a member answer from its own
// state (a serializable read, no round trip to the leader) whenever it has
// applied minRev; a member that lags is asked again linearizably. With
// minRev 0 the read is linearizable at once.
func (m *Mutex) check(ctx context.Context, rev, minRev int64) (*pb.ResponseHeader, string, error) {
	cmp := clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)
	var resp *clientv3.TxnResponse
	if minRev > 0 {
		r, err := m.s.cli.Txn(ctx).If(cmp).Then(m.opQueue(rev-1, clientv3.WithSerializable())).Commit()
		if err != nil {
			return nil, "", m.rpcErr(err)
		}
		if r.Header.Revision >= minRev {
			resp = r
		}
	}
	if resp == nil {
		r, err := m.s.cli.Txn(ctx).If(cmp).Then(m.opQueue(rev - 1)).Commit()
		if err != nil {
			return nil, "", m.rpcErr(err)
		}
		resp = r
	}
	if !resp.Succeeded {
		return nil, "", m.lostWhileWaiting(ctx)
	}
	pred, hdr, err := m.predecessor(ctx, rev, resp.Responses[0].GetResponseRange(), resp.Header)
	return hdr, pred, err
}

// lostWhileWaiting says why a waiter's key disappeared: ErrSessionExpired if
// the session's lease is gone (and the session ends with it), else
// ErrLockLost: someone deleted the key.
func (m *Mutex) lostWhileWaiting(ctx context.Context) error {
	if err := m.s.Err(); err != nil {
		return err
	}
	cause := m.keyGone(ctx, 0)
	if errors.Is(cause, ErrSessionExpired) {
		return cause
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errorf("%w while waiting: %w", ErrLockLost, cause)
}

// keyGone says why this Mutex's key is gone, asking etcd whether the lease
// it was bound to still exists: the session's lease, or maxLease when not
// 0. If the session's lease is gone, the session ends now (rather than at
// its next renewal) and its error is returned: "lease ... was revoked or
// expired". Else the key was deleted. It costs one RPC, on the loss path
// only.
func (m *Mutex) keyGone(ctx context.Context, maxLease clientv3.LeaseID) error {
	lease := m.s.Lease()
	if maxLease != 0 {
		lease = maxLease
	}
	resp, err := m.s.cli.TimeToLive(ctx, lease)
	switch {
	case err != nil:
		return errorf("key %s is gone (lease check failed: %v)", m.key, err)
	case resp.TTL >= 0: // 0 is a live lease with under 1s left
		return errorf("key %s was deleted", m.key)
	case maxLease != 0:
		return errorf("max hold lease %x was revoked or expired", maxLease)
	}
	m.s.lost()
	return m.s.Err()
}
