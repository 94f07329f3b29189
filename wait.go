package etcdlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Waiting for the turn: a waiter watches exactly its blockers and its own
// key, and reads the queue again when one of them goes.

// maxWatched is the most blockers a waiter watches one by one; with
// more it watches the whole prefix for deletions.
const maxWatched = 64

// A waiter is a key in line, me, waiting for its turn: the queue ahead of
// it as it last read it, and, while it watches, its watches. It carries
// what the steps of a wait share, so that each step (watchTurn, rewatch,
// waitDelete, recheck) reads it rather than being passed it. A waiter is
// used by one goroutine, the Lock's.
type waiter struct {
	q    *queue
	me   entry
	read queueRead // the queue ahead of me as last read: blockers and releasers at read.rev

	// While it watches (watchTurn): the watch of its own key, what its
	// watches tell it, the watches of its blockers (or of the prefix), and
	// the latest revision at which a watch opened since the last read was
	// made by etcd (0: none).
	own         *keyWatch
	ww          *waitWatch
	watches     []*blockerWatch
	watchedFrom int64
	// others watch the other keys of me's set (a MultiMutex waits for
	// its names one at a time): any of them gone ends the wait as own
	// does.
	others []*keyWatch
	// recorded says the Txn that admitted me wrote its delay record
	// (confirmRecord).
	recorded bool
}

// wait blocks until me's rule admits it, that is until this queue holds.
// w.read is the queue as me last read it, with blockers. It returns the
// header of the response that showed the hold was admitted.
//
// The waiter watches only its blockers, not the whole prefix: for a Mutex
// that is the key just ahead, so a release wakes exactly the next waiter,
// and a waiter that leaves the queue wakes only the one behind it, which
// then watches the key ahead of the leaver. The waiter also watches its own
// key, so that it learns within moments that its lease expired or was
// revoked, while its blockers still hold (etcd's Mutex only notices when
// every earlier key is gone: etcd issue 19597; its RWMutex recipe then even
// acquires without a key: etcd issue 16221).
func (w *waiter) wait(ctx context.Context) (*pb.ResponseHeader, error) {
	backoff := minBackoff
	for {
		started := time.Now()
		hdr, err := w.watchTurn(ctx)
		if !w.q.retryable(ctx, err) {
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
		if w.read, err = w.reread(ctx, &backoff); err != nil {
			return nil, err
		}
		if len(w.read.blockers) == 0 {
			return w.read.hdr, nil
		}
	}
}

// reread reads the queue ahead of me anew (check), after a pause of
// *backoff, as often as it takes while the errors pass (retryable).
func (w *waiter) reread(ctx context.Context, backoff *time.Duration) (queueRead, error) {
	for {
		if !pause(ctx, backoff) {
			return queueRead{}, ctx.Err()
		}
		read, err := w.check(ctx, 0)
		if err == nil || !w.q.retryable(ctx, err) {
			return read, err
		}
	}
}

// watched returns the keys a waiter with blockers watches: each blocker,
// or the prefix when they are more than maxWatched. A capacity far above
// the typical weight makes a Semaphore's window that wide; no scheme
// without extra writes can watch fewer keys (any of those holders' release
// admits the waiter), so it watches every deletion of the lock instead.
func (q *queue) watched(blockers []entry) []string {
	if len(blockers) > maxWatched {
		if strings.HasPrefix(blockers[0].key, LockDelayPrefix) {
			return []string{q.delayPfx()} // pending delays
		}
		return []string{q.prefix()}
	}
	keys := make([]string, len(blockers))
	for i, b := range blockers {
		keys[i] = b.key
	}
	return keys
}

// sameKeys reports whether a and b hold the same keys in the same order.
func sameKeys(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// watchTurn waits until me's rule admits it, starting from w.read, which
// has blockers. It returns the header of the response that showed me
// admitted, or errWatchBroken when a watch fails.
func (w *waiter) watchTurn(ctx context.Context) (*pb.ResponseHeader, error) {
	q := w.q
	// The waiter's own key and its blockers are watched on the session's
	// watch stream (see sessionWatcher), which requires a leader: a member cut
	// off from the leader ends the stream rather than leaving it silent
	// while the lock moves on elsewhere. The own key is watched from its
	// creation on: a deletion after me.rev is its end, and no read is
	// needed for the time before the watch.
	w.own, w.ww = q.s.watcher.watchOwn(q, w.me.rev, w.me.mode.Shared)
	w.others = q.s.watcher.watchSet(q, w.ww, w.me.rev)
	w.watches, w.watchedFrom = nil, 0
	defer w.stopWatches(ctx)
	for {
		// A pending lock delay that no waiter has started yet is
		// started by the first that finds it (delay.go).
		if len(w.read.delays) > 0 {
			if err := q.startDelays(ctx, w.read.delays); err != nil {
				return nil, err
			}
		}
		keys := q.watched(w.read.blockers)
		if err := w.rewatch(ctx, keys); err != nil {
			return nil, err
		}
		// The watches deliver events after the revision at which they were
		// created: they start "now", so the server counts them as synced
		// and sends events at once. A watch that started at read.rev+1 would
		// be unsynced as soon as the store moved on, and its events would
		// wait for the next resync pass, up to 100 ms later (etcd's
		// watchResyncPeriod): that is the handoff delay of etcd's Mutex.
		// Starting now leaves a gap, (read.rev, created]; one read closes
		// it, and only when the gap is not empty. A watch kept from before
		// has run since before read.rev: it leaves no gap.
		if w.watchedFrom > w.read.rev {
			next, err := w.check(ctx, w.watchedFrom)
			if err != nil || len(next.blockers) == 0 {
				return next.hdr, err
			}
			w.read = next
			if !sameKeys(q.watched(w.read.blockers), keys) {
				continue
			}
		}

		if hook := q.owner().testHookWait; hook != nil {
			hook(keys)
		}
		at, gone, err := w.waitDelete(ctx)
		if err != nil {
			return nil, err
		}
		next, err := w.recheck(ctx, gone, at)
		if err != nil || len(next.blockers) == 0 {
			return next.hdr, err
		}
		w.read, w.watchedFrom = next, 0
	}
}

// stopWatches stops every watch of the waiter: its blockers', its own key's
// and those of its set's other keys.
func (w *waiter) stopWatches(ctx context.Context) {
	lw := w.q.s.watcher
	lw.stopBlockers(w.watches)
	lw.stop(ctx, w.own)
	for _, kw := range w.others {
		lw.stop(ctx, kw)
	}
	w.own, w.ww, w.watches, w.others = nil, nil, nil, nil
}

// rewatch makes w.watches watch exactly keys (of w.read's blockers): it
// stops the watches of keys no longer wanted, opens the new ones together
// (a Semaphore's waiter can have several), waits until etcd has made them,
// and raises w.watchedFrom to the latest revision at which one was made.
func (w *waiter) rewatch(ctx context.Context, keys []string) error {
	q, lw, ww := w.q, w.q.s.watcher, w.ww
	var kept, stopped []*blockerWatch
	for _, b := range w.watches {
		if slices.Contains(keys, b.key()) {
			kept = append(kept, b)
		} else {
			stopped = append(stopped, b)
		}
	}
	lw.stopBlockers(stopped)
	w.watches = kept
	opened := len(w.watches)
	blockers := w.read.blockers
	for _, k := range keys {
		if slices.ContainsFunc(kept, func(b *blockerWatch) bool { return b.key() == k }) {
			continue
		}
		var mode KeyMode
		if i := slices.IndexFunc(blockers, func(e entry) bool { return e.key == k }); i >= 0 {
			mode = blockers[i].mode
		}
		w.watches = append(w.watches, lw.watchBlocker(q, ww, k, mode))
	}
	for {
		lw.mu.Lock()
		made := true
		for _, b := range w.watches[opened:] {
			made = made && b.created != 0
		}
		gone, broken, lost := ww.gone, ww.broken, ww.lost
		lw.mu.Unlock()
		switch {
		case gone:
			return lost.lostWhileWaiting(ctx)
		case broken:
			return q.watchErr(ctx)
		case made:
			lw.mu.Lock()
			for _, b := range w.watches[opened:] {
				w.watchedFrom = max(w.watchedFrom, b.created)
			}
			lw.mu.Unlock()
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ww.wake:
		}
	}
}

// waitDelete returns the revision of the first deletion of a blocker (or
// change of its mode) seen after w.read.rev, when all were seen alive, and
// the key deleted ("" for a change of mode). It returns lostWhileWaiting's
// error when the waiter's own key is gone.
func (w *waiter) waitDelete(ctx context.Context) (int64, string, error) {
	lw, ww := w.q.s.watcher, w.ww
	for {
		lw.mu.Lock()
		evs, gone, broken := ww.take()
		lost := ww.lost
		lw.mu.Unlock()
		if gone {
			return 0, "", lost.lostWhileWaiting(ctx)
		}
		for i, e := range evs {
			at, key, ok := w.blockerEvent(e)
			if ok {
				// The events after it stay for the next wait: the read
				// that follows may come from a member that has not
				// applied them yet.
				if rest := evs[i+1:]; len(rest) > 0 {
					lw.mu.Lock()
					ww.events = append(rest, ww.events...)
					lw.mu.Unlock()
				}
				return at, key, nil
			}
		}
		if broken {
			return 0, "", w.q.watchErr(ctx)
		}
		select {
		case <-ctx.Done():
			return 0, "", ctx.Err()
		case <-ww.wake:
		}
	}
}

// blockerEvent reports whether e, an event of a blocker's watch, may
// admit me: the deletion of a blocker (or, in a prefix watch, of a key
// ahead), at revision at, or a change of a blocker's mode (key ""),
// after w.read.rev.
func (w *waiter) blockerEvent(e watchedEvent) (at int64, key string, ok bool) {
	ev := e.ev
	// A deletion at or before read.rev is reflected in the read already:
	// an event of a watch kept from before that read.
	if ev.Kv.ModRevision <= w.read.rev {
		return 0, "", false
	}
	prefix := e.b.key() == w.q.prefix()
	if e.b.key() == w.q.delayPfx() {
		// Pending delays, more than maxWatched: one that ends may admit me.
		return ev.Kv.ModRevision, string(ev.Kv.Key), ev.Type == mvccpb.DELETE && isChild(e.b.key(), ev.Kv.Key)
	}
	if ev.Type == mvccpb.PUT {
		// Only a reader sees Puts: a Downgrade changes the mode;
		// WithMaxHold's re-binding and a holder's record do not.
		return ev.Kv.ModRevision, "", !prefix && ParseKeyMode(ev.Kv.Value) != e.b.mode
	}
	switch {
	case !prefix:
		return ev.Kv.ModRevision, e.b.key(), true
	case !w.q.isChild(ev.Kv.Key):
		return 0, "", false
	}
	// A key ahead went (or one we cannot tell: look).
	return ev.Kv.ModRevision, string(ev.Kv.Key), ev.PrevKv == nil || ev.PrevKv.CreateRevision < w.me.rev
}

// check reads, in one round trip, whether my key is still mine (same
// create revision) and what now keeps me out: the blockers, none when I am
// admitted.
//
// The answer must reflect the store at minRev or later (the deletion or
// watch creation that prompted the check), and nothing more: keys created
// later are behind mine, so a state at any revision from minRev on gives
// the same verdict as the newest. That lets a member answer from its own
// state (a serializable read, no round trip to the leader) whenever it has
// applied minRev; a member that lags is asked again linearizably. With
// minRev 0 the read is linearizable at once.
//
// It is not inlined, nor are confirm and readIfMine, so that their locals
// stay out of watchTurn's stack frame while the waiter waits (see place).
//
//go:noinline
func (w *waiter) check(ctx context.Context, minRev int64) (queueRead, error) {
	me := w.me
	resp, err := w.readIfMine(ctx, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return append([]clientv3.Op{checkQueue: w.q.opQueue(me.mode, me.rev-1, opts...)}, w.q.delayOps(opts...)...)
	})
	if err != nil {
		return queueRead{}, err
	}
	return w.q.scan(ctx, me, resp.Responses[checkQueue].GetResponseRange(), rangeAt(resp.Responses, checkDelays), resp.Header)
}

// The slots of a waiter's reads (check; confirm reads its own key's
// count in the first): what keeps it out, and, for a lock with a delay,
// the lock's delay records. A recording waiter's read adds the nested Txn
// that writes its record after them (readIfMine).
const (
	checkQueue = iota
	checkDelays
)

// recheck is check after the deletion of the blocker gone ("" for a
// change of mode) at revision at.
//
//go:noinline
func (w *waiter) recheck(ctx context.Context, gone string, at int64) (queueRead, error) {
	// Every key ahead was read, and the rule admits me behind them without
	// gone: I am in, as keys ahead only leave (new ones join behind) and
	// none changes its mode but by a Downgrade, which admits more. One
	// round trip then only checks that my key is still mine, and reads no
	// queue: readers admitted together by a writer's release each read
	// one key, not the queue.
	if gone != "" && slices.Contains(w.read.releasers, gone) {
		return w.confirm(ctx, at)
	}
	// Otherwise one round trip checks that my key is still mine and finds
	// what, if anything, keeps me out now.
	return w.check(ctx, at)
}

// confirm is check for a waiter known to be admitted by the queue if its
// key is still its own: one round trip reads that key's count and the
// lock's delay records, and no key ahead. Its read has no blockers, and
// the header of the response that showed the key is still its own. A
// delay record of a hold ahead may be pending (the key that went had
// one, and it went without Unlock) or a holder's still in place (a
// reader's): only a check of the queue tells, so confirm makes one.
//
//go:noinline
func (w *waiter) confirm(ctx context.Context, minRev int64) (queueRead, error) {
	q, me := w.q, w.me
	resp, err := w.readIfMine(ctx, minRev, func(opts ...clientv3.OpOption) []clientv3.Op {
		return append([]clientv3.Op{checkQueue: clientv3.OpGet(q.key, append(opts, clientv3.WithCountOnly())...)}, q.delayOps(opts...)...)
	})
	if err != nil {
		return queueRead{}, err
	}
	if delays := rangeAt(resp.Responses, checkDelays); delays != nil && len(q.pendingDelays(me, delays, func(key string, rev int64) bool {
		return key == q.key && rev != 0 && rev == me.rev
	})) > 0 {
		return w.check(ctx, resp.Header.Revision)
	}
	return queueRead{rev: resp.Header.Revision, hdr: resp.Header}, nil
}

// recording reports whether the waiter's reads also write its delay
// record when they find it admitted (readIfMine): an exclusive waiter
// (a Mutex's, an RWMutex writer's) with a lock delay. A reader or a
// Semaphore's waiter is admitted with holders ahead, which the Txn's
// guard cannot tell from waiters; it writes its record in a Txn of its
// own (writeDelay).
func (w *waiter) recording() bool {
	q := w.q
	return q.opts.records && w.me.mode.Exclusive() // (a set takes no delay: validate)
}

// opRecord is the nested Txn of a recording waiter's reads: it writes
// the waiter's delay record only if nothing older than its key is under
// the prefix (it is first in line: admitted) and no delay record is
// there (none can be pending). etcd evaluates every compare of a Txn,
// nested ones included, before its writes. It saves the record its own
// RPC on every handoff; keys of nested locks older than the waiter's make
// it fail, and the waiter then writes the record in a Txn of its own.
func (w *waiter) opRecord() clientv3.Op {
	q := w.q
	return clientv3.OpTxn(
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(q.prefix()), ">", w.me.rev-1).WithPrefix(),
			clientv3.Compare(clientv3.CreateRevision(q.delayPfx()), "=", 0).WithPrefix(),
		},
		[]clientv3.Op{clientv3.OpPut(delayKey(q.key), q.recordValue(w.me.rev))}, nil)
}

// readIfMine runs ops (ranges, given extra options) in a Txn that succeeds
// only while my key is still mine, as of minRev or later (see check). It
// returns lostWhileWaiting's error when the key is gone.
//
//go:noinline
func (w *waiter) readIfMine(ctx context.Context, minRev int64, ops func(...clientv3.OpOption) []clientv3.Op) (*clientv3.TxnResponse, error) {
	q := w.q
	// Every key of the claim must still be mine: a name of a set admitted
	// earlier stays admitted only while its key does. If one is gone, the
	// keys read (a set's; none for one key) say which.
	cmps, orElse := q.ownCmps(w.me.rev), q.set.keyReads()
	if w.recording() {
		// A write: no member answers it alone, so no serializable try.
		read := ops()
		r, err := q.s.cli.Txn(ctx).If(cmps...).Then(append(read, w.opRecord())...).Commit()
		if err != nil {
			return nil, q.rpcErr(err)
		}
		if !r.Succeeded {
			return nil, q.lostWhileWaiting(ctx)
		}
		w.recorded = r.Responses[len(read)].GetResponseTxn().Succeeded
		return r, nil
	}
	var resp *clientv3.TxnResponse
	if minRev > 0 {
		// etcd serves a Txn as a read of the member's own state only if
		// every range in it, the Else's too, is serializable.
		serial := q.set.keyReads(clientv3.WithSerializable())
		r, err := q.s.cli.Txn(ctx).If(cmps...).Then(ops(clientv3.WithSerializable())...).Else(serial...).Commit()
		if err != nil {
			return nil, q.rpcErr(err)
		}
		if r.Header.Revision >= minRev {
			resp = r
		}
	}
	if resp == nil {
		r, err := q.s.cli.Txn(ctx).If(cmps...).Then(ops()...).Else(orElse...).Commit()
		if err != nil {
			return nil, q.rpcErr(err)
		}
		resp = r
	}
	if !resp.Succeeded {
		return nil, q.set.goneKey(q, w.me.rev, resp).lostWhileWaiting(ctx)
	}
	return resp, nil
}

// errWatchBroken says a watch ended without the event it waited for: the
// stream broke, the member lost its leader, or a resumed watch hit a
// compacted revision. The waiter reads the queue again and re-watches.
var errWatchBroken = errors.New("etcdlock: watch broken")

// watchErr explains why a blocker's watch ended without its event: the
// caller's ctx, the session's end, or a broken watch.
func (q *queue) watchErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := q.s.Err(); err != nil {
		return err
	}
	return errWatchBroken
}

// lostWhileWaiting says why a waiter's key disappeared: ErrSessionExpired if
// the session's lease is gone (and the session ends with it), else
// ErrLockLost: someone deleted the key.
func (q *queue) lostWhileWaiting(ctx context.Context) error {
	if err := q.s.Err(); err != nil {
		return err
	}
	cause := q.whyKeyGone(ctx, 0)
	if errors.Is(cause, ErrSessionExpired) {
		return cause
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errorf("%w while waiting: %w", ErrLockLost, cause)
}
