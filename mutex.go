package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxNameLen is the longest lock name accepted. A name appears several times
// in one request; this keeps requests far below etcd's default 1.5 MiB limit.
const MaxNameLen = 32 << 10

// queueScan is how many keys one range reads when looking for an owner or a
// predecessor. Only direct children of name/ count, so a few extra keys
// leave room for nested locks' keys (name/sub/<lease>) without another RPC.
const queueScan = 8

// cleanupTimeout bounds the RPC that removes a key after a failed Lock.
const cleanupTimeout = 5 * time.Second

// A Mutex is a fair distributed lock on etcd. Waiters queue in the order
// their keys were created (their create revision) and get the lock in that
// order; each waiter watches only the key just ahead of it, so a release
// wakes exactly one waiter.
//
// The key is name + "/" + the session's lease ID in hex, the layout of
// etcd's concurrency.Mutex and `etcdctl lock`, so both can share a lock name.
//
// A Mutex is safe for concurrent use, like sync.Mutex: while it is held,
// Lock from another goroutine waits and TryLock returns ErrLocked. Two
// Mutex values of one Session and name exclude each other too.
//
// Holding the lock is not, by itself, mutual exclusion: a holder that is
// paused or cut off longer than its TTL loses the lock while it still runs.
// Guard writes to etcd with IsOwner, and writes elsewhere with Token.
type Mutex struct {
	s    *Session
	name string
	pfx  string // name + "/"
	key  string // pfx + lease ID in hex

	opts mutexOptions

	mu   sync.Mutex // guards h, last, and the fields of holds marked so
	h    *hold      // the current hold; nil when not held
	last *hold      // the hold that ended last, for Done and Err

	// testHookWait, when set, is called each time a waiter has set up its
	// watches and blocks for an event, with the key it watches. Tests use it
	// to know waiters are idle.
	testHookWait func(pred string)
}

// NewMutex returns a Mutex for the lock called name, taken through session
// s. The name is checked by Lock and TryLock, which return ErrInvalidName
// for an empty name or one longer than MaxNameLen. Names may contain "/": a
// lock named "jobs/cleanup" never blocks one named "jobs" or the reverse.
//
// Invalid options are reported by Lock and TryLock, as ErrInvalidOption.
func NewMutex(s *Session, name string, opts ...MutexOption) *Mutex {
	m := &Mutex{s: s, name: name, pfx: name + "/", opts: newMutexOptions(opts)}
	if s != nil {
		m.key = fmt.Sprintf("%s%x", m.pfx, int64(s.Lease()))
	}
	return m
}

// Lock blocks until the lock is held, ctx ends, or the session ends.
//
// On failure Lock leaves no key under the lock's prefix (if etcd cannot be
// reached to remove it, or the session has ended, the key goes with the
// session's lease) and returns
// ctx's error (errors.Is(err, context.DeadlineExceeded) or
// context.Canceled), an error matching ErrSessionExpired, ErrInvalidName,
// or etcd's error. If the lock was granted just as ctx ended, it is released
// again and Lock returns ctx's error. If ctx ends while the write that joins
// the queue is in flight, Lock lets that one write finish (it is bounded by
// the session and by 5s) so that it knows which key to remove: giving up on
// it could leave a key that blocks the queue until the session ends.
//
// While it waits, Lock rides out broken watches and leader elections: the
// queue keeps its place, and only ctx or the session's end make it leave.
func (m *Mutex) Lock(ctx context.Context) error { return m.lock(ctx, true) }

// TryLock takes the lock if no one holds it or waits for it, and otherwise
// returns ErrLocked at once without joining the queue. A held lock costs one
// read-only RPC and writes nothing; a free one costs one read and one write.
// The write is guarded so that TryLock can never jump ahead of a waiter.
// After failure nothing of this Mutex is left under the lock's prefix.
func (m *Mutex) TryLock(ctx context.Context) error { return m.lock(ctx, false) }

func (m *Mutex) lock(ctx context.Context, wait bool) error {
	if err := m.validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := m.s.Err(); err != nil {
		return err
	}
	// Stop waiting, and stop any RPC, as soon as the session ends.
	bctx, cancel := m.s.bound(ctx)
	defer cancel()
	release, err := m.s.acquireName(bctx, m.name, wait)
	if err != nil {
		return m.cause(ctx, err)
	}
	var rev int64
	var hdr *pb.ResponseHeader
	if wait {
		rev, hdr, err = m.acquire(bctx)
	} else {
		rev, hdr, err = m.tryAcquire(bctx)
	}
	if err != nil {
		release()
		return m.cause(ctx, err)
	}
	h := &hold{rev: rev, hdr: hdr, release: release, done: make(chan struct{})}
	if m.opts.maxHold > 0 {
		if err := m.limitHold(bctx, h); err != nil {
			release()
			return m.cause(ctx, err)
		}
	}
	m.mu.Lock()
	m.h = h
	m.mu.Unlock()
	return nil
}

func (m *Mutex) validate() error {
	if m.s == nil {
		return errorf("%w: Mutex has no Session", ErrSessionExpired)
	}
	if m.opts.err != nil {
		return m.opts.err
	}
	if m.name == "" {
		return errorf("%w: empty name", ErrInvalidName)
	}
	if len(m.name) > MaxNameLen {
		return errorf("%w: name is %d bytes, longer than %d", ErrInvalidName, len(m.name), MaxNameLen)
	}
	return nil
}

// acquire joins the queue and waits for its turn. It returns the create
// revision of the key and the header of the response that showed the lock
// was ours.
func (m *Mutex) acquire(ctx context.Context) (rev int64, hdr *pb.ResponseHeader, err error) {
	// One round trip puts the key and reads the newest keys under the
	// prefix. Read after the put in the same Txn, they show who is just
	// ahead: uncontended Lock is this one RPC. If this session already has
	// a key (left by a cleanup that could not reach etcd), its place is
	// reused, and the Put binds it to the session's lease again (it may
	// have been bound to a WithMaxHold lease); a Put keeps the create
	// revision.
	put := clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.Lease()))
	wctx, cancel := m.writeCtx(ctx)
	resp, err := m.s.cli.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", 0)).
		Then(put, m.opQueue(0)).
		Else(put, clientv3.OpGet(m.key), m.opQueue(0)).
		Commit()
	cancel()
	if err != nil {
		// The Txn may have been applied even though its answer was lost.
		return 0, nil, m.fail(ctx, 0, m.rpcErr(err))
	}
	queue := resp.Responses[1].GetResponseRange()
	if resp.Succeeded {
		rev = resp.Header.Revision
	} else {
		rev = resp.Responses[1].GetResponseRange().Kvs[0].CreateRevision
		queue = resp.Responses[2].GetResponseRange()
	}
	if err := ctx.Err(); err != nil {
		return 0, nil, m.fail(ctx, rev, err)
	}
	pred, hdr, err := m.predecessor(ctx, rev, queue, resp.Header)
	if err != nil {
		return 0, nil, m.fail(ctx, rev, err)
	}
	if pred != "" {
		if hdr, err = m.wait(ctx, rev, pred, hdr.Revision); err != nil {
			return 0, nil, m.fail(ctx, rev, err)
		}
	}
	// "Acquired after we were cancelled: pretend we didn't" (x/sync).
	if err := ctx.Err(); err != nil {
		return 0, nil, m.fail(ctx, rev, err)
	}
	return rev, hdr, nil
}

// opQueue reads the newest keys under the prefix, newest first, with a
// create revision of at most maxRev (no bound when 0).
func (m *Mutex) opQueue(maxRev int64, extra ...clientv3.OpOption) clientv3.Op {
	return clientv3.OpGet(m.pfx, append(queueOpts(clientv3.SortDescend, maxRev, 0), extra...)...)
}

// queueOpts are the options of a range over the queue in create-revision
// order, bounded by maxRev and minRev when they are not 0. Keys only:
// values are empty, and the server answers from its in-memory index.
func queueOpts(order clientv3.SortOrder, maxRev, minRev int64) []clientv3.OpOption {
	opts := []clientv3.OpOption{
		clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, order),
		clientv3.WithLimit(queueScan),
		clientv3.WithKeysOnly(),
	}
	if maxRev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(maxRev))
	}
	if minRev > 0 {
		opts = append(opts, clientv3.WithMinCreateRev(minRev))
	}
	return opts
}

// isChild reports whether key is a waiter's key of this lock: a direct
// child of the prefix. Keys of nested locks (name/sub/<lease>) also fall in
// the prefix's range but belong to another lock (etcd's Mutex waits on them).
func (m *Mutex) isChild(key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), m.pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}

// predecessor finds the direct child with the highest create revision below
// rev in r (the newest keys, newest first), reading further pages only when
// nested locks' keys filled r. It returns "" when no key is ahead, and the
// header of the last response read.
func (m *Mutex) predecessor(ctx context.Context, rev int64, r *pb.RangeResponse, hdr *pb.ResponseHeader) (string, *pb.ResponseHeader, error) {
	for {
		low := rev
		for _, kv := range r.Kvs {
			low = kv.CreateRevision
			if kv.CreateRevision < rev && m.isChild(kv.Key) {
				return string(kv.Key), hdr, nil
			}
		}
		if !r.More {
			return "", hdr, nil
		}
		// The page held only newer keys or nested locks' keys: read on.
		// A key created since cannot be ahead of ours, so a later read is
		// as good as one at the page's revision.
		resp, err := m.s.cli.Get(ctx, m.pfx, queueOpts(clientv3.SortDescend, low-1, 0)...)
		if err != nil {
			return "", nil, m.rpcErr(err)
		}
		r, hdr = (*pb.RangeResponse)(resp), resp.Header
	}
}

// tryAcquire takes the lock only if no direct child of the prefix exists.
func (m *Mutex) tryAcquire(ctx context.Context) (int64, *pb.ResponseHeader, error) {
	// A plain read answers "held" without a Raft write or a new revision.
	// etcd sends any Txn with a Put through Raft even when its compare
	// fails, so only an all-read request is served as a read.
	first := clientv3.OpGet(m.pfx, queueOpts(clientv3.SortAscend, 0, 0)...)
	gresp, err := m.s.cli.Do(ctx, first)
	if err != nil {
		return 0, nil, m.rpcErr(err)
	}
	r := (*pb.RangeResponse)(gresp.Get())
	for range 5 {
		var head *mvccpb.KeyValue
		head, r, err = m.head(ctx, r)
		if err != nil {
			return 0, nil, err
		}
		put := clientv3.OpPut(m.key, "", clientv3.WithLease(m.s.Lease()))
		cmp := clientv3.Compare(clientv3.ModRevision(m.pfx), "<", r.Header.Revision+1).WithPrefix()
		if head != nil {
			if string(head.Key) != m.key {
				return 0, nil, ErrLocked
			}
			// This session's own key, left by a cleanup that could not
			// reach etcd, is first in line: the lock is ours. Bind the
			// key to the session's lease again (it may be bound to a
			// WithMaxHold lease); a Put keeps its create revision.
			cmp = clientv3.Compare(clientv3.CreateRevision(m.key), "=", head.CreateRevision)
		}
		// Free at r's revision. Take it only if nothing under the prefix
		// changed since: a waiter that queued in between must keep its turn.
		wctx, cancel := m.writeCtx(ctx)
		tresp, err := m.s.cli.Txn(wctx).If(cmp).Then(put).Else(first).Commit()
		cancel()
		if err != nil {
			return 0, nil, m.fail(ctx, 0, m.rpcErr(err))
		}
		if tresp.Succeeded {
			rev := tresp.Header.Revision
			if head != nil {
				rev = head.CreateRevision
			}
			if err := ctx.Err(); err != nil {
				return 0, nil, m.fail(ctx, rev, err)
			}
			return rev, tresp.Header, nil
		}
		r = tresp.Responses[0].GetResponseRange()
	}
	// Keys kept changing under the prefix (nested locks' traffic): rather
	// than spin, report the lock as busy.
	return 0, nil, ErrLocked
}

// head returns the oldest direct child in r (oldest first), reading further
// pages when nested locks' keys filled r; nil when there is none. It also
// returns the last page read, whose header tells the revision of the answer.
func (m *Mutex) head(ctx context.Context, r *pb.RangeResponse) (*mvccpb.KeyValue, *pb.RangeResponse, error) {
	for {
		var last int64
		for _, kv := range r.Kvs {
			last = kv.CreateRevision
			if m.isChild(kv.Key) {
				return kv, r, nil
			}
		}
		if !r.More {
			return nil, r, nil
		}
		// A key created since the page was read is newer than all of it,
		// so the next page finds it: no need to pin the revision.
		resp, err := m.s.cli.Get(ctx, m.pfx, queueOpts(clientv3.SortAscend, 0, last+1)...)
		if err != nil {
			return nil, nil, m.rpcErr(err)
		}
		r = (*pb.RangeResponse)(resp)
	}
}

// Unlock releases the lock. It deletes the key only if it is still the key
// this hold created (same create revision), so it can never delete another
// holder's key, also when retried (etcd issue 22082).
//
// It returns nil when the hold ended with this Unlock, ErrLockReleased if
// the Mutex is not held (Unlock before Lock, double Unlock), and
// ErrLockLost only when the hold is known to have ended before Unlock
// began (before its first attempt that was sent, if it is retried): Done or
// Err had reported the loss, the session had ended, the WithMaxHold limit
// had passed, or etcd answered that the key was gone (deleted, or its lease
// revoked or expired) while no earlier attempt could have deleted it.
// After any of these the Mutex is not held.
//
// If the RPC fails (etcd unreachable, ctx ended), its delete may have been
// applied or not: the Mutex stays held, and Unlock may be called again. A
// retry that finds the key gone returns nil. That is not proof: the first
// attempt may have deleted the key, or someone else may have (or its lease
// ended) before it arrived, and etcd keeps nothing that tells the two
// apart. Either way the hold is over, and it was not known to be lost when
// Unlock began. Likewise, if the key goes while such an attempt is in
// flight or between attempts, Done closes and Err stays nil. An attempt
// that was not sent (ctx had ended, the client was closed) counts for
// nothing. If the session ends while Unlock cannot reach etcd, Unlock ends
// the hold and returns an error matching ErrSessionExpired, not
// ErrLockLost: the key goes with the session's lease.
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	h := m.h
	if h == nil || h.unlocking {
		m.mu.Unlock()
		return ErrLockReleased
	}
	if !h.sent {
		// What is known when Unlock begins; nothing later is a loss
		// before Unlock.
		h.lostBefore = h.err
		if h.lostBefore == nil {
			h.lostBefore = m.unwatchedLoss(h)
		}
	}
	lost, retry := h.lostBefore, h.maybeDeleted
	// An attempt that is not sent leaves no doubt about the key.
	notSent := ctx.Err()
	if cerr := m.s.cli.Ctx().Err(); cerr != nil {
		// A closed client can send nothing (and ends the session).
		notSent = errorf("%w: %w", errClientClosed, cerr)
	}
	// After a loss the delete only tidies up; it is not needed when the
	// key went with the session's lease.
	send := notSent == nil && (lost == nil || h.maxLease != 0 || !m.s.leaseIsGone())
	h.unlocking = true // a second Unlock now gets ErrLockReleased
	h.sent = h.sent || send
	m.mu.Unlock()

	var resp *clientv3.TxnResponse
	err := notSent
	if send {
		resp, err = m.s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", h.rev)).
			Then(clientv3.OpDelete(m.key)).
			Commit()
	}
	var endErr error // the hold's Err once it ended
	switch {
	case lost != nil:
		err, endErr = lost, lost
	case err == nil && resp.Succeeded:
	case err == nil && !retry:
		// No attempt of ours can have deleted the key: it was gone
		// before Unlock.
		err = errorf("%w before Unlock: %w", ErrLockLost, m.keyGone(ctx, h.maxLease))
		endErr = err
	case err == nil:
		// An earlier attempt may have deleted the key: not known lost.
	default:
		if serr := m.s.Err(); serr != nil {
			// The session ended after Unlock began: the key goes with
			// its lease. The hold ends; it was not known to be lost.
			err = errorf("unlock %s: %v; the session ended, the key goes with its lease: %w", m.key, err, serr)
			break
		}
		m.mu.Lock()
		h.unlocking = false
		h.maybeDeleted = h.maybeDeleted || send
		if h.goneMidUnlock && !h.ended {
			// The loss watch saw the hold end while the RPC ran, and
			// has stopped: Done tells now that the hold is over.
			h.ended = true
			close(h.done)
		}
		m.mu.Unlock()
		return errorf("unlock %s: %w", m.key, err)
	}
	m.endHold(ctx, h, endErr)
	m.revokeMaxHold(ctx, h)
	m.mu.Lock()
	m.h, m.last = nil, h
	m.mu.Unlock()
	h.release()
	return err
}

// IsOwner returns a comparison that holds only while this Mutex's hold is
// current: use it in Txn().If to make a write conditional on the lock.
// When the Mutex is not held the comparison never holds.
func (m *Mutex) IsOwner() clientv3.Cmp {
	rev := int64(-1) // no key has create revision -1; 0 would match a missing key
	m.mu.Lock()
	if m.h != nil {
		rev = m.h.rev
	}
	m.mu.Unlock()
	return clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev)
}

// Key returns the key this Mutex uses in etcd: name/<lease ID in hex>.
func (m *Mutex) Key() string { return m.key }

// Header returns the header of the etcd response that showed the lock was
// acquired, or nil when the Mutex is not held.
func (m *Mutex) Header() *pb.ResponseHeader {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return nil
	}
	return m.h.hdr
}

// Token returns the fencing token of the current hold: the create revision
// of the holder's key. Tokens of successive holders of one lock strictly
// increase, so a resource that remembers the highest token it has seen can
// reject a stale holder. Token returns 0 when the Mutex is not held; after
// a loss it returns the lost hold's token until Unlock.
func (m *Mutex) Token() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return 0
	}
	return m.h.rev
}

// writeCtx returns a context for a write whose outcome must be known: it
// outlives ctx's cancellation, so that Lock never gives up on a Put whose
// fate is unknown (a Put applied after the cleanup's Delete would leave a
// key that blocks the queue until the session ends). It ends with the
// session, or after cleanupTimeout. Lock checks ctx right after the write.
func (m *Mutex) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := m.s.bound(context.WithoutCancel(ctx))
	tctx, tcancel := context.WithTimeout(bctx, cleanupTimeout)
	return tctx, func() {
		tcancel()
		cancel()
	}
}

// cause returns err, or the session's end when that is what stopped a call
// made with ctx bound to the session.
func (m *Mutex) cause(ctx context.Context, err error) error {
	if serr := m.s.Err(); serr != nil && ctx.Err() == nil && !errors.Is(err, ErrSessionExpired) {
		return serr
	}
	return err
}

// fail removes this Mutex's key after a failed Lock and returns err (joined
// with the cleanup's error if that failed too). rev is the key's create
// revision, or 0 when it is unknown because a Txn's outcome is unknown: then
// the key is deleted by name, which is safe because the session-local name
// lock makes this call the only user of the key in the process.
//
// When the session has ended, the key is left to its lease: Close revoked
// it, or it is expiring, and etcd may be out of reach.
func (m *Mutex) fail(ctx context.Context, rev int64, err error) error {
	if m.s.Err() != nil {
		return err
	}
	// Clean up with a context that is not the cancelled one.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	txn := m.s.cli.Txn(cctx)
	if rev != 0 {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(m.key), "=", rev))
	}
	if _, cerr := txn.Then(clientv3.OpDelete(m.key)).Commit(); cerr != nil {
		return join(err, errorf("remove %s after failed lock: %w", m.key, cerr))
	}
	return err
}

// rpcErr maps etcd's "lease not found" to ErrSessionExpired.
func (m *Mutex) rpcErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		m.s.lost()
		return errorf("%w: %w", ErrSessionExpired, err)
	}
	return err
}
