package etcdlock

import (
	"context"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MultiMutex, one hold over several names. Its parts are queues of the one
// engine; what is a set's own is here: placing every key in one Txn, its
// Try, the reads and deletes of every key, and the loss watches of its
// other keys.

// MaxMultiNames is the most names a MultiMutex takes. Its key under every
// name is put in one Txn, which also reads each name's queue: two
// operations per name, and etcd refuses a Txn of more than --max-txn-ops
// operations (128 by default). A cluster started with a lower
// --max-txn-ops refuses a set of more than half its value with etcd's
// error (rpctypes.ErrTooManyOps).
const MaxMultiNames = 64

// A MultiMutex is one fair lock over several names, held all at once or
// not at all: Lock puts a key under every name in one Txn, so all its keys
// share one create revision, and holds once each name's queue admits it.
// It never holds some names while it waits for others' holders to let it
// in: it waits in every queue at once, from the moment of that Txn. First
// in one name's queue while it waits for another, it holds nothing, but
// those behind it on that name wait for it (first come, first served);
// InspectLock shows its key there waiting (QueueKey.WaitsFor).
//
// Revisions order every key, of a MultiMutex or of a single Mutex, the
// same way in every queue, and a key waits only for keys older than it:
// no cycle of waits can form, so MultiMutexes over overlapping sets, in
// any order of names, and Mutexes on the same names never deadlock. Each
// name's queue stays first come, first served.
//
// Each key is name/<lease ID in hex>, whose value reads as a Mutex's
// (exclusive) and names the set's next name, so etcd's
// concurrency.Mutex, `etcdctl lock` and a Mutex on any one of the names
// queue with the MultiMutex and exclude it. Every guarantee of a Mutex
// holds for the set: see Mutex for what Lock, TryLock, Unlock and Do
// promise; where Mutex says "the key", read "every key of the set". Its
// options are a Mutex's.
//
// Within one Session, the names are also taken in the session's own
// right to each name (which makes two locks of one session on a name
// exclude each other), in sorted order, so that two MultiMutexes of one
// session over overlapping sets cannot wait for each other either.
type MultiMutex struct {
	q     queue // the lead: names[0]'s part, which owns the hold
	names []string
}

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

// NewMultiMutex returns a MultiMutex over names, taken through session s.
// The names are checked by Lock and TryLock, which return ErrInvalidName
// for an empty set, a duplicate or an invalid name (see ErrInvalidName),
// more than MaxMultiNames names, or names longer than MaxNameLen in all.
// Invalid options are reported by Lock and TryLock, as ErrInvalidOption.
func NewMultiMutex(s *Session, names []string, opts ...MutexOption) *MultiMutex {
	m := &MultiMutex{names: slices.Clone(names)}
	set := &multiSet{lead: &m.q, err: checkSet(names), label: strings.Join(names, ",")}
	first := ""
	if len(names) > 0 {
		first = names[0]
	}
	m.q.init(s, first, KindMultiMutex, opts)
	m.q.set = set
	set.parts = append(set.parts, &m.q)
	for _, name := range m.names[min(1, len(m.names)):] {
		p := &queue{set: set}
		p.init(s, name, KindMultiMutex, nil)
		p.opts = m.q.opts
		set.parts = append(set.parts, p)
	}
	set.order = make([]int, len(set.parts))
	for i := range set.order {
		set.order[i] = i
	}
	slices.SortFunc(set.order, func(a, b int) int { return strings.Compare(set.parts[a].name, set.parts[b].name) })
	return m
}

// checkSet returns ErrInvalidName for a set of names no MultiMutex can
// take.
func checkSet(names []string) error {
	switch {
	case len(names) == 0:
		return errorf("%w: no names", ErrInvalidName)
	case len(names) > MaxMultiNames:
		return errorf("%w: %d names, more than %d (one Txn carries every key)", ErrInvalidName, len(names), MaxMultiNames)
	}
	total := 0
	for i, name := range names {
		if err := checkName(name); err != nil {
			return err
		}
		if slices.Contains(names[:i], name) {
			return errorf("%w: name %q given twice", ErrInvalidName, name)
		}
		total += len(name)
	}
	if total > MaxNameLen {
		return errorf("%w: the names are %d bytes in all, longer than %d", ErrInvalidName, total, MaxNameLen)
	}
	return nil
}

// Lock blocks until every name is held, ctx ends, or the session ends.
// It waits in every name's queue at once, and holds none of them before
// it holds all. On failure it leaves no key under any name. See
// Mutex.Lock for the errors and for what Lock rides out.
func (m *MultiMutex) Lock(ctx context.Context) error { return m.q.lock(ctx, KeyMode{}, true) }

// TryLock takes every name if none is held or waited for, and otherwise
// returns ErrLocked at once, writing nothing. A held set costs one
// read-only RPC; a free one, one read and one write, guarded so that
// TryLock never jumps ahead of a waiter on any name. See Mutex.TryLock.
func (m *MultiMutex) TryLock(ctx context.Context) error { return m.q.lock(ctx, KeyMode{}, false) }

// Unlock releases every name: one Txn deletes each key that is still the
// key this hold created (same create revision), so it can never delete
// another holder's key. It returns ErrLockLost when any of the keys was
// gone before Unlock began: at once when the loss was known (the session's
// releaser deletes the other keys, as it does as soon as the loss is
// seen, Unlock or not), else once its Txn found the key gone (and deleted
// the others). A key of the set seen gone while a delete's outcome is
// unknown does not end the release, as it does a Mutex's: the other keys
// may still be there, so the delete is sent until etcd answers.
// Otherwise, see Mutex.Unlock.
func (m *MultiMutex) Unlock(ctx context.Context) error { return m.q.unlock(ctx, nil, "Unlock") }

// Do locks m, runs fn, and unlocks m. fn's ctx is cancelled the moment
// any of the keys is lost. See Mutex.Do.
func (m *MultiMutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return m.q.do(ctx, KeyMode{}, fn)
}

// Done returns a channel closed when the current hold ends: Unlock, or
// the loss of any of its keys. Its first call of a hold watches every key.
// See Mutex.Done.
func (m *MultiMutex) Done() <-chan struct{} { return m.q.Done() }

// Err returns nil while a hold lasts and after Unlock, and an error
// matching ErrLockLost once it ended involuntarily. See Mutex.Err.
func (m *MultiMutex) Err() error { return m.q.Err() }

// ReleaseRequested returns a channel closed when the current hold is asked
// to release (RequestRelease) under any of its names. See
// Mutex.ReleaseRequested.
func (m *MultiMutex) ReleaseRequested() <-chan struct{} { return m.q.ReleaseRequested() }

// Token returns the fencing token of the current hold: the create
// revision its keys share. A hold admitted after one that shares a name
// with it has a larger token, whether that one was a MultiMutex's or a
// Mutex's. Token returns 0 when nothing is held.
func (m *MultiMutex) Token() int64 { return m.q.Token() }

// Header returns the header of the etcd response that showed every name
// was held, or nil when nothing is held.
func (m *MultiMutex) Header() *pb.ResponseHeader { return m.q.Header() }

// IsOwner returns a comparison that holds only while the current hold
// lasts and its key under name is its own: use it in Txn().If to make a
// write conditional on holding name. It never holds for a name not in the
// set, nor when nothing is held. To guard a write on every name, compare
// each.
func (m *MultiMutex) IsOwner(name string) clientv3.Cmp {
	rev := int64(-1) // no key has create revision -1
	key := name + "/"
	if i := slices.Index(m.names, name); i >= 0 {
		key = m.q.set.parts[i].key
		if t := m.q.Token(); t != 0 {
			rev = t
		}
	}
	return clientv3.Compare(clientv3.CreateRevision(key), "=", rev)
}

// Keys returns the keys of m in etcd, name/<lease ID in hex> for each
// name, in the order of the names.
func (m *MultiMutex) Keys() []string {
	keys := make([]string, len(m.q.set.parts))
	for i, p := range m.q.set.parts {
		keys[i] = p.key
	}
	return keys
}

// acquireSet is acquire for a set: it puts every key in one Txn and waits
// for each name's turn. Every key ahead of one of ours was created before
// it, so the waits form no cycle; and a name admitted stays admitted
// while our keys stay (keys ahead only leave), so waiting for the names
// one after the other holds them all once the last is in. Every read
// after the Txn checks all our keys, so the last one's header shows the
// whole set held. On failure it leaves no key.
func (q *queue) acquireSet(ctx context.Context, val string) (int64, *pb.ResponseHeader, error) {
	rev, pages, hdr, err := q.placeSet(ctx, val)
	if err != nil {
		return 0, nil, err
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
			return 0, nil, q.fail(ctx, rev, err)
		}
	}
	for i := range ws {
		w := &ws[i]
		h := w.read.hdr
		if len(w.read.blockers) > 0 {
			if h, err = w.wait(ctx); err != nil {
				return 0, nil, q.fail(ctx, rev, err)
			}
		}
		if h.Revision > hdr.Revision {
			hdr = h
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, q.fail(ctx, rev, err)
	}
	return rev, hdr, nil
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
		if placed {
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
	backoff := minBackoff
	for {
		_, err := q.s.cli.Txn(cctx).Then(dels...).Commit()
		if err == nil || q.s.Err() != nil {
			return nil
		}
		if !q.retryable(cctx, err) || !pause(cctx, &backoff) {
			if q.s.Err() != nil {
				return nil
			}
			return errorf("remove keys left of %s: %w", q.set.label, err)
		}
	}
}

// tryAcquireSet is tryAcquire for a set: it takes every name only if each
// name's queue is empty but for nested locks' keys, in one read-only Txn
// and one write guarded by every name's prefix, and writes nothing
// otherwise. Keys of this session left under the names (by a cleanup that
// could not reach etcd) are removed first.
func (q *queue) tryAcquireSet(ctx context.Context, val string) (int64, *pb.ResponseHeader, error) {
	n := len(q.set.parts)
	first := make([]clientv3.Op, 2*n)
	for i, p := range q.set.parts {
		first[i] = p.opQueue(KeyMode{}, 0)
		first[n+i] = clientv3.OpGet(p.key, clientv3.WithKeysOnly())
	}
	resp, err := q.tryReadTxn(ctx, first)
	if err != nil {
		return 0, nil, err
	}
	backoff := minBackoff
	for changed := 0; changed < 5; {
		blocked, left, rev, err := q.tryReadSet(ctx, resp)
		if again, rerr := q.tryAgain(ctx, err, &backoff, &changed, first, &resp); again || rerr != nil {
			if rerr != nil {
				return 0, nil, rerr
			}
			continue
		}
		if blocked {
			return 0, nil, ErrLocked
		}
		if left != nil {
			if err := q.removeLeft(ctx, left); err != nil {
				return 0, nil, err
			}
			if resp, err = q.tryReadTxn(ctx, first); err != nil {
				return 0, nil, err
			}
			changed++
			continue
		}
		// Free at the read's revision in every queue: take it only if
		// nothing under any of the prefixes changed since.
		cmps := make([]clientv3.Cmp, n)
		for i, p := range q.set.parts {
			cmps[i] = clientv3.Compare(clientv3.ModRevision(p.pfx), "<", rev+1).WithPrefix()
		}
		wctx, cancel := q.writeCtx(ctx)
		tresp, err := q.s.cli.Txn(wctx).If(cmps...).Then(q.puts(val, q.s.Lease())...).Else(first...).Commit()
		cancel()
		if err != nil {
			return 0, nil, q.fail(ctx, 0, q.unknownWrite(ctx, q.rpcErr(err)))
		}
		if tresp.Succeeded {
			if err := ctx.Err(); err != nil {
				return 0, nil, q.fail(ctx, tresp.Header.Revision, err)
			}
			return tresp.Header.Revision, tresp.Header, nil
		}
		resp = tresp
		changed++
	}
	return 0, nil, ErrLocked
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
	return setLine(parts[(i+1)%len(parts)].name) + val
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
// waiter's check reads when one of them is no longer its own.
func (set *multiSet) keyReads(opts ...clientv3.OpOption) []clientv3.Op {
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
		kw := set.lead.s.watcher.watchHold(p, h)
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
