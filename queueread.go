package etcdlock

import (
	"context"
	"slices"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reading the queue ahead of a key: the direct children of its prefix,
// newest first, a page at a time and every page at one revision, judged
// by the key's grant rule (scan).

const (
	// queueScan is how many keys one keys-only range reads when an
	// exclusive waiter (a Mutex, an RWMutex writer) looks for the key just
	// ahead. Only direct children of name/ count, so a few extra keys leave
	// room for nested locks' keys (name/sub/<lease>) without another RPC.
	queueScan = 8
	// modeScan and modeScanMore are the first and later pages of a range
	// that reads values (the modes of the keys ahead). etcd reads every key
	// of the prefix for a sorted range anyway; the limit only trims the
	// answer, so one bigger page is cheaper than two small ones.
	modeScan     = 64
	modeScanMore = 512
)

// A queueRead is one read of the queue ahead of a key (me), and its
// verdict. Every page of it was read at one revision (see pager), so the
// verdict is the queue's at that revision, whoever made the read: a Try
// guards its write with it, a waiter watches from it. Keys only leave the
// queue ahead of a key (new ones join behind), so a verdict of "admitted"
// stays true for as long as me's key is its own.
type queueRead struct {
	rev int64 // the revision every page was read at: hdr.Revision
	// hdr is the header of the response that carried the first page.
	// For a waiter admitted by this read, it is the hold's header; a Try
	// that is admitted takes the header of its write instead.
	hdr      *pb.ResponseHeader
	blockers []entry // what keeps me out, newest first (see rule); none: me is admitted at rev
	// releasers are the keys of the blockers whose deletion alone admits
	// me (releasersOf): for a Mutex the key just ahead, for a reader the
	// writer ahead when it is the only one. When one of them goes, the
	// waiter knows it is in without reading the queue again
	// (recheck). Set only when complete, with at most maxWatched blockers.
	releasers []string
	complete  bool // the pages read hold every key ahead of me
	// own is, for a Try only, this session's own key as the read found
	// it (a key left by a cleanup that could not reach etcd).
	own *mvccpb.KeyValue
	// delays are the pending lock delays of holds ahead that keep me
	// out although the rule admits me; blockers are then their records.
	delays []pendingDelay
}

// scan reads the direct children of the prefix ahead of me, newest first:
// those with a create revision below me.rev, or all of them but this
// session's own key when me.rev is 0 (a Try, not in the queue). It starts
// with page r, read by the round trip that put or checked the key (whose
// header is hdr), and reads further pages, at hdr's revision too (see
// pager), only while me's rule finds no blockers. When the pages read hold
// every key ahead, the read also says which blockers' deletion alone
// admits me (releasers), so that a waiter learns it is in without reading
// the queue again (recheck). If etcd compacts the revision before a later
// page is read, it returns errPageCompacted: the caller reads the queue
// anew.
func (q *queue) scan(ctx context.Context, me entry, r, delays *pb.RangeResponse, hdr *pb.ResponseHeader) (queueRead, error) {
	read := queueRead{rev: hdr.Revision, hdr: hdr}
	admit := me.mode.rule()
	var ahead []entry
	var p *pager  // made when a second page is needed
	var own int64 // the create revision of our key in the pages (a Try's)
	kvs, more := r.Kvs, r.More
	for {
		for _, kv := range kvs {
			switch {
			case !q.isChild(kv.Key): // a nested lock's key
			case string(kv.Key) == q.key:
				own = kv.CreateRevision
			case me.rev == 0 || kv.CreateRevision < me.rev:
				ahead = append(ahead, entry{string(kv.Key), kv.CreateRevision, ParseKeyMode(kv.Value)})
			}
		}
		read.complete = !more
		if read.blockers = admit(me, ahead); len(read.blockers) > 0 {
			if read.complete && len(read.blockers) <= maxWatched {
				read.releasers = releasersOf(me, ahead, read.blockers)
			}
			// A waiter keeps its read while it waits, and the blockers
			// are a part of ahead (a Mutex's, the key just ahead of up to
			// a page): a copy keeps only them.
			read.blockers = slices.Clone(read.blockers)
			return read, nil
		}
		if read.complete {
			// Admitted by the queue: unless a hold ahead ended without
			// Unlock and its lock delay has not passed (delay.go). Every
			// key ahead was read, so a delay record's key is gone if it
			// is not among them.
			if delays != nil { // read for a lock with a delay only
				read.delays = q.pendingDelays(me, delays, func(key string, rev int64) bool {
					if key == q.key {
						return rev != 0 && (rev == me.rev || rev == own)
					}
					return slices.ContainsFunc(ahead, func(e entry) bool { return e.key == key && e.rev == rev })
				})
			}
			read.blockers = nil
			if len(read.delays) > 0 {
				read.blockers = delayBlockers(read.delays)
			}
			return read, nil
		}
		// The pages so far held only newer keys, nested locks' keys, or
		// keys that do not keep me out: read on.
		if p == nil {
			p = q.pager(me.mode, read.rev, r)
		}
		var err error
		if kvs, err = p.next(ctx); err != nil {
			return queueRead{}, q.rpcErr(err)
		}
		more = p.more
	}
}

// opQueue reads the newest keys under the prefix, newest first, with a
// create revision of at most maxRev (no bound when 0), as a waiter in mode
// needs them.
func (q *queue) opQueue(mode KeyMode, maxRev int64, extra ...clientv3.OpOption) clientv3.Op {
	if maxRev == 0 && len(extra) == 0 {
		if mode.Exclusive() {
			return clientv3.OpGet(q.prefix(), firstPageExclusive...)
		}
		return clientv3.OpGet(q.prefix(), firstPageModes...)
	}
	return clientv3.OpGet(q.prefix(), append(queueOpts(mode, clientv3.SortDescend, maxRev, 0, false), extra...)...)
}

// delayOps reads q's delay records (delay.go) with the queue, if q has a
// delay: only locks with WithLockDelay read them (and need permission
// to), so that no other Lock pays for them.
func (q *queue) delayOps(extra ...clientv3.OpOption) []clientv3.Op {
	if !q.opts.records {
		return nil
	}
	return []clientv3.Op{clientv3.OpGet(q.delayPfx(), append([]clientv3.OpOption{clientv3.WithPrefix()}, extra...)...)}
}

// rangeAt returns the range of rs[i], nil when rs has no i-th response
// (a lock without a delay reads no records).
func rangeAt(rs []*pb.ResponseOp, i int) *pb.RangeResponse {
	if i >= len(rs) {
		return nil
	}
	return rs[i].GetResponseRange()
}

// The options of the first page of a queue read without bounds, in an
// exclusive mode and in the others: every Lock and TryLock reads one, so
// they are made once (an option only reads what it captures).
var (
	firstPageExclusive = queueOpts(KeyMode{}, clientv3.SortDescend, 0, 0, false)
	firstPageModes     = queueOpts(KeyMode{Shared: true}, clientv3.SortDescend, 0, 0, false)
)

// queueOpts are the options of a range over the queue in create-revision
// order, bounded by maxRev and minRev when they are not 0. An exclusive
// waiter needs only keys (the key just ahead blocks it, whatever its mode):
// etcd 3.7 answers those from its in-memory index. The other modes read
// values, the modes of the keys ahead, in bigger pages (later ones bigger
// still).
func queueOpts(mode KeyMode, order clientv3.SortOrder, maxRev, minRev int64, later bool) []clientv3.OpOption {
	opts := []clientv3.OpOption{
		clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, order),
	}
	switch {
	case mode.Exclusive():
		opts = append(opts, clientv3.WithLimit(queueScan), clientv3.WithKeysOnly())
	case later:
		opts = append(opts, clientv3.WithLimit(modeScanMore))
	default:
		opts = append(opts, clientv3.WithLimit(modeScan))
	}
	if maxRev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(maxRev))
	}
	if minRev > 0 {
		opts = append(opts, clientv3.WithMinCreateRev(minRev))
	}
	return opts
}

// pager returns the pager of a queue read in mode at revision rev, whose
// first page was r.
func (q *queue) pager(mode KeyMode, rev int64, r *pb.RangeResponse) *pager {
	p := &pager{cli: q.s.cli, pfx: q.prefix(), rev: rev, desc: true, page: func() []clientv3.OpOption {
		return queueOpts(mode, clientv3.SortDescend, 0, 0, true)
	}}
	if mode.Exclusive() {
		p.tie = []clientv3.OpOption{clientv3.WithKeysOnly()}
	}
	p.add(r.Kvs, r.More)
	return p
}

// isChild reports whether key is a key of this lock: a direct child of the
// prefix. Keys of nested locks (name/sub/<lease>) also fall in the
// prefix's range but belong to another lock (etcd's Mutex waits on them).
func (q *queue) isChild(key []byte) bool { return isChild(q.prefix(), key) }

// releasersOf returns the keys of those of me's blockers whose deletion alone
// admits me, given every key ahead of me (newest first).
func releasersOf(me entry, ahead, blockers []entry) []string {
	var releasers []string
	for _, b := range blockers {
		if len(me.mode.rule()(me, without(ahead, b.key))) == 0 {
			releasers = append(releasers, b.key)
		}
	}
	return releasers
}

// without returns a copy of ahead without the key gone.
func without(ahead []entry, gone string) []entry {
	rest := make([]entry, 0, len(ahead))
	for _, e := range ahead {
		if e.key != gone {
			rest = append(rest, e)
		}
	}
	return rest
}
