package etcdlock

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The Try forms: a read-only Txn that answers "held" with no write, or a
// put guarded so that it takes the hold only as that read found it; for a
// MultiMutex, the same over every name of the set at once.

func (oneKey) try(ctx context.Context, q *queue, mode KeyMode, val string) (admission, error) {
	return q.tryAcquire(ctx, mode, val)
}

func (set *multiSet) try(ctx context.Context, q *queue, _ KeyMode, val string) (admission, error) {
	return q.tryAcquireSet(ctx, val)
}

// tryAcquire takes a hold in mode only if it is admitted at once, and
// writes nothing otherwise. It is admitted if its rule admits it behind
// every key of the queue (a rule that admits me behind everyone admits me
// at my place), or, for this session's own leftover key in the same mode,
// at that key's place.
func (q *queue) tryAcquire(ctx context.Context, mode KeyMode, val string) (admission, error) {
	// A read-only Txn answers "held" without a Raft write or a new
	// revision. etcd sends any Txn with a Put through Raft even when its
	// compare fails, so only an all-read request is served as a read.
	first := append([]clientv3.Op{tryQueue: q.opQueue(mode, 0), tryOwn: clientv3.OpGet(q.key)}, q.delayOps()...)
	resp, err := q.tryReadTxn(ctx, first)
	if err != nil {
		return admission{}, err
	}
	backoff := minBackoff
	for changed := 0; changed < 5; {
		me, read, err := q.tryRead(ctx, mode, val, resp)
		if again, rerr := q.tryAgain(ctx, err, &backoff, &changed, first, &resp); again || rerr != nil {
			if rerr != nil {
				return admission{}, rerr
			}
			continue
		}
		// A key inherited with an adopted lease is not this Try's to take
		// over (see placeKey), blocked or not: it goes first.
		inherited := read.own != nil && q.s.inherits(read.own.CreateRevision)
		if len(read.blockers) > 0 && !inherited {
			// A Try starts a pending lock delay, or no Try would ever
			// end it. If it fails, a later Try or Lock starts it.
			_ = q.startDelays(ctx, read.delays)
			return admission{}, ErrLocked
		}
		if inherited || (read.own != nil && me.rev == 0) {
			// Our leftover in another mode would be admitted behind
			// everyone: remove it and place a new key (Invariant K: it is
			// never Put in another mode).
			if resp, err = q.dropOwn(ctx, read.own.CreateRevision, inherited, first); err != nil {
				return admission{}, err
			}
			changed++
			continue
		}
		var own int64 // the create revision of the key whose place it keeps
		if read.own != nil {
			own = read.own.CreateRevision
		}
		tresp, err := q.tryPut(ctx, val, read, first)
		in, again, err := q.tryTaken(ctx, tresp, err, own)
		if again == nil {
			in.recorded = err == nil && q.opts.records
			return in, err
		}
		resp = again
		changed++
	}
	// Keys kept changing under the prefix (nested locks' traffic): rather
	// than spin, report the lock as busy.
	return admission{}, ErrLocked
}

// tryAgain handles err, the error of judging a Try's read: when a later
// page met a compaction of the revision it was to be read at, or an error
// that passes (an election), it reads the queue anew into *resp, after a
// pause for the latter, as the first read is, and reports true. Only
// compactions count as the queue changing (*changed). Any other error is
// returned.
func (q *queue) tryAgain(ctx context.Context, err error, backoff *time.Duration, changed *int, first []clientv3.Op, resp **clientv3.TxnResponse) (again bool, _ error) {
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, errPageCompacted) && !q.retryable(ctx, err) {
		return false, err
	}
	if errors.Is(err, errPageCompacted) {
		*changed++
	} else if !pause(ctx, backoff) {
		return false, ctx.Err()
	}
	r, err := q.tryReadTxn(ctx, first)
	if err != nil {
		return false, err
	}
	*resp = r
	return true, nil
}

// tryReadTxn sends a Try's read-only Txn (first), again after errors that
// pass (a leader election, a member out of reach), after a growing pause,
// as long as ctx and the session last: a Try answers whether the lock is
// free, and an election says nothing about that. A read writes nothing, so
// sending it again leaves nothing behind.
func (q *queue) tryReadTxn(ctx context.Context, first []clientv3.Op) (*clientv3.TxnResponse, error) {
	backoff := minBackoff
	for {
		resp, err := q.s.cli.Txn(ctx).Then(first...).Commit()
		if err == nil {
			return resp, nil
		}
		if err = q.rpcErr(err); !q.retryable(ctx, err) {
			return nil, err
		}
		if !pause(ctx, &backoff) {
			return nil, ctx.Err()
		}
	}
}

// dropOwn removes the key of this session's that a Try found (rev): a
// hold inherited with an adopted lease, its delay record left
// (removeInherited), or a leftover in another mode (remove). Then it
// reads first again.
func (q *queue) dropOwn(ctx context.Context, rev int64, inherited bool, first []clientv3.Op) (*clientv3.TxnResponse, error) {
	remove := q.remove
	if inherited {
		remove = q.removeInherited
	}
	if err := remove(ctx, rev); err != nil {
		return nil, err
	}
	return q.tryReadTxn(ctx, first)
}

// tryRead judges a Try from resp, the answer to its read-only Txn (the
// queue's first page, this session's own key, the lock's delay records). me is the Try's
// entry: at its own key's place when that key is in mode (val), else
// behind everyone (rev 0).
func (q *queue) tryRead(ctx context.Context, mode KeyMode, val string, resp *clientv3.TxnResponse) (me entry, _ queueRead, _ error) {
	var own *mvccpb.KeyValue
	if kvs := resp.Responses[tryOwn].GetResponseRange().Kvs; len(kvs) > 0 {
		own = kvs[0]
	}
	me = entry{key: q.key, mode: mode}
	if own != nil && string(own.Value) == val {
		// This session's own key in this mode, left by a cleanup that
		// could not reach etcd: judge it at its place.
		me.rev = own.CreateRevision
	}
	read, err := q.scan(ctx, me, resp.Responses[tryQueue].GetResponseRange(), rangeAt(resp.Responses, tryDelays), resp.Header)
	read.own = own
	return me, read, err
}

// The slots of a Try's read-only Txn (and of tryPut's Else, the same
// reads): the queue's first page, this session's own key, and, for a lock
// with a delay, the lock's delay records.
const (
	tryQueue = iota
	tryOwn
	tryDelays
)

// tryPut puts the key of a Try that read admits, guarded so that it takes
// the hold only as read; if the guard fails, the Txn reads first again.
func (q *queue) tryPut(ctx context.Context, val string, read queueRead, first []clientv3.Op) (*clientv3.TxnResponse, error) {
	put := clientv3.OpPut(q.key, val, clientv3.WithLease(q.s.Lease()))
	// Admitted at the read's revision: every page was read at it (see
	// pager). Take it only if nothing under the prefix changed since:
	// a waiter that queued in between must keep its turn.
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(q.prefix()), "<", read.rev+1).WithPrefix()}
	if read.own != nil {
		// At its place: keys ahead only leave, and fewer keys ahead
		// never turn admitted into blocked. Bind the key to the
		// session's lease again (it may be bound to a WithMaxHold
		// lease); a Put keeps its create revision.
		cmps = []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(q.key), "=", read.own.CreateRevision),
			clientv3.Compare(clientv3.Value(q.key), "=", val),
		}
	}
	then := []clientv3.Op{put}
	if q.opts.records {
		// A hold taken and ended without Unlock since the read leaves no
		// key under the prefix, but a pending delay record: no record
		// may have changed since the read either.
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(q.delayPfx()), "<", read.rev+1).WithPrefix())
		// Admitted if the guard holds: the hold's delay record goes in
		// the same Txn (see place), at the key's create revision.
		token := int64(0)
		if read.own != nil {
			token = read.own.CreateRevision
		}
		then = append(then, clientv3.OpPut(delayKey(q.key), q.recordValue(token)))
	}
	send := func(wctx context.Context) (*clientv3.TxnResponse, error) {
		return q.s.cli.Txn(wctx).If(cmps...).Then(then...).Else(first...).Commit()
	}
	// If ctx ends before the answer, Try returns: when the answer comes,
	// the key it put (or may have put) goes, as fail would remove it,
	// and then the session's right to the name (take kept it).
	return q.writeOrHandOff(ctx, send, func(resp *clientv3.TxnResponse, err error) {
		switch {
		case err != nil:
			_ = q.remove(context.Background(), 0)
		case resp.Succeeded:
			rev := resp.Header.Revision
			if read.own != nil {
				rev = read.own.CreateRevision
			}
			_ = q.remove(context.Background(), rev)
		}
		q.releaseNames()
	})
}

// tryAcquireSet is tryAcquire for a set: it takes every name only if each
// name's queue is empty but for nested locks' keys, in one read-only Txn
// and one write guarded by every name's prefix, and writes nothing
// otherwise. Keys of this session left under the names (by a cleanup that
// could not reach etcd) are removed first.
func (q *queue) tryAcquireSet(ctx context.Context, val string) (admission, error) {
	n := len(q.set.parts)
	first := make([]clientv3.Op, 2*n)
	for i, p := range q.set.parts {
		first[i] = p.opQueue(KeyMode{}, 0)
		first[n+i] = clientv3.OpGet(p.key, clientv3.WithKeysOnly())
	}
	resp, err := q.tryReadTxn(ctx, first)
	if err != nil {
		return admission{}, err
	}
	backoff := minBackoff
	for changed := 0; changed < 5; {
		blocked, left, rev, err := q.tryReadSet(ctx, resp)
		if again, rerr := q.tryAgain(ctx, err, &backoff, &changed, first, &resp); again || rerr != nil {
			if rerr != nil {
				return admission{}, rerr
			}
			continue
		}
		if blocked {
			return admission{}, ErrLocked
		}
		if left != nil {
			if err := q.removeLeft(ctx, left); err != nil {
				return admission{}, err
			}
			if resp, err = q.tryReadTxn(ctx, first); err != nil {
				return admission{}, err
			}
			changed++
			continue
		}
		tresp, err := q.tryPutSet(ctx, val, rev, first)
		in, again, err := q.tryTaken(ctx, tresp, err, 0)
		if again == nil {
			return in, err
		}
		resp = again
		changed++
	}
	return admission{}, ErrLocked
}

// tryPutSet sends a set's Try's puts, free at revision rev in every
// queue: they take the hold only if nothing under any of the prefixes
// changed since; else the answer reads every queue again (first). An
// answer that comes after ctx ended is handed off (writeOrHandOff): the
// session removes what the puts may have put.
func (q *queue) tryPutSet(ctx context.Context, val string, rev int64, first []clientv3.Op) (*clientv3.TxnResponse, error) {
	cmps := make([]clientv3.Cmp, len(q.set.parts))
	for i, p := range q.set.parts {
		cmps[i] = clientv3.Compare(clientv3.ModRevision(p.prefix()), "<", rev+1).WithPrefix()
	}
	send := func(wctx context.Context) (*clientv3.TxnResponse, error) {
		return q.s.cli.Txn(wctx).If(cmps...).Then(q.puts(val, q.s.Lease())...).Else(first...).Commit()
	}
	return q.writeOrHandOff(ctx, send, func(resp *clientv3.TxnResponse, err error) {
		switch {
		case err != nil:
			_ = q.remove(context.Background(), 0)
		case resp.Succeeded:
			_ = q.remove(context.Background(), resp.Header.Revision)
		}
		q.releaseNames()
	})
}

// tryTaken reads the outcome of a Try's put (tryPut, tryPutSet), tresp or
// err: the hold's token (own, the create revision of the key whose place
// it kept, else the put's revision) and header when the put took it; or
// again, the answer to judge anew, when the queue changed meanwhile. A
// put handed off is left to the session; any other error, or ctx ended
// once the hold was taken, fails the Try and removes what it put.
func (q *queue) tryTaken(ctx context.Context, tresp *clientv3.TxnResponse, err error, own int64) (_ admission, again *clientv3.TxnResponse, _ error) {
	var off *handedOff
	switch {
	case errors.As(err, &off):
		return admission{}, nil, err // the session removes what it may have put
	case err != nil:
		return admission{}, nil, q.fail(ctx, 0, q.unknownWrite(ctx, q.rpcErr(err)))
	case !tresp.Succeeded:
		return admission{}, tresp, nil
	}
	rev := own
	if rev == 0 {
		rev = tresp.Header.Revision
	}
	if err := ctx.Err(); err != nil {
		return admission{}, nil, q.fail(ctx, rev, err)
	}
	return admission{rev: rev, hdr: tresp.Header}, nil, nil
}

// tryReadSet judges a set's Try from resp, the answer to its read-only
// Txn (each queue's first page, then each of our keys): whether a key
// ahead keeps it out of any queue, the create revisions of our keys left
// in place (nil when none is), and the revision of the read.
func (q *queue) tryReadSet(ctx context.Context, resp *clientv3.TxnResponse) (blocked bool, left []int64, rev int64, _ error) {
	n := len(q.set.parts)
	for i, p := range q.set.parts {
		if kvs := resp.Responses[n+i].GetResponseRange().Kvs; len(kvs) > 0 {
			if left == nil {
				left = make([]int64, n)
			}
			left[i] = kvs[0].CreateRevision
		}
		read, err := p.scan(ctx, entry{key: p.key}, resp.Responses[i].GetResponseRange(), nil, resp.Header)
		if err != nil {
			return false, nil, 0, err
		}
		if len(read.blockers) > 0 {
			return true, nil, 0, nil
		}
	}
	return false, left, resp.Header.Revision, nil
}
