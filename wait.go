package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxNameLen is the longest lock name accepted. A name appears several times
// in one request; this keeps requests far below etcd's default 1.5 MiB limit.
const MaxNameLen = 32 << 10

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
	// maxWatched is the most blockers a waiter watches one by one; with
	// more it watches the whole prefix for deletions.
	maxWatched = 64
)

// cleanupTimeout bounds a best-effort RPC whose failure leaves nothing
// behind that the session's lease does not remove: hold.go's unlock
// attempts, its check read and the revoke of a max hold lease. The writes
// that join the queue, and the removal of a key after a failed Lock, have
// no such bound (writeCtx): a deadline there would leave a key behind.
const cleanupTimeout = 5 * time.Second

// minBackoff and maxBackoff bound the pause before a waiter reads the
// queue again, or a write that joins or leaves it is sent again, after an
// error that passes (retryable).
const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second

// A queue is the mechanism every primitive shares: a key per session under
// name/, placed in line by its create revision; a grant rule per key mode
// that says, given the keys ahead, which of them keep a key out (its
// blockers); a waiter that watches exactly its blockers and its own key;
// and the hold that follows, with its loss watch. Mutex, RWMutex and
// Semaphore embed a queue and only state their rule.
//
// Invariant K: no code changes the mode (the value) of an existing key.
// Everything that Puts an existing key keeps its value; a key of this
// session left in another mode is deleted and created again. The one
// exception, Election.Proclaim, changes a value but never a mode: every
// election value reads as exclusive (checkValue). Every rule's
// blockers are a witness only while the keys ahead keep their modes: a
// waiter is not woken when a key it does not watch changes.
type queue struct {
	s    *Session
	name string
	pfx  string // name + "/"
	key  string // pfx + lease ID in hex

	opts *mutexOptions // read-only: may be shared (newMutexOptions)

	mu   sync.Mutex // guards h, last, and the fields of holds marked so
	h    *hold      // the current hold; nil when not held
	last *hold      // the hold that ended last, for Done and Err

	// testHookWait, when set, is called each time a waiter has set up its
	// watches and blocks for an event, with the keys it watches: its
	// blockers, or the prefix when it watches the whole lock. Tests use it
	// to know waiters are idle.
	testHookWait func(keys []string)
}

// init sets q up for the lock name of kind taken through s. (Not a
// constructor returning a queue: a queue holds a sync.Mutex and must not
// be copied.)
func (q *queue) init(s *Session, name string, kind Kind, opts []MutexOption) {
	q.s, q.name, q.pfx, q.opts = s, name, name+"/", newMutexOptions(kind, opts)
	if s != nil {
		q.key = fmt.Sprintf("%s%x", q.pfx, int64(s.Lease()))
		q.pfx = q.key[:len(q.pfx)] // one string for both
	}
}

// self returns q; through promotion, any primitive has it (export_test.go).
func (q *queue) self() *queue { return q }

// lock is Lock, RLock and Acquire (wait) and their Try forms: it takes a
// hold in mode.
func (q *queue) lock(ctx context.Context, mode KeyMode, wait bool) error {
	return q.lockValue(ctx, mode, q.value(mode), wait)
}

// lockValue is lock with the key's value given: q.value(mode), or an
// election's proposal (whose mode, read back, is exclusive). With the
// session's events, it reports the acquisition (Hooks.AcquireStart and
// AcquireDone) around take; without, it reads no clock.
func (q *queue) lockValue(ctx context.Context, mode KeyMode, val string, wait bool) error {
	if err := q.validate(); err != nil {
		return err
	}
	// A writer cannot be admitted while this value holds a read: it would
	// wait for itself (sync.RWMutex deadlocks here), and turning the read
	// key exclusive in place would let it in among the readers behind it.
	if mode.Exclusive() && q.holding(func(m KeyMode) bool { return m.Shared }) {
		return ErrUpgrade
	}
	ev := q.s.ev
	if ev == nil {
		h, err := q.take(ctx, mode, val, wait)
		if err == nil {
			q.mu.Lock()
			q.h = h
			q.mu.Unlock()
		}
		return err
	}
	li := LockInfo{Kind: q.opts.kind, Name: q.name, Mode: mode}
	if mode.Shared {
		li.Kind = KindRWMutexRead
	}
	ev.acquireStart(AcquireStartInfo{LockInfo: li, Wait: wait})
	start := monotime()
	h, err := q.take(ctx, mode, val, wait)
	done := AcquireDoneInfo{LockInfo: li, Wait: wait, Outcome: outcome(ctx, err), Err: err}
	now := monotime()
	done.Waited = now - start
	if h != nil {
		h.kind, h.since, done.Token = li.Kind, now, h.rev
	}
	// Called before the hold is q's: its HoldDone cannot come first.
	ev.acquireDone(done)
	if h != nil {
		q.mu.Lock()
		q.h = h
		q.mu.Unlock()
	}
	return err
}

// take is lockValue's acquisition, once the call is found valid: it
// returns the hold, which lockValue makes q's.
func (q *queue) take(ctx context.Context, mode KeyMode, val string, wait bool) (*hold, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := q.s.Err(); err != nil {
		return nil, err
	}
	// Stop waiting, and stop any RPC, as soon as the session ends.
	bctx, cancel := q.s.bound(ctx)
	defer cancel()
	// The right is per session and name, across primitives: they all share
	// the key name/<lease>, so one hold per session and name holds for
	// every mix of them.
	if err := q.s.acquireName(bctx, q.name, wait); err != nil {
		return nil, q.cause(ctx, err)
	}
	var rev int64
	var hdr *pb.ResponseHeader
	var err error
	if wait {
		rev, hdr, err = q.acquire(bctx, mode, val)
	} else {
		rev, hdr, err = q.tryAcquire(bctx, mode, val)
	}
	if err != nil {
		q.s.releaseName(q.name)
		return nil, q.cause(ctx, err)
	}
	h := &hold{rev: rev, mode: mode, hdr: hdr}
	if q.opts.maxHold > 0 {
		if err := q.limitHold(bctx, h); err != nil {
			q.s.releaseName(q.name)
			return nil, q.cause(ctx, err)
		}
	}
	return h, nil
}

// holding reports whether q holds, in a mode match accepts.
func (q *queue) holding(match func(KeyMode) bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.h != nil && match(q.h.mode)
}

func (q *queue) validate() error {
	if q.s == nil {
		return errorf("%w: no Session", ErrSessionExpired)
	}
	if q.opts.err != nil {
		return q.opts.err
	}
	return checkLockName(q.name)
}

// checkName returns ErrInvalidName for a name no queue can have: empty,
// or longer than MaxNameLen. Calls that only read a queue take any other
// name, so that tools can see a lock that etcd's Mutex made under a
// prefix ending in "/".
func checkName(name string) error {
	switch {
	case name == "":
		return errorf("%w: empty name", ErrInvalidName)
	case len(name) > MaxNameLen:
		return errorf("%w: name is %d bytes, longer than %d", ErrInvalidName, len(name), MaxNameLen)
	}
	return nil
}

// checkLockName is checkName for the calls that join a queue, which also
// refuse a name that ends in "/" or contains "//". The keys of a lock are
// NAME/<lease hex>, so "tr/" would queue under "tr//" and "foo//bar"
// beside "foo/bar": names that read as the same lock would be different
// locks, each granted while the other is held. A leading "/" is a common
// convention and stays valid.
func checkLockName(name string) error {
	switch {
	case strings.HasSuffix(name, "/"):
		return errorf("%w: name %q ends in \"/\": it would not be the lock %q", ErrInvalidName, name, strings.TrimRight(name, "/"))
	case strings.Contains(name, "//"):
		return errorf("%w: name %q contains \"//\"", ErrInvalidName, name)
	}
	return checkName(name)
}

// acquire joins the queue in mode and waits for its turn. It returns the
// create revision of the key and the header of the response that showed
// the hold was admitted.
func (q *queue) acquire(ctx context.Context, mode KeyMode, val string) (rev int64, hdr *pb.ResponseHeader, err error) {
	// One round trip puts the key and reads the newest keys under the
	// prefix. Read after the put in the same Txn, they show who is ahead:
	// uncontended Lock is this one RPC. If this session already has a key
	// (left by a cleanup that could not reach etcd) in the same mode, its
	// place is reused, and the Put binds it to the session's lease again
	// (it may have been bound to a WithMaxHold lease); a Put keeps the
	// create revision. A leftover in another mode is never Put (Invariant
	// K): readers behind a leftover read key may hold, and turning it
	// exclusive at its old place would let a writer in among them. It is
	// removed, and the key placed anew.
	var resp *clientv3.TxnResponse
	for attempt := 0; ; attempt++ {
		resp, err = q.join(ctx, mode, val)
		if err != nil {
			// The Txn may have been applied even though its answer was
			// lost: remove the key by name.
			return 0, nil, q.fail(ctx, 0, err)
		}
		if resp.Succeeded {
			break
		}
		in := resp.Responses[0].GetResponseTxn()
		if in.Succeeded {
			break
		}
		if attempt > 0 {
			// Someone re-created our key in another mode between the two
			// round trips: only this process uses it, so that cannot
			// happen short of a misuse of the lease.
			return 0, nil, q.fail(ctx, 0, errorf("key %s keeps its other mode", q.key))
		}
		old := in.Responses[0].GetResponseRange().Kvs
		if len(old) > 0 {
			if err := q.remove(ctx, old[0].CreateRevision); err != nil {
				return 0, nil, err
			}
		}
	}
	var page *pb.RangeResponse
	if resp.Succeeded {
		rev, page = resp.Header.Revision, resp.Responses[1].GetResponseRange()
	} else {
		in := resp.Responses[0].GetResponseTxn()
		rev = in.Responses[1].GetResponseRange().Kvs[0].CreateRevision
		page = in.Responses[2].GetResponseRange()
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, q.fail(ctx, rev, err)
	}
	w := waiter{q: q, me: entry{key: q.key, rev: rev, mode: mode}}
	w.read, err = q.scan(ctx, w.me, page, resp.Header)
	if q.retryable(ctx, err) {
		// A later page met a leader election, or a compaction of the
		// revision it was to be read at: read the queue anew, as a
		// waiter does.
		backoff := minBackoff
		w.read, err = w.reread(ctx, &backoff)
	}
	if err != nil {
		return 0, nil, q.fail(ctx, rev, err)
	}
	hdr = w.read.hdr
	if len(w.read.blockers) > 0 {
		if hdr, err = w.wait(ctx); err != nil {
			return 0, nil, q.fail(ctx, rev, err)
		}
	}
	// "Acquired after we were cancelled: pretend we didn't" (x/sync).
	if err := ctx.Err(); err != nil {
		return 0, nil, q.fail(ctx, rev, err)
	}
	return rev, hdr, nil
}

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
// ErrSessionExpired that says the key is left to the lease.
func (q *queue) join(ctx context.Context, mode KeyMode, val string) (*clientv3.TxnResponse, error) {
	backoff := minBackoff
	for {
		resp, err := q.place(ctx, mode, val)
		if err == nil {
			return resp, nil
		}
		err = q.rpcErr(err)
		if !q.retryable(ctx, err) || !pause(ctx, &backoff) {
			return nil, q.unknownWrite(ctx, err)
		}
	}
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
		return errorf("%w; the write that joins the queue of %s failed (%v) and the session has ended: the key it may have put goes with the lease: %w", cerr, q.name, err, serr)
	case serr != nil:
		return errorf("the write that joins the queue of %s failed (%v) and the session has ended: the key it may have put goes with the lease: %w", q.name, err, serr)
	case cerr != nil:
		return cerr
	}
	return err
}

// pause waits *backoff, then doubles it up to maxBackoff. It returns false,
// at once, if ctx ends first.
func pause(ctx context.Context, backoff *time.Duration) bool {
	return pauseUpTo(ctx, backoff, maxBackoff)
}

// pauseUpTo is pause with the limit of the backoff given.
func pauseUpTo(ctx context.Context, backoff *time.Duration, limit time.Duration) bool {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	}
	*backoff = min(2**backoff, limit)
	return true
}

// place is acquire's round trip: it puts the key in mode unless this
// session has one, and reads the newest keys of the queue. It is a
// function of its own to keep its many Ops out of acquire's stack frame,
// which stays on the stack while the waiter waits: with them, a waiting
// goroutine's stack could not shrink back to its initial size.
//
//go:noinline
func (q *queue) place(ctx context.Context, mode KeyMode, val string) (*clientv3.TxnResponse, error) {
	put := clientv3.OpPut(q.key, val, clientv3.WithLease(q.s.Lease()))
	wctx, cancel := q.writeCtx(ctx)
	defer cancel()
	return q.s.cli.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", 0)).
		Then(put, q.opQueue(mode, 0)).
		Else(clientv3.OpTxn(
			// Our leftover in the same mode keeps its place.
			[]clientv3.Cmp{clientv3.Compare(clientv3.Value(q.key), "=", val)},
			[]clientv3.Op{put, clientv3.OpGet(q.key), q.opQueue(mode, 0)},
			[]clientv3.Op{clientv3.OpGet(q.key)})).
		Commit()
}

// opQueue reads the newest keys under the prefix, newest first, with a
// create revision of at most maxRev (no bound when 0), as a waiter in mode
// needs them.
func (q *queue) opQueue(mode KeyMode, maxRev int64, extra ...clientv3.OpOption) clientv3.Op {
	return clientv3.OpGet(q.pfx, append(queueOpts(mode, clientv3.SortDescend, maxRev, 0, false), extra...)...)
}

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

// isChild reports whether key is a key of this lock: a direct child of the
// prefix. Keys of nested locks (name/sub/<lease>) also fall in the
// prefix's range but belong to another lock (etcd's Mutex waits on them).
func (q *queue) isChild(key []byte) bool { return isChild(q.pfx, key) }

// isChild reports whether key is a direct child of pfx (name + "/").
func isChild(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}

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
	blockers []entry  // what keeps me out, newest first (see rule); none: me is admitted at rev
	freeing  []string // the keys of the blockers whose deletion alone admits me (releasersOf); only when complete
	complete bool     // the pages read hold every key ahead of me
	// own is, for a Try only (me.rev 0), this session's own key as the
	// read found it (a key left by a cleanup that could not reach etcd).
	own *mvccpb.KeyValue
}

// scan reads the direct children of the prefix ahead of me, newest first:
// those with a create revision below me.rev, or all of them but this
// session's own key when me.rev is 0 (a Try, not in the queue). It starts
// with page r, read by the round trip that put or checked the key (whose
// header is hdr), and reads further pages, at hdr's revision too (see
// pager), only while me's rule finds no blockers. When the pages read hold
// every key ahead, the read also says which blockers' deletion alone
// admits me (freeing), so that a waiter learns it is in without reading
// the queue again (recheck). If etcd compacts the revision before a later
// page is read, it returns errPageCompacted: the caller reads the queue
// anew.
func (q *queue) scan(ctx context.Context, me entry, r *pb.RangeResponse, hdr *pb.ResponseHeader) (queueRead, error) {
	read := queueRead{rev: hdr.Revision, hdr: hdr}
	admit := me.mode.rule()
	var ahead []entry
	var p *pager // made when a second page is needed
	kvs, more := r.Kvs, r.More
	for {
		for _, kv := range kvs {
			switch {
			case !q.isChild(kv.Key): // a nested lock's key
			case string(kv.Key) == q.key:
			case me.rev == 0 || kv.CreateRevision < me.rev:
				ahead = append(ahead, entry{string(kv.Key), kv.CreateRevision, ParseKeyMode(kv.Value)})
			}
		}
		read.complete = !more
		if read.blockers = admit(me, ahead); len(read.blockers) > 0 {
			if read.complete && len(read.blockers) <= maxWatched {
				read.freeing = freeingOf(me, ahead, read.blockers)
			}
			return read, nil
		}
		if read.complete {
			read.blockers = nil
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

// pager returns the pager of a queue read in mode at revision rev, whose
// first page was r.
func (q *queue) pager(mode KeyMode, rev int64, r *pb.RangeResponse) *pager {
	p := &pager{cli: q.s.cli, pfx: q.pfx, rev: rev, desc: true, page: func() []clientv3.OpOption {
		return queueOpts(mode, clientv3.SortDescend, 0, 0, true)
	}}
	if mode.Exclusive() {
		p.tie = []clientv3.OpOption{clientv3.WithKeysOnly()}
	}
	p.add(r.Kvs, r.More)
	return p
}

// tryAcquire takes a hold in mode only if it is admitted at once, and
// writes nothing otherwise. It is admitted if its rule admits it behind
// every key of the queue (a rule that admits me behind everyone admits me
// at my place), or, for this session's own leftover key in the same mode,
// at that key's place.
func (q *queue) tryAcquire(ctx context.Context, mode KeyMode, val string) (int64, *pb.ResponseHeader, error) {
	// A read-only Txn answers "held" without a Raft write or a new
	// revision. etcd sends any Txn with a Put through Raft even when its
	// compare fails, so only an all-read request is served as a read.
	first := []clientv3.Op{q.opQueue(mode, 0), clientv3.OpGet(q.key)}
	resp, err := q.s.cli.Txn(ctx).Then(first...).Commit()
	if err != nil {
		return 0, nil, q.rpcErr(err)
	}
	for range 5 {
		var own *mvccpb.KeyValue
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			own = kvs[0]
		}
		me := entry{key: q.key, mode: mode}
		if own != nil && string(own.Value) == val {
			// This session's own key in this mode, left by a cleanup that
			// could not reach etcd: judge it at its place.
			me.rev = own.CreateRevision
		}
		read, err := q.scan(ctx, me, resp.Responses[0].GetResponseRange(), resp.Header)
		read.own = own
		if errors.Is(err, errPageCompacted) {
			// Read the queue anew.
			if resp, err = q.s.cli.Txn(ctx).Then(first...).Commit(); err != nil {
				return 0, nil, q.rpcErr(err)
			}
			continue
		}
		if err != nil {
			return 0, nil, err
		}
		if len(read.blockers) > 0 {
			return 0, nil, ErrLocked
		}
		if read.own != nil && me.rev == 0 {
			// Our leftover in another mode would be admitted behind
			// everyone: remove it and place a new key (Invariant K: it is
			// never Put in another mode).
			if err := q.remove(ctx, read.own.CreateRevision); err != nil {
				return 0, nil, err
			}
			if resp, err = q.s.cli.Txn(ctx).Then(first...).Commit(); err != nil {
				return 0, nil, q.rpcErr(err)
			}
			continue
		}
		put := clientv3.OpPut(q.key, val, clientv3.WithLease(q.s.Lease()))
		// Admitted at the read's revision: every page was read at it (see
		// pager). Take it only if nothing under the prefix changed since:
		// a waiter that queued in between must keep its turn.
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(q.pfx), "<", read.rev+1).WithPrefix()}
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
		wctx, cancel := q.writeCtx(ctx)
		tresp, err := q.s.cli.Txn(wctx).If(cmps...).Then(put).Else(first...).Commit()
		cancel()
		if err != nil {
			return 0, nil, q.fail(ctx, 0, q.unknownWrite(ctx, q.rpcErr(err)))
		}
		if tresp.Succeeded {
			rev := tresp.Header.Revision
			if read.own != nil {
				rev = read.own.CreateRevision
			}
			if err := ctx.Err(); err != nil {
				return 0, nil, q.fail(ctx, rev, err)
			}
			return rev, tresp.Header, nil
		}
		resp = tresp
	}
	// Keys kept changing under the prefix (nested locks' traffic): rather
	// than spin, report the lock as busy.
	return 0, nil, ErrLocked
}

// IsOwner returns a comparison that holds only while the current hold is
// current: use it in Txn().If to make a write conditional on the lock.
// When nothing is held the comparison never holds. Under an RWMutex's read
// lock it guards reads; guard writes only under a write lock.
func (q *queue) IsOwner() clientv3.Cmp {
	rev := int64(-1) // no key has create revision -1; 0 would match a missing key
	q.mu.Lock()
	if q.h != nil {
		rev = q.h.rev
	}
	q.mu.Unlock()
	return clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)
}

// Key returns the key used in etcd: name/<lease ID in hex>.
func (q *queue) Key() string { return q.key }

// Header returns the header of the etcd response that showed the current
// hold was admitted, or nil when nothing is held.
func (q *queue) Header() *pb.ResponseHeader {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h == nil {
		return nil
	}
	return q.h.hdr
}

// Token returns the fencing token of the current hold: the create revision
// of the holder's key. A hold admitted after a hold that excludes it has a
// larger token (successive Mutex holders' tokens strictly increase), so a
// resource that remembers the highest token it has seen can reject a
// stale holder. Token returns 0 when nothing is held; after a loss it
// returns the lost hold's token until it is released.
func (q *queue) Token() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h == nil {
		return 0
	}
	return q.h.rev
}

// writeCtx returns a context for a write whose outcome must be known: it
// outlives ctx's cancellation and deadline, so that Lock never gives up on
// a Put whose fate is unknown (a Put applied after the cleanup's Delete
// would leave a key that blocks the queue until the session ends). It ends
// only with the session, and needs no other bound: the key is bound to the
// session's lease, so once the session has ended nothing the write does
// outlives the lease. Lock checks ctx right after the write. A deadline of
// the library's own here made Locks with no deadline fail under load with
// a context.DeadlineExceeded their callers could not tell from their own.
func (q *queue) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return q.s.bound(context.WithoutCancel(ctx))
}

// cause returns err, or the session's end when that is what stopped a call
// made with ctx bound to the session.
func (q *queue) cause(ctx context.Context, err error) error {
	if serr := q.s.Err(); serr != nil && ctx.Err() == nil && !errors.Is(err, ErrSessionExpired) {
		return serr
	}
	return err
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
	if q.s.Err() != nil {
		return err
	}
	if cerr := q.remove(ctx, rev); cerr != nil {
		return join(err, cerr)
	}
	return err
}

// remove deletes this queue's key if its create revision is rev (by name
// when rev is 0), with a context that is not the cancelled one (writeCtx):
// a key left behind would block the queue for as long as the session
// lives. It sends the Delete again after an error that passes (retryable),
// which is safe however many land, while the session lasts. Once the
// session has ended the key goes with the lease, and remove returns nil.
func (q *queue) remove(ctx context.Context, rev int64) error {
	cctx, cancel := q.writeCtx(ctx)
	defer cancel()
	var cmps []clientv3.Cmp
	if rev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev))
	}
	backoff := minBackoff
	for {
		_, err := q.s.cli.Txn(cctx).If(cmps...).Then(clientv3.OpDelete(q.key)).Commit()
		if err == nil || q.s.Err() != nil {
			return nil
		}
		if !q.retryable(cctx, err) || !pause(cctx, &backoff) {
			if q.s.Err() != nil {
				return nil
			}
			return errorf("remove %s after failed lock: %w", q.key, err)
		}
	}
}

// rpcErr maps etcd's "lease not found" to ErrSessionExpired.
func (q *queue) rpcErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		q.s.lost()
		return errorf("%w: %w", ErrSessionExpired, err)
	}
	return err
}

// errWatchBroken says a watch ended without the event it waited for: the
// stream broke, the member lost its leader, or a resumed watch hit a
// compacted revision. The waiter reads the queue again and re-watches.
var errWatchBroken = errors.New("etcdlock: watch broken")

// A waiter is a key in line, me, waiting for its turn: the queue ahead of
// it as it last read it, and, while it watches, its watches. It carries
// what the steps of a wait share, so that each step (watchTurn, rewatch,
// waitDelete, recheck) reads it rather than being passed it. A waiter is
// used by one goroutine, the Lock's.
type waiter struct {
	q    *queue
	me   entry
	read queueRead // the queue ahead of me as last read: blockers and freeing at read.rev

	// While it watches (watchTurn): the watch of its own key, what its
	// watches tell it, the watches of its blockers (or of the prefix), and
	// the latest revision at which a watch opened since the last read was
	// made by etcd (0: none).
	own         *keyWatch
	ww          *waitWatch
	watches     []*blockerWatch
	watchedFrom int64
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

// retryable reports whether a waiter may try again after err: a broken
// watch, or an etcd error that passes (no leader, leader changed, a
// timeout inside etcd, a member out of reach), while ctx and the session
// last.
func (q *queue) retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || q.s.Err() != nil {
		return false
	}
	return passing(err)
}

// passing reports whether err passes: a broken watch, or an etcd error
// that a later attempt may not meet.
func passing(err error) bool {
	if errors.Is(err, errWatchBroken) || errors.Is(err, errPageCompacted) {
		return true
	}
	// "Not capable": a member that has just started and does not yet know
	// the cluster's version.
	if errors.Is(err, rpctypes.ErrNotCapable) {
		return true
	}
	// A proposal the leader dropped (it was handing its leadership over)
	// was never applied. etcd sends raft's error with code Unknown.
	if rpctypes.ErrorDesc(err) == errProposalDropped {
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

// errProposalDropped is raft's ErrProposalDropped as etcd sends it.
const errProposalDropped = "raft proposal dropped"

// watched returns the keys a waiter with blockers watches: each blocker,
// or the prefix when they are more than maxWatched. A capacity far above
// the typical weight makes a Semaphore's window that wide; no scheme
// without extra writes can watch fewer keys (any of those holders' release
// admits the waiter), so it watches every deletion of the lock instead.
func (q *queue) watched(blockers []entry) []string {
	if len(blockers) > maxWatched {
		return []string{q.pfx}
	}
	keys := make([]string, len(blockers))
	for i, b := range blockers {
		keys[i] = b.key
	}
	return keys
}

// watchTurn waits until me's rule admits it, starting from w.read, which
// has blockers. It returns the header of the response that showed me
// admitted, or errWatchBroken when a watch fails.
func (w *waiter) watchTurn(ctx context.Context) (*pb.ResponseHeader, error) {
	q := w.q
	// The waiter's own key and its blockers are watched on the session's
	// watch stream (see lossWatcher), which requires a leader: a member cut
	// off from the leader ends the stream rather than leaving it silent
	// while the lock moves on elsewhere. The own key is watched from its
	// creation on: a deletion after me.rev is its end, and no read is
	// needed for the time before the watch.
	w.own, w.ww = q.s.watcher.watchOwn(q, w.me.rev, w.me.mode.Shared)
	w.watches, w.watchedFrom = nil, 0
	defer func() {
		q.s.watcher.stopBlockers(w.watches)
		q.s.watcher.stop(ctx, w.own)
		w.own, w.ww, w.watches = nil, nil, nil
	}()
	for {
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

		if q.testHookWait != nil {
			q.testHookWait(keys)
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

// rewatch makes w.watches watch exactly keys (of w.read's blockers): it
// stops the watches of keys no longer wanted, opens the new ones together
// (a Semaphore's waiter can have several), waits until etcd has made them,
// and raises w.watchedFrom to the latest revision at which one was made.
func (w *waiter) rewatch(ctx context.Context, keys []string) error {
	q, lw, ww := w.q, w.q.s.watcher, w.ww
	var kept, stopped []*blockerWatch
	for _, b := range w.watches {
		if slices.Contains(keys, b.key) {
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
		if slices.ContainsFunc(kept, func(b *blockerWatch) bool { return b.key == k }) {
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
		gone, broken := ww.gone, ww.broken
		lw.mu.Unlock()
		switch {
		case gone:
			return q.lostWhileWaiting(ctx)
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

// waitDelete returns the revision of the first deletion of a blocker (or
// change of its mode) seen after w.read.rev, when all were seen alive, and
// the key deleted ("" for a change of mode). It returns lostWhileWaiting's
// error when the waiter's own key is gone.
func (w *waiter) waitDelete(ctx context.Context) (int64, string, error) {
	lw, ww := w.q.s.watcher, w.ww
	for {
		lw.mu.Lock()
		evs, gone, broken := ww.take()
		lw.mu.Unlock()
		if gone {
			return 0, "", w.q.lostWhileWaiting(ctx)
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
	prefix := e.b.key == w.q.pfx
	if ev.Type == mvccpb.PUT {
		// Only a reader sees Puts: a Downgrade changes the mode;
		// WithMaxHold's re-binding and a holder's record do not.
		return ev.Kv.ModRevision, "", !prefix && ParseKeyMode(ev.Kv.Value) != e.b.mode
	}
	switch {
	case !prefix:
		return ev.Kv.ModRevision, e.b.key, true
	case !w.q.isChild(ev.Kv.Key):
		return 0, "", false
	}
	// A key ahead went (or one we cannot tell: look).
	return ev.Kv.ModRevision, string(ev.Kv.Key), ev.PrevKv == nil || ev.PrevKv.CreateRevision < w.me.rev
}

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
	resp, err := w.readIfMine(ctx, minRev, func(opts ...clientv3.OpOption) clientv3.Op {
		return w.q.opQueue(me.mode, me.rev-1, opts...)
	})
	if err != nil {
		return queueRead{}, err
	}
	return w.q.scan(ctx, me, resp.Responses[0].GetResponseRange(), resp.Header)
}

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
	if gone != "" && slices.Contains(w.read.freeing, gone) {
		return w.confirm(ctx, at)
	}
	// Otherwise one round trip checks that my key is still mine and finds
	// what, if anything, keeps me out now.
	return w.check(ctx, at)
}

// confirm is check for a waiter known to be admitted if its key is still
// its own: one round trip reads that key's count only, and no key ahead.
// Its read has no blockers, and the header of the response that showed
// the key is still its own.
//
//go:noinline
func (w *waiter) confirm(ctx context.Context, minRev int64) (queueRead, error) {
	key := w.q.key
	resp, err := w.readIfMine(ctx, minRev, func(opts ...clientv3.OpOption) clientv3.Op {
		return clientv3.OpGet(key, append(opts, clientv3.WithCountOnly())...)
	})
	if err != nil {
		return queueRead{}, err
	}
	return queueRead{rev: resp.Header.Revision, hdr: resp.Header}, nil
}

// readIfMine runs op (a range, given extra options) in a Txn that succeeds
// only while my key is still mine, as of minRev or later (see check). It
// returns lostWhileWaiting's error when the key is gone.
//
//go:noinline
func (w *waiter) readIfMine(ctx context.Context, minRev int64, op func(...clientv3.OpOption) clientv3.Op) (*clientv3.TxnResponse, error) {
	q := w.q
	cmp := clientv3.Compare(clientv3.CreateRevision(q.key), "=", w.me.rev)
	var resp *clientv3.TxnResponse
	if minRev > 0 {
		r, err := q.s.cli.Txn(ctx).If(cmp).Then(op(clientv3.WithSerializable())).Commit()
		if err != nil {
			return nil, q.rpcErr(err)
		}
		if r.Header.Revision >= minRev {
			resp = r
		}
	}
	if resp == nil {
		r, err := q.s.cli.Txn(ctx).If(cmp).Then(op()).Commit()
		if err != nil {
			return nil, q.rpcErr(err)
		}
		resp = r
	}
	if !resp.Succeeded {
		return nil, q.lostWhileWaiting(ctx)
	}
	return resp, nil
}

// freeingOf returns the keys of those of me's blockers whose deletion alone
// admits me, given every key ahead of me (newest first).
func freeingOf(me entry, ahead, blockers []entry) []string {
	var freeing []string
	for _, b := range blockers {
		if len(me.mode.rule()(me, without(ahead, b.key))) == 0 {
			freeing = append(freeing, b.key)
		}
	}
	return freeing
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

// lostWhileWaiting says why a waiter's key disappeared: ErrSessionExpired if
// the session's lease is gone (and the session ends with it), else
// ErrLockLost: someone deleted the key.
func (q *queue) lostWhileWaiting(ctx context.Context) error {
	if err := q.s.Err(); err != nil {
		return err
	}
	cause := q.keyGone(ctx, 0)
	if errors.Is(cause, ErrSessionExpired) {
		return cause
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errorf("%w while waiting: %w", ErrLockLost, cause)
}

// keyGone says why this queue's key is gone, asking etcd whether the lease
// it was bound to still exists: the session's lease, or maxLease when not
// 0. If the session's lease is gone, the session ends now (rather than at
// its next renewal) and its error is returned: "lease ... was revoked or
// expired". Else the key was deleted. It costs one RPC, on the loss path
// only.
func (q *queue) keyGone(ctx context.Context, maxLease clientv3.LeaseID) error {
	lease := q.s.Lease()
	if maxLease != 0 {
		lease = maxLease
	}
	resp, err := q.s.cli.TimeToLive(ctx, lease)
	switch {
	case err != nil:
		return errorf("key %s is gone (lease check failed: %v)", q.key, err)
	case resp.TTL >= 0: // 0 is a live lease with under 1s left
		return errorf("key %s was %w", q.key, errDeleted)
	case maxLease != 0:
		return errorf("max hold lease %x was %w", maxLease, errRevokedOrExpired)
	}
	q.s.lost()
	return q.s.Err()
}
