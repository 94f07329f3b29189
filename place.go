package etcdlock

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Placing a key in the queue, and waiting for its turn (acquire; for a
// MultiMutex, acquireSet: every key in one Txn), and removing the keys
// after a failed Lock. A write that places a key must not be given up
// while its outcome is unknown (writeCtx): a key left behind would block
// the queue for as long as the session lives.

func (oneKey) acquire(ctx context.Context, q *queue, mode KeyMode, val string) (admission, error) {
	return q.acquire(ctx, mode, val)
}

// A set's claim takes every key in one Txn (acquireSet), and writes no
// delay record (a set takes no delay: validate).
func (set *multiSet) acquire(ctx context.Context, q *queue, _ KeyMode, val string) (admission, error) {
	return q.acquireSet(ctx, val)
}

// acquire joins the queue in mode and waits for its turn. On failure it
// leaves no key (fail).
func (q *queue) acquire(ctx context.Context, mode KeyMode, val string) (admission, error) {
	p, err := q.placeKey(ctx, mode, val)
	if err != nil {
		return admission{}, err
	}
	rev := p.rev
	if err := ctx.Err(); err != nil {
		return admission{}, q.fail(ctx, rev, err)
	}
	w := waiter{q: q, me: entry{key: q.key, rev: rev, mode: mode}}
	w.read, err = q.scan(ctx, w.me, p.page, p.delays, p.hdr)
	if q.retryable(ctx, err) {
		// A later page met a leader election, or a compaction of the
		// revision it was to be read at: read the queue anew, as a
		// waiter does.
		backoff := minBackoff
		w.read, err = w.reread(ctx, &backoff)
	}
	if err != nil {
		return admission{}, q.fail(ctx, rev, err)
	}
	hdr := w.read.hdr
	if len(w.read.blockers) > 0 {
		if hdr, err = w.wait(ctx); err != nil {
			return admission{}, q.fail(ctx, rev, err)
		}
	}
	// "Acquired after we were cancelled: pretend we didn't" (x/sync).
	if err := ctx.Err(); err != nil {
		return admission{}, q.fail(ctx, rev, err)
	}
	return admission{rev: rev, hdr: hdr, recorded: p.recorded || w.recorded}, nil
}

// A placement is what the Txn that placed a key showed: the key's create
// revision, the first page of the queue and the lock's delay records read
// after the put, the header of its answer, and whether it also wrote the
// hold's delay record (see place).
type placement struct {
	rev      int64
	page     *pb.RangeResponse
	delays   *pb.RangeResponse // nil for a lock without a delay
	hdr      *pb.ResponseHeader
	recorded bool
}

// placeKey puts this session's key in mode. On failure it leaves no key
// (fail).
func (q *queue) placeKey(ctx context.Context, mode KeyMode, val string) (placement, error) {
	// One round trip puts the key and reads the newest keys under the
	// prefix. Read after the put in the same Txn, they show who is ahead:
	// uncontended Lock is this one RPC. If this session already has a key
	// (left by a cleanup that could not reach etcd) in the same mode, its
	// place is reused (a second round trip: see place), and the Put binds it to the session's lease again
	// (it may have been bound to a WithMaxHold lease); a Put keeps the
	// create revision. A leftover in another mode is never Put (Invariant
	// K): readers behind a leftover read key may hold, and turning it
	// exclusive at its old place would let a writer in among them. It is
	// removed, and the key placed anew.
	//
	// A key inherited with an adopted lease (WithLease) is not a
	// leftover: it is a hold of the process that used the lease before,
	// which may have been used. Taking over its place and token would let
	// that hold's late writes pass a fence as this one's. It is removed,
	// by its create revision, as a hold that ended without Unlock (its
	// delay or minimum-hold record, if any, stays: the delay is owed), and
	// the key is placed anew, behind whoever queued since.
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		var err error
		resp, err = q.join(ctx, mode, val)
		if err != nil {
			// The Txn may have been applied even though its answer was
			// lost: remove the key by name.
			return placement{}, q.fail(ctx, 0, err)
		}
		if resp.Succeeded {
			break
		}
		in := resp.Responses[kept].GetResponseTxn()
		inherited := attempt == 0 && q.s.inherits(foundRev(in))
		if in.Succeeded && !inherited {
			break
		}
		if attempt > 0 {
			// Someone re-created our key in another mode between the two
			// round trips: only this process uses it, so that cannot
			// happen short of a misuse of the lease.
			return placement{}, q.fail(ctx, 0, errorf("key %s keeps its other mode", q.key))
		}
		if err := q.removeFound(ctx, in, inherited); err != nil {
			return placement{}, err
		}
	}
	p := placement{hdr: resp.Header}
	if rs := resp.Responses; resp.Succeeded {
		p.rev, p.page, p.delays = resp.Header.Revision, rs[placedQueue].GetResponseRange(), rangeAt(rs, placedDelays)
		p.recorded = len(rs) > placedRecord && rs[placedRecord].GetResponseTxn().Succeeded
		return p, nil
	}
	rs := resp.Responses[kept].GetResponseTxn().Responses
	p.rev, p.page, p.delays = rs[keptKey].GetResponseRange().Kvs[0].CreateRevision, rs[keptQueue].GetResponseRange(), rangeAt(rs, keptDelays)
	return p, nil
}

// The slots of place's Txn, as placeKey reads them. Its Then puts the key
// (placedPut) and reads the newest keys of the queue (placedQueue), and,
// for a lock with a delay, the lock's delay records (placedDelays) and the
// nested Txn that writes the hold's record (placedRecord). When our key
// is there already, place asks a second Txn, whose answer it puts as
// the first's only response (kept): its Then keeps our key of the same
// mode (unless it is inherited with the lease: see placeKey): the put,
// the key (keptKey), the queue (keptQueue), the records (keptDelays); its
// Else reads the key left in another mode (leftKey).
const (
	placedPut = iota
	placedQueue
	placedDelays
	placedRecord
)

const (
	kept    = 0
	leftKey = 0
)

const (
	keptPut = iota
	keptKey
	keptQueue
	keptDelays
)

// join is place, sent again after an error that passes (retryable) while
// ctx and the session last. place may be sent again whatever became of
// the attempt before: if that one put the key, the next finds it in the
// same mode and keeps its place. So a burst that overloads etcd (its
// "request timed out", "too many requests") or a leader election slows
// the Locks down rather than failing them.
//
// Each attempt is waited for (writeCtx) even after ctx ends: join returns
// once etcd answered an attempt, or after an error that does not pass, or
// when the session ends. It then returns ctx's error if ctx has ended (the
// caller removes the key, if any, by name), or an error matching
// ErrSessionExpired that says the key is left to the lease. A refusal of
// the first attempt comes back as notWritten: etcd applied nothing, and
// fail removes nothing.
func (q *queue) join(ctx context.Context, mode KeyMode, val string) (*clientv3.TxnResponse, error) {
	attempts := 0
	resp, err := retry(ctx, q.passes(ctx), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		attempts++
		resp, err := q.place(ctx, mode, val)
		if err != nil {
			return nil, q.rpcErr(err)
		}
		return resp, nil
	})
	switch {
	case err != nil && attempts == 1 && refused(err):
		return nil, notWritten{err} // nothing to remove
	case err != nil:
		return nil, q.unknownWrite(ctx, err)
	}
	return resp, nil
}

// place is acquire's round trip: it puts the key in mode unless this
// session has one, and reads the newest keys of the queue. It is a
// function of its own to keep its many Ops out of acquire's stack frame,
// which stays on the stack while the waiter waits: with them, a waiting
// goroutine's stack could not shrink back to its initial size.
//
//go:noinline
func (q *queue) place(ctx context.Context, mode KeyMode, val string) (*clientv3.TxnResponse, error) {
	if q.set != nil {
		return q.placeSetTxn(ctx, val)
	}
	put := clientv3.OpPut(q.key, val, clientv3.WithLease(q.s.Lease()))
	then := []clientv3.Op{placedPut: put, placedQueue: q.opQueue(mode, 0)}
	if q.opts.records {
		// A hold with a delay writes its record once admitted. When
		// nothing is under the prefix nor in the delay records before
		// this Txn, it is admitted by it: the record goes in the same
		// Txn, which saves the uncontended Lock the record's own RPC.
		// (etcd evaluates a nested Txn's compares before any write of
		// the Txn.) Its create revision is the key's: its token.
		then = append(then, q.delayOps()[0], clientv3.OpTxn(
			[]clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(q.prefix()), "=", 0).WithPrefix(),
				clientv3.Compare(clientv3.CreateRevision(q.delayPfx()), "=", 0).WithPrefix(),
			},
			[]clientv3.Op{clientv3.OpPut(delayKey(q.key), q.recordValue(0))}, nil))
	}
	wctx, cancel := q.writeCtx(ctx)
	defer cancel()
	resp, err := q.s.cli.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)).
		Then(then...).
		Commit()
	if err != nil || resp.Succeeded {
		return resp, err
	}
	// Our key is there already: a leftover of a cleanup that could not
	// reach etcd, or a key inherited with an adopted lease. That is rare,
	// so what to do then is asked by a Txn of its own, not carried in an
	// Else of every Lock's: the Else doubled the request every member
	// logs and applies, and cost etcd a sixth more CPU per uncontended
	// Lock+Unlock. Only this session writes its key, so in between the
	// key can only have gone with the lease: then the Value compare fails
	// (etcd fails a Value compare on a missing key), the Else finds
	// nothing, and placeKey puts it anew. The answer is shaped as the
	// Else's was (kept).
	in, err := q.s.cli.Txn(wctx).
		// Our leftover in the same mode keeps its place.
		If(clientv3.Compare(clientv3.Value(q.key), "=", val)).
		Then(append([]clientv3.Op{keptPut: put, keptKey: clientv3.OpGet(q.key), keptQueue: q.opQueue(mode, 0)}, q.delayOps()...)...).
		Else(clientv3.OpGet(q.key)).
		Commit()
	if err != nil {
		return nil, err
	}
	resp.Header = in.Header
	resp.Responses = []*pb.ResponseOp{kept: {Response: &pb.ResponseOp_ResponseTxn{ResponseTxn: (*pb.TxnResponse)(in)}}}
	return resp, nil
}

// unknownWrite explains the failure of a write of Lock whose outcome is
// unknown (err is the RPC's error): while the session lives, ctx's error
// if ctx has ended, else err; once the session has ended, an error that
// says so, matching ErrSessionExpired, and ctx's error only if the
// caller's ctx ended (ctx is bound to the session), and that says the
// key, if the write put it, goes with the lease.
func (q *queue) unknownWrite(ctx context.Context, err error) error {
	serr := q.s.Err()
	cerr := q.s.callerErr(ctx)
	switch {
	case serr != nil && cerr != nil:
		return errorf("%w; the write that joins the queue of %s failed (%v) and the session has ended: the key it may have put goes with the lease: %w", cerr, q.lockName(), err, serr)
	case serr != nil:
		return errorf("the write that joins the queue of %s failed (%v) and the session has ended: the key it may have put goes with the lease: %w", q.lockName(), err, serr)
	case cerr != nil:
		return cerr
	}
	return err
}

// ownRev reads the create revision of this session's key (0: none), as
// remove sends its Delete: again after errors that pass, while the
// session lasts.
func (q *queue) ownRev(ctx context.Context) (int64, error) {
	resp, err := retry(ctx, q.passes(ctx), func(ctx context.Context) (*clientv3.GetResponse, error) {
		return q.s.cli.Get(ctx, q.key, clientv3.WithKeysOnly())
	})
	switch {
	case err == nil && len(resp.Kvs) == 0, err != nil && q.s.Err() != nil:
		return 0, nil
	case err == nil:
		return resp.Kvs[0].CreateRevision, nil
	}
	return 0, errorf("read %s to remove it after failed lock: %w", q.key, err)
}

// writeCtx returns a context for a write whose outcome must be known: it
// outlives ctx's cancellation and deadline, so that Lock never gives up on
// a Put whose fate is unknown (a Put applied after the cleanup's Delete
// would leave a key that blocks the queue until the session ends). It ends
// only with the session, and needs no other bound: the key is bound to the
// session's lease, so once the session has ended nothing the write does
// outlives the lease. Lock checks ctx right after the write. Nor does it
// have a deadline of its own: a Lock called without one must not fail with
// a context.DeadlineExceeded its caller cannot tell from its own.
func (q *queue) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return q.s.bound(context.WithoutCancel(ctx))
}

// fail removes this queue's key after a failed Lock and returns err (joined
// with the cleanup's error if that failed too). rev is the key's create
// revision, or 0 when it is unknown because a Txn's outcome is unknown: then
// the key is deleted by name, which is safe because the session-local name
// lock makes this call the only user of the key in the process.
//
// When the session has ended, the key is left to its lease: Close revoked
// it, or it is expiring, and etcd may be out of reach.
func (q *queue) fail(ctx context.Context, rev int64, err error) error {
	if q.s.Err() != nil || isNotWritten(err) {
		return err
	}
	if cerr := q.remove(ctx, rev); cerr != nil {
		return join(err, cerr)
	}
	return err
}

// remove deletes this queue's key (for a set, each of its keys) if its
// create revision is rev (by name when rev is 0), with a context that is
// not the cancelled one (writeCtx): a key left behind would block the
// queue for as long as the session lives. It sends the Delete again after an error that passes (retryable),
// which is safe however many land, while the session lasts. Once the
// session has ended the key goes with the lease, and remove returns nil.
func (q *queue) remove(ctx context.Context, rev int64) error {
	cctx, cancel := q.writeCtx(ctx)
	defer cancel()
	if q.opts.records && rev == 0 { // (a set takes no delay: validate)
		// The write whose outcome is unknown may have put the hold's
		// delay record with its key (place, tryPut): its token is the
		// key's create revision, which a read tells.
		var err error
		if rev, err = q.ownRev(cctx); err != nil {
			return err
		}
	}
	cmps, dels := q.removeOps(rev)
	if q.opts.records && rev != 0 {
		// Lock wrote the delay record, or may have, and returns no
		// hold: nothing was done under it that a delay would protect.
		// The record goes whether the key is still ours or not.
		cmps, dels = nil, []clientv3.Op{clientv3.OpTxn(cmps, dels, nil), q.opDropDelay(rev)}
	}
	_, err := retry(cctx, q.passes(cctx), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.s.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	})
	if err == nil || q.s.Err() != nil {
		return nil
	}
	return errorf("remove %s after failed lock: %w", q.key, err)
}

// removeFound removes the key that place's Else (in) found: kept in the
// same mode (keptKey) or left in another (leftKey); an inherited one as
// removeInherited does, a leftover as remove does.
func (q *queue) removeFound(ctx context.Context, in *pb.TxnResponse, inherited bool) error {
	rev := foundRev(in)
	switch {
	case rev == 0:
		return nil
	case inherited:
		return q.removeInherited(ctx, rev)
	}
	return q.remove(ctx, rev)
}

// foundRev returns the create revision of our key that place's second Txn
// (in) found, in the same mode (keptKey) or in another (leftKey); 0 if
// none was there.
func foundRev(in *pb.TxnResponse) int64 {
	found := leftKey
	if in.Succeeded {
		found = keptKey
	}
	if old := in.Responses[found].GetResponseRange().Kvs; len(old) > 0 {
		return old[0].CreateRevision
	}
	return 0
}

// removeInherited deletes the key inherited with the session's adopted
// lease, if it still has create revision rev, and leaves its delay record:
// the hold it was ended without Unlock.
func (q *queue) removeInherited(ctx context.Context, rev int64) error {
	cctx, cancel := q.writeCtx(ctx)
	defer cancel()
	cmps, dels := q.removeOps(rev)
	_, err := retry(cctx, q.passes(cctx), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.s.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	})
	switch {
	case err == nil:
		return nil
	case q.s.Err() != nil:
		return nil
	}
	return errorf("remove %s, inherited with the lease: %w", q.key, err)
}

// acquireSet is acquire for a set: it puts every key in one Txn and waits
// for each name's turn. Every key ahead of one of ours was created before
// it, so the waits form no cycle; and a name admitted stays admitted
// while our keys stay (keys ahead only leave), so waiting for the names
// one after the other holds them all once the last is in. Every read
// after the Txn checks all our keys, so the last one's header shows the
// whole set held. On failure it leaves no key.
func (q *queue) acquireSet(ctx context.Context, val string) (admission, error) {
	rev, pages, hdr, err := q.placeSet(ctx, val)
	if err != nil {
		return admission{}, err
	}
	// Read every queue before waiting in any: most need no more pages.
	ws := make([]waiter, len(q.set.parts))
	for i, p := range q.set.parts {
		w := &ws[i]
		w.q, w.me = p, entry{key: p.key, rev: rev}
		w.read, err = p.scan(ctx, w.me, pages[i], nil, hdr)
		if q.retryable(ctx, err) {
			backoff := minBackoff
			w.read, err = w.reread(ctx, &backoff)
		}
		if err != nil {
			return admission{}, q.fail(ctx, rev, err)
		}
	}
	for i := range ws {
		w := &ws[i]
		h := w.read.hdr
		if len(w.read.blockers) > 0 {
			if h, err = w.wait(ctx); err != nil {
				return admission{}, q.fail(ctx, rev, err)
			}
		}
		if h.Revision > hdr.Revision {
			hdr = h
		}
	}
	if err := ctx.Err(); err != nil {
		return admission{}, q.fail(ctx, rev, err)
	}
	return admission{rev: rev, hdr: hdr}, nil
}

// placeSet puts every key of the set, and returns their create revision
// and the first page of each name's queue, read in the same Txn, whose
// response has header hdr. A Txn sent again after its answer was lost
// finds every key ours at one create revision and keeps that place. Keys
// of this session left otherwise (by a cleanup that could not reach etcd,
// or bound to another lease) are removed, and the set placed anew. On
// failure it leaves no key.
func (q *queue) placeSet(ctx context.Context, val string) (rev int64, pages []*pb.RangeResponse, hdr *pb.ResponseHeader, err error) {
	n := len(q.set.parts)
	for attempt := 0; ; attempt++ {
		resp, err := q.join(ctx, KeyMode{}, val)
		if err != nil {
			return 0, nil, nil, q.fail(ctx, 0, err)
		}
		pages = make([]*pb.RangeResponse, n)
		for i := range pages {
			pages[i] = resp.Responses[n+i].GetResponseRange()
		}
		if resp.Succeeded {
			return resp.Header.Revision, pages, resp.Header, nil
		}
		revs := make([]int64, n)
		placed := true
		for i := range revs {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				placed = false
				continue
			}
			kv := kvs[0]
			revs[i] = kv.CreateRevision
			placed = placed && revs[i] == revs[0] && string(kv.Value) == q.set.parts[i].partValue(val) && kv.Lease == int64(q.s.Lease())
		}
		inherited := false
		for _, rev := range revs {
			inherited = inherited || (attempt == 0 && q.s.inherits(rev))
		}
		if placed && !inherited {
			return revs[0], pages, resp.Header, nil
		}
		if attempt > 0 {
			// Only this process uses these keys, and the session's
			// rights to the names keep its other locks off them.
			return 0, nil, nil, q.fail(ctx, 0, errorf("keys of %s were left in place between two round trips", q.set.label))
		}
		if err := q.removeLeft(ctx, revs); err != nil {
			return 0, nil, nil, err
		}
	}
}

// placeSetTxn is place for a set: it puts every key unless one of them
// exists, and reads the newest keys of every name's queue; otherwise it
// reads the keys that exist, and the queues.
//
//go:noinline
func (q *queue) placeSetTxn(ctx context.Context, val string) (*clientv3.TxnResponse, error) {
	n := len(q.set.parts)
	cmps := make([]clientv3.Cmp, n)
	then := make([]clientv3.Op, 2*n)
	orElse := make([]clientv3.Op, 2*n)
	for i, p := range q.set.parts {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(p.key), "=", 0)
		then[i] = clientv3.OpPut(p.key, p.partValue(val), clientv3.WithLease(q.s.Lease()))
		orElse[i] = clientv3.OpGet(p.key)
		then[n+i] = p.opQueue(KeyMode{}, 0)
		orElse[n+i] = then[n+i]
	}
	wctx, cancel := q.writeCtx(ctx)
	defer cancel()
	return q.s.cli.Txn(wctx).If(cmps...).Then(then...).Else(orElse...).Commit()
}

// removeLeft deletes the keys of the set found left in place (revs[i],
// the create revision of parts[i]'s key; 0 for none), each only if it is
// still the one found, as remove does.
func (q *queue) removeLeft(ctx context.Context, revs []int64) error {
	var dels []clientv3.Op
	for i, p := range q.set.parts {
		if revs[i] != 0 {
			dels = append(dels, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(p.key), "=", revs[i])},
				[]clientv3.Op{clientv3.OpDelete(p.key)}, nil))
		}
	}
	cctx, cancel := q.writeCtx(ctx)
	defer cancel()
	_, err := retry(cctx, q.passes(cctx), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return q.s.cli.Txn(ctx).Then(dels...).Commit()
	})
	if err == nil || q.s.Err() != nil {
		return nil
	}
	return errorf("remove keys left of %s: %w", q.set.label, err)
}
