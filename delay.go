package etcdlock

import (
	"context"
	"strconv"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The lock delay (WithLockDelay). A hold with a delay writes a record,
// LockDelayPrefix + its key, once it is admitted (in the Txn that admits
// it when it can: place, tryPut, a Mutex waiter's read); its Unlock
// deletes the
// record in the Txn that deletes the key. So a record whose key is gone
// (or has another create revision) says its hold ended without Unlock:
// the lease ended (expiry, revoke, Session.Close), someone deleted the key,
// or the hold was lost. Such a record is a pending delay: it keeps out
// every waiter with a delay behind its hold, whatever delay that waiter
// asked for, as a blocker watched like any.
//
// etcd has no clock a client can read, but a lease is one: the first
// waiter that finds a pending record with no lease (the delay has not
// begun) grants a lease with the record's TTL and moves the record onto
// it, in a Txn guarded by the record's mod revision, so that only one
// waiter's lease takes it. The record goes when that lease ends, by
// etcd's clock, no sooner than the TTL after the grant, which came after
// the read that saw the key gone: so after the key went. Every waiter
// then watches the same deletion. Nothing needs the waiters' clocks, nor
// that they agree on a delay: the delay is the one the ended hold asked
// for.

// MaxLockDelay is the longest delay WithLockDelay accepts.
const MaxLockDelay = 24 * time.Hour

// WithLockDelay makes the lock stay free for d after a hold of this
// lock ends without Unlock: when the holder's lease ends (it crashed, it
// was cut off from etcd, or Session.Close revoked the lease with the lock
// held), when someone deletes its key, or when the hold is lost. Writes the
// holder still had in flight then land before the next holder starts:
// the protection for a resource that cannot check a fencing token
// (Chubby's and Consul's lock-delay). Unlock hands over at once, and so
// does Unlock followed by Session.Close.
//
// Give it to every Mutex, RWMutex or Semaphore of the lock: only locks
// with a delay honour one (a lock without it reads no delay records, and
// needs no permission on them), and etcd's Mutex, `etcdctl lock`, a
// MultiMutex or an Election never do. The delay a lock waits out is the
// one the ended hold asked for, not its own: waiters that ask for
// different delays still agree. The waiter the queue admits next finds
// the delay and starts it as an etcd lease with TTL d, and is admitted
// when that lease ends: no sooner than d after the key went, by etcd's
// clock alone. d rounds up to whole seconds, and etcd raises a TTL below
// its minimum lease TTL (2 s by default) to it. When nobody waits as the
// key goes, the delay starts with the next Lock or TryLock (TryLock
// returns ErrLocked and starts it), which then waits d: etcd records no
// time a later waiter could count from.
//
// A waiter writes nothing for it, so a waiter that dies delays nobody. A
// Lock whose write's answer was lost and whose session ended before it
// could learn the outcome leaves the record that write may have put: the
// next holder then waits the delay out, on the safe side. An
// uncontended Lock and a TryLock write the record in the Txn that takes
// the lock, a Mutex's waiter in the read that finds it admitted (which
// is then a write), and Unlock deletes it in the Txn that releases: no
// RPC of its own. A reader or a Semaphore's waiter admitted after waiting
// writes it in one more RPC. The queue's reads carry one more range. Values below
// MinTTL or above MaxLockDelay are an error, as is the option on a
// MultiMutex. Default: no delay.
func WithLockDelay(d time.Duration) MutexOption {
	return func(o *mutexOptions) error {
		switch {
		case d < MinTTL:
			return errorf("%w: lock delay %v is below the minimum %v", ErrInvalidOption, d, MinTTL)
		case d > MaxLockDelay:
			return errorf("%w: lock delay %v is above the maximum %v", ErrInvalidOption, d, MaxLockDelay)
		}
		o.delay = d
		return nil
	}
}

// recordValue is the value of q's record of the hold with token (see
// delayValue): the longer of its delay and its minimum hold, and the
// minimum hold itself if it has one.
func (q *queue) recordValue(token int64) string {
	return delayValue(token, max(ttlSeconds(q.opts.delay), ttlSeconds(q.opts.minHold)), q.opts.minHold)
}

// delayValue is a record's value: the hold's token, how long to keep the
// lock free once its hold ended without Unlock, in seconds, and, for a
// hold with a minimum hold, that in milliseconds. Token 0 stands for the
// record's own create revision: a record put in the Txn that puts its key
// (an uncontended Lock, a Try) cannot know the revision, which is the
// key's.
func delayValue(token, secs int64, minHold time.Duration) string {
	v := strconv.FormatInt(token, 10) + " " + strconv.FormatInt(secs, 10)
	if minHold > 0 {
		v += " " + strconv.FormatInt(minHold.Milliseconds(), 10)
	}
	return v
}

// A record is a delay record as read (parseDelay).
type record struct {
	token   int64
	secs    int64
	minHold time.Duration // the hold's minimum hold; 0 for none
}

// parseDelay reads a record. A value it cannot read is a delay of one
// second for a key that never held (token 0), so that it passes.
func parseDelay(kv *mvccpb.KeyValue) record {
	f := strings.Fields(string(kv.Value))
	bad := record{secs: 1}
	if len(f) != 2 && len(f) != 3 {
		return bad
	}
	token, err1 := strconv.ParseInt(f[0], 10, 64)
	secs, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || token < 0 || secs < 1 {
		return bad
	}
	var ms int64
	if len(f) == 3 {
		var err error
		if ms, err = strconv.ParseInt(f[2], 10, 64); err != nil || ms < 0 {
			return bad
		}
	}
	if token == 0 {
		token = kv.CreateRevision
	}
	return record{token: token, secs: min(secs, ttlSeconds(MaxLockDelay)), minHold: min(time.Duration(ms)*time.Millisecond, MaxLockDelay)}
}

// A pendingDelay is a delay record whose hold ended without Unlock.
type pendingDelay struct {
	key    string
	value  []byte
	modRev int64
	lease  int64 // 0: not started
	secs   int64
}

// pendingDelays returns the delays that keep me out, from r, q's delay
// records as read with the queue: those of holds ahead of me (an older
// token; me.rev 0, a Try, is behind everyone) whose key is no longer
// theirs. live reports whether a key is in place with that create
// revision at the read.
func (q *queue) pendingDelays(me entry, r *pb.RangeResponse, live func(key string, rev int64) bool) []pendingDelay {
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	pfx := q.delayPfx()
	var pd []pendingDelay
	for _, kv := range r.Kvs {
		if !isChild(pfx, kv.Key) {
			continue // a nested lock's
		}
		rec := parseDelay(kv)
		token, secs := rec.token, rec.secs
		if me.rev != 0 && token >= me.rev {
			continue // behind me: admitted with me, or after me
		}
		if live(strings.TrimPrefix(string(kv.Key), LockDelayPrefix), token) {
			continue
		}
		pd = append(pd, pendingDelay{key: string(kv.Key), value: kv.Value, modRev: kv.ModRevision, lease: kv.Lease, secs: secs})
	}
	return pd
}

// delayBlockers returns the blockers of pending delays pd.
func delayBlockers(pd []pendingDelay) []entry {
	b := make([]entry, len(pd))
	for i, d := range pd {
		b[i] = entry{key: d.key, mode: ParseKeyMode(d.value)}
	}
	return b
}

// startDelays starts each delay of pd that has not begun: it grants a
// lease with the delay's TTL and moves the record onto it, only if the
// record is still as read (another waiter may have started it, or it
// may have gone). A lease whose move fails is left to run out. It
// returns the RPC's error, which a waiter meets by reading the queue
// again.
func (q *queue) startDelays(ctx context.Context, pd []pendingDelay) error {
	for i := range pd {
		d := &pd[i]
		if d.lease != 0 {
			continue
		}
		g, err := q.s.cli.Grant(ctx, d.secs)
		if err != nil {
			return q.rpcErr(err)
		}
		_, err = q.s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(d.key), "=", d.modRev)).
			Then(clientv3.OpPut(d.key, string(d.value), clientv3.WithLease(g.ID))).
			Commit()
		if err != nil {
			return q.rpcErr(err)
		}
		d.lease = int64(g.ID) // this or another waiter's lease: begun
	}
	return nil
}

// recordGuard is the guard of the record that a lock delay or a minimum
// hold writes: at admission it writes the record, unless the write that
// admitted the hold did (writeDelay). (A set refuses both: claim.check.)
type recordGuard struct{}

func (recordGuard) check(*queue) error { return nil }

func (recordGuard) admitted(ctx context.Context, q *queue, h *hold, recorded bool) error {
	if recorded {
		return nil
	}
	return q.writeDelay(ctx, h.rev)
}

// writeDelay writes h's delay record, once h is admitted, if q has a
// delay: in a Txn that succeeds only while the key is h's, sent again
// after errors that pass. On failure the caller removes the key (fail).
func (q *queue) writeDelay(ctx context.Context, rev int64) error {
	rec := clientv3.OpPut(delayKey(q.key), q.recordValue(rev))
	_, err := retry(ctx, q.passes(ctx), func(ctx context.Context) (*clientv3.TxnResponse, error) {
		resp, err := q.s.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(q.key), "=", rev)).
			Then(rec).
			Commit()
		switch {
		case err != nil:
			return nil, q.rpcErr(err)
		case !resp.Succeeded:
			return nil, errorf("%w: %w", ErrLockLost, q.whyKeyGone(ctx, 0))
		}
		return resp, nil
	})
	if err != nil {
		return errorf("write the lock delay record of %s: %w", q.key, err)
	}
	return nil
}

// opDropDelay deletes the delay record of the hold created at rev, if
// the record is that hold's (its token is rev, written out or as the
// record's own create revision): the release of a hold that Lock never
// returned (it wrote nothing yet).
func (q *queue) opDropDelay(rev int64) clientv3.Op {
	k := delayKey(q.key)
	del := []clientv3.Op{clientv3.OpDelete(k)}
	return clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "=", q.recordValue(rev))},
		del,
		[]clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{
			clientv3.Compare(clientv3.Value(k), "=", q.recordValue(0)),
			clientv3.Compare(clientv3.CreateRevision(k), "=", rev),
		}, del, nil)})
}
