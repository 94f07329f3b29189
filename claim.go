package etcdlock

import (
	"context"
	"slices"
	"strconv"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The claim: the keys one hold puts, one for a Mutex (and every primitive
// of one name), one per name for a MultiMutex, and what the engine does to
// each of them: the session-local rights to the names, the comparisons
// that hold while the hold is current, the puts, the reads and deletes,
// the loss watches of a set's other keys. The engine asks this file what
// differs for a set; four places ask whether a queue is part of one
// (q.set), where a set's answer is its own: a Try's token (try.go), a
// release's attempt that saw a key go (release.go), the loss watch of a
// set's other keys (watcher.go) and the place of a set's keys
// (place.go). A single key's Txns are the ones testdata/txn records.

// A multiSet is what the parts of a MultiMutex share: a queue for each
// name, whose first part, the lead, owns the hold and its mu.
type multiSet struct {
	lead  *queue
	parts []*queue // one per name, in the order of the names; parts[0] is lead
	order []int    // the indexes of parts in sorted order of their names
	label string   // the names joined by ",", for events
	err   error    // what is wrong with the set of names: Lock and TryLock return it

	// The loss watches of the other parts' keys, for the hold watched
	// (Done made them), guarded by lead.mu. The lead's key's is
	// watched.watch.
	watched *hold
	watches []*keyWatch
}

// A claim is how the keys of a hold are taken: a single key's way (the
// Mutex's, place.go and try.go) or a set's (acquireSet, tryAcquireSet).
// take asks q for its claim and knows no more of it.
type claim interface {
	// check is validate's stage: it refuses a name (a set's names) the
	// claim cannot take, and the options a set takes none of.
	check(q *queue) error
	// acquire puts the keys in line and waits for the hold (Lock).
	acquire(ctx context.Context, q *queue, mode KeyMode, val string) (admission, error)
	// try takes the hold only if it can be had at once (TryLock).
	try(ctx context.Context, q *queue, mode KeyMode, val string) (admission, error)
}

// An admission is what a claim's acquire or try took: the hold's key's
// create revision (its token), the header of the answer that showed it
// admitted, and whether the write that took it also wrote its delay
// record (then its guard writes none).
type admission struct {
	rev      int64
	hdr      *pb.ResponseHeader
	recorded bool
}

// claim returns q's claim: its set, or a single key.
func (q *queue) claim() claim {
	if q.set != nil {
		return q.set
	}
	return oneKey{}
}

// oneKey is the claim of a single key: every primitive's but a MultiMutex's.
type oneKey struct{}

func (oneKey) check(q *queue) error { return checkName(q.lockName()) }

// check refuses a set whose names are wrong (set.err, found when it was
// made), and the options whose records a set does not write: a pending
// record would have to keep every name's queue out.
func (set *multiSet) check(q *queue) error {
	switch {
	case q.opts.delay > 0:
		return errorf("%w: a MultiMutex takes no lock delay", ErrInvalidOption)
	case q.opts.minHold > 0:
		return errorf("%w: a MultiMutex takes no minimum hold", ErrInvalidOption)
	}
	return set.err
}

// ownCmps returns the comparisons that hold while the hold created at rev
// is current: q's key still has create revision rev; for a part of a
// set, every key of the set.
func (q *queue) ownCmps(rev int64) []clientv3.Cmp {
	if q.set == nil {
		return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)}
	}
	cmps := make([]clientv3.Cmp, len(q.set.parts))
	for i, p := range q.set.parts {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(p.key), "=", rev)
	}
	return cmps
}

// puts returns the Puts of q's key (for a part of a set, every key of
// the set) with value val (partValue), bound to lease.
func (q *queue) puts(val string, lease clientv3.LeaseID) []clientv3.Op {
	if q.set == nil {
		return []clientv3.Op{clientv3.OpPut(q.key, val, clientv3.WithLease(lease))}
	}
	ops := make([]clientv3.Op, len(q.set.parts))
	for i, p := range q.set.parts {
		ops[i] = clientv3.OpPut(p.key, p.partValue(val), clientv3.WithLease(lease))
	}
	return ops
}

// partValue is the value of the key of p, a part of a set, given the
// set's value val (a Mutex's: "" or an identity's line): a set line that
// names the part after p, in a ring (setLine), then val.
func (p *queue) partValue(val string) string {
	parts := p.set.parts
	i := slices.Index(parts, p)
	return setLine(parts[(i+1)%len(parts)].lockName()) + val
}

// deletes returns the deletions of every key of q's set: by name when
// rev is 0, else each only while its create revision is rev.
func (q *queue) deletes(rev int64) []clientv3.Op {
	ops := make([]clientv3.Op, len(q.set.parts))
	for i, p := range q.set.parts {
		ops[i] = clientv3.OpDelete(p.key)
		if rev != 0 {
			ops[i] = clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(p.key), "=", rev)},
				[]clientv3.Op{ops[i]}, nil)
		}
	}
	return ops
}

// keyReads returns reads of every key of the set, keys only: what a
// waiter's check reads when one of them is no longer its own. None
// without a set: a single key's check needs no read to say which.
func (set *multiSet) keyReads(opts ...clientv3.OpOption) []clientv3.Op {
	if set == nil {
		return nil
	}
	ops := make([]clientv3.Op, len(set.parts))
	for i, p := range set.parts {
		ops[i] = clientv3.OpGet(p.key, append([]clientv3.OpOption{clientv3.WithKeysOnly()}, opts...)...)
	}
	return ops
}

// goneKey returns the part of the set whose key a failed check (resp;
// Else: keyReads) found gone or not created at rev; q itself when not in
// a set, or when none was.
func (set *multiSet) goneKey(q *queue, rev int64, resp *clientv3.TxnResponse) *queue {
	if set == nil {
		return q
	}
	for i, p := range set.parts {
		if i >= len(resp.Responses) {
			break
		}
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != rev {
			return p
		}
	}
	return q
}

// goneInRelease returns the part of the set whose key a release (resp,
// which failed: releaseTxn's Else) found gone; q itself when not in a set.
func (set *multiSet) goneInRelease(q *queue, resp *clientv3.TxnResponse) *queue {
	if set == nil {
		return q
	}
	for i, r := range resp.Responses {
		if t := r.GetResponseTxn(); t != nil && !t.Succeeded && i < len(set.parts) {
			return set.parts[i]
		}
	}
	return q
}

// watchHold starts the loss watches of h on the keys of the set's parts
// but the lead (whose watch is h.watch), with lead.mu held. It reports
// false if the session has ended. Without a set it does nothing.
func (set *multiSet) watchHold(h *hold) bool {
	if set == nil {
		return true
	}
	set.watched, set.watches = h, make([]*keyWatch, 0, len(set.parts)-1)
	for _, p := range set.parts[1:] {
		kw := set.lead.s.watcher.watchHold(p, h, false)
		if kw == nil {
			return false
		}
		set.watches = append(set.watches, kw)
	}
	return true
}

// takeWatches returns the watches watchHold made for h, and forgets them,
// with lead.mu held.
func (set *multiSet) takeWatches(h *hold) []*keyWatch {
	if set == nil || set.watched != h {
		return nil
	}
	kws := set.watches
	set.watched, set.watches = nil, nil
	return kws
}

// acquireNames takes the session-local right to queue for q's name (see
// Session.acquireName), or for every name of its set, in the order of the
// names: two sets of one session that share names take them in the same
// order, so neither waits for the other while holding a right it needs.
// Without wait, it takes none if one is taken. Give them back with
// releaseNames.
func (q *queue) acquireNames(ctx context.Context, wait bool) error {
	if q.set == nil {
		return q.s.acquireName(ctx, q.lockName(), wait)
	}
	for i, j := range q.set.order {
		if err := q.s.acquireName(ctx, q.set.parts[j].lockName(), wait); err != nil {
			for _, k := range q.set.order[:i] {
				q.s.releaseName(q.set.parts[k].lockName())
			}
			return err
		}
	}
	return nil
}

// releaseNames gives back the rights acquireNames took.
func (q *queue) releaseNames() {
	if q.set == nil {
		q.s.releaseName(q.lockName())
		return
	}
	for _, p := range q.set.parts {
		q.s.releaseName(p.lockName())
	}
}

// quotedPrefixes returns the queue prefix of each key of the claim, quoted,
// for messages.
func (q *queue) quotedPrefixes() []string {
	var pfxs []string
	for _, p := range q.parts() {
		pfxs = append(pfxs, strconv.Quote(p.prefix()))
	}
	return pfxs
}

// releaseTxn deletes the keys of the hold created at rev: q's key if its
// create revision is still rev; for a set, each key of the set that still
// has it. It succeeds when every key had it. A clean release (an
// Unlock's) deletes the hold's lock delay record with its key; the
// tidying after a loss leaves it, so that the delay holds. It goes to
// etcd alone, or nested in a batch of the session's releases (batch.go).
func (q *queue) releaseTxn(ctx context.Context, rev int64, clean bool) (*clientv3.TxnResponse, error) {
	if q.set == nil {
		del := []clientv3.Op{clientv3.OpDelete(q.key)}
		if clean && q.opts.records {
			del = append(del, clientv3.OpDelete(delayKey(q.key)))
		}
		return q.s.batch.txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)}, del, nil)
	}
	return q.s.batch.txn(ctx, q.ownCmps(rev), q.deletes(0), q.deletes(rev))
}

// sweep is one round of the releaser for a set's hold h, which ended with
// one of its keys gone: it deletes each other key still h's. It reports whether that
// is done.
func (q *queue) sweep(h *hold) bool {
	if q.s.Err() != nil {
		return true // they go with the lease
	}
	actx, cancel := context.WithTimeout(q.s.endCtx, cleanupTimeout)
	defer cancel()
	_, err := q.releaseTxn(actx, h.rev, false)
	return err == nil || q.s.Err() != nil
}

// parts returns the queues of q's claim: q alone, or its set's parts.
func (q *queue) parts() []*queue {
	if q.set == nil {
		return []*queue{q}
	}
	return q.set.parts
}

// removeOps returns the Txn that removes the keys of q's claim after a
// failed Lock: each only while its create revision is rev, or by name
// when rev is 0.
func (q *queue) removeOps(rev int64) ([]clientv3.Cmp, []clientv3.Op) {
	if q.set != nil {
		return nil, q.deletes(rev) // each key of the set, each guarded
	}
	var cmps []clientv3.Cmp
	if rev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev))
	}
	return cmps, []clientv3.Op{clientv3.OpDelete(q.key)}
}

// sweepOthers hands the session's releaser the other keys of a set whose
// hold h ended with one of its keys gone (a loss, or during a release
// whose outcome is unknown): they would keep their names' queues waiting
// until the session's end. The releaser deletes those still h's (sweep);
// Unlock does not wait for it. A single key has no others.
func (q *queue) sweepOthers(h *hold) {
	if q.set != nil {
		q.s.releaser.add(func() bool { return q.sweep(h) })
	}
}

// label is q's name in events (LockInfo.Name): its name, or its set's
// names joined by ",".
func (q *queue) label() string {
	if q.set != nil {
		return q.set.label
	}
	return q.lockName()
}

// owner returns the queue that owns q's hold: q, or its set's lead.
func (q *queue) owner() *queue {
	if q.set != nil {
		return q.set.lead
	}
	return q
}
