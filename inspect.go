package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reading a lock as a tool does: InspectLock and ListLocks, and the one
// reading of a queue that they and RequestRelease share (readLock): who
// holds, who waits, what is pending, and which keys are the library's own.

// inspectPage is how many keys one range of InspectLock or ListLocks
// reads; a variable so that tests can make queues span several pages.
var inspectPage int64 = 512

// leaseReads is how many LeaseTimeToLive RPCs InspectLock has in flight
// at once.
const leaseReads = 8

// A QueueKey is one key of a lock's queue, as InspectLock and ListLocks
// read it: a holder or a waiter.
type QueueKey struct {
	Key   string           // name/<lease ID in hex>, for every client this package knows of
	Lease clientv3.LeaseID // the lease the key is bound to; 0 for a key put without one
	Token int64            // the key's create revision: its place in line, and its fencing token
	Mode  KeyMode          // ParseKeyMode of Value: exclusive for etcd's Mutex, `etcdctl lock` and elections
	Holds bool             // whether it holds the lock (see Holders); else it waits
	// Identity is the holder's description that WithIdentity put in the
	// value; "" when there is none.
	Identity string
	// Value is the key's value as read: the mode line and identity, or an
	// election candidate's proposal (the leader's is Value of the key that
	// holds).
	Value []byte

	// TTL is what was left of the key's lease, in seconds (0: under a
	// second), and GrantedTTL the TTL it was granted with, as etcd told
	// them just after the queue was read. They are known only when
	// LeaseErr is nil: LeaseErr says why not (the key has no lease; the
	// lease had ended by then, matching rpctypes.ErrLeaseNotFound: the key
	// has gone with it; the read failed, with its error; or the leases
	// were not read, see InspectLock).
	TTL, GrantedTTL int64
	LeaseErr        error

	// ReleaseRequested says a holder was asked to release (RequestRelease)
	// and has not yet: a request addressed to this hold is pending. Always
	// false for a waiter, and when the request keys could not be read
	// (no read permission on them).
	ReleaseRequested bool

	// InSet says the key is one of a MultiMutex's: its set holds this
	// lock only while it holds every name of the set.
	InSet bool
	// MinHold is the minimum hold (WithMinHold) the key's hold asked
	// for, from its record: the lock stays taken until MinHold after
	// the hold was admitted, even once its holder has unlocked (the key
	// stays until then). 0 for none, or when the records could not be
	// read.
	MinHold time.Duration

	// WaitsFor is, for a MultiMutex's key first in line, the name of its
	// set that still keeps the set out: the key waits (others on this
	// lock wait behind it, first come, first served), and nobody holds
	// the lock. "" for every other key.
	WaitsFor string
}

// A LockQueue is a lock's queue at one etcd revision: its holders, then
// its waiters, each in line order.
type LockQueue struct {
	Name     string
	Revision int64      // the etcd revision at which every key was read
	Keys     []QueueKey // oldest create revision first; holders first
	// Delays are the lock delays pending at Revision (WithLockDelay):
	// holds that ended without Unlock, whose delay keeps the next
	// holder out. None when the delay records could not be read (no
	// read permission on them).
	Delays  []PendingDelay
	holders int
}

// A PendingDelay is a lock delay that keeps a lock free after a hold
// ended without Unlock (WithLockDelay).
type PendingDelay struct {
	Key   string        // the key of the hold that ended: name/<lease ID in hex>
	Token int64         // its token
	Delay time.Duration // the delay it asked for
	// MinHold is the hold's minimum hold (WithMinHold), 0 for none. With
	// one, the record may be the rest of a minimum hold that the
	// holder's Session.Close left to a lease (it then asks for that
	// rest as Delay), or it keeps the lock free for Delay, the longer
	// of the lock delay and the minimum hold, after a hold that ended
	// without Unlock.
	MinHold time.Duration
	// Started says a waiter has begun the delay: it ends when Lease
	// does, Left from the read (unless the leases were not read: then
	// Left is 0). A delay not started begins with the next Lock or
	// TryLock of the lock.
	Started bool
	Lease   clientv3.LeaseID
	Left    time.Duration
}

// Holders returns the keys that hold the lock: none when it is free, one
// for a Mutex or an election (the leader), several when an RWMutex's
// readers or a Semaphore's permits hold together.
func (q *LockQueue) Holders() []QueueKey { return q.Keys[:q.holders] }

// Waiters returns the keys that wait, next in line first.
func (q *LockQueue) Waiters() []QueueKey { return q.Keys[q.holders:] }

// errNoLease and errLeasesNotRead are a QueueKey's LeaseErr.
var (
	errNoLease       = errors.New("etcdlock: key has no lease")
	errLeasesNotRead = errors.New("etcdlock: leases not read")
)

// inspectOptions holds InspectLock's settings; the zero value is the
// default.
type inspectOptions struct {
	rev          int64
	noLeases     bool
	holdersOnly  bool // read only the holders' leases
	serializable bool
}

// An InspectOption configures InspectLock.
type InspectOption func(*inspectOptions)

// AtRevision makes InspectLock read the queue as it was at etcd revision
// rev, if etcd has not compacted it away, and not read the leases: what is
// left of a lease now says nothing of then. Default (and rev 0): the
// current revision.
func AtRevision(rev int64) InspectOption {
	return func(o *inspectOptions) { o.rev = max(rev, 0) }
}

// WithoutLeases makes InspectLock skip the leases' TTLs: it then costs
// only the ranges that read the queue. Default: they are read.
func WithoutLeases() InspectOption {
	return func(o *inspectOptions) { o.noLeases = true }
}

// HolderLeasesOnly makes InspectLock read the TTLs of the holders' leases
// only: a long queue then costs no RPC per waiter. Default: every lease.
func HolderLeasesOnly() InspectOption {
	return func(o *inspectOptions) { o.holdersOnly = true }
}

// Serializable lets the member InspectLock asks answer from its own copy,
// without a round trip to the leader: cheaper, for a display polled over
// and over, but the queue may be a little stale (it is still the queue at
// one revision, Revision, of that member). A queue longer than one page
// (512 keys) reads its further pages linearizably, at that revision.
// Together with AtRevision, a member that has not applied the revision
// yet refuses the read. Default: linearizable.
func Serializable() InspectOption {
	return func(o *inspectOptions) { o.serializable = true }
}

// InspectLock reads the queue of the lock called name through cli: who
// holds it and who waits, in line order, with each key's mode, identity
// and lease. It needs no Session and works on any name: locks and
// elections of this package, etcd's concurrency.Mutex and Election,
// `etcdctl lock` and `etcdctl elect`, which share its key layout. Only
// direct children of name/ are in the queue: keys of nested locks
// (name/sub/...) are not.
//
// It writes nothing and is a snapshot: every page of the queue is read at
// the revision of the first (a linearizable read unless Serializable),
// returned as Revision,
// so a long queue that moves meanwhile is still shown as it was at one
// moment. Which keys hold is etcdlock's grant rule (Holders) applied to
// that snapshot. It costs one range per 512 keys, then one
// LeaseTimeToLive per distinct lease, which tells the lease as it is a
// moment later (a lease that ended meanwhile says so in LeaseErr).
//
// WithoutLeases and AtRevision leave the leases unread, and
// HolderLeasesOnly the waiters' (LeaseErr says so). AtRevision reads an older queue; if etcd has compacted that
// revision the error matches rpctypes.ErrCompacted. InspectLock returns
// ErrInvalidName for an invalid name (see ErrInvalidName), and etcd's
// error if a read fails.
func InspectLock(ctx context.Context, cli *clientv3.Client, name string, opts ...InspectOption) (*LockQueue, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	var o inspectOptions
	for _, opt := range opts {
		opt(&o)
	}
	q, err := readLock(ctx, cli, name, o)
	if refused(err) {
		return nil, readRefusedErr("a read of lock "+name, name+"/", err)
	}
	if err != nil {
		return nil, err
	}
	if !o.noLeases && o.rev == 0 {
		readDelayTTLs(ctx, cli, q.Delays)
	}
	if err := readRequests(ctx, cli, q, o); err != nil {
		return nil, err
	}
	read := q.Keys
	switch {
	case o.noLeases || o.rev > 0:
		read = nil
	case o.holdersOnly:
		read = q.Holders()
	}
	readLeaseTTLs(ctx, cli, read)
	for i := len(read); i < len(q.Keys); i++ {
		q.Keys[i].LeaseErr = errLeasesNotRead
	}
	return q, nil
}

// readQueue reads the keys of the lock called name, a page at a time,
// every page at one revision (see pager): o.rev, or the first page's.
func readQueue(ctx context.Context, cli *clientv3.Client, name string, o inspectOptions) (*LockQueue, error) {
	pfx := name + "/"
	var reads []clientv3.OpOption
	if o.serializable {
		reads = append(reads, clientv3.WithSerializable())
	}
	page := func() []clientv3.OpOption {
		return append([]clientv3.OpOption{
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend),
			clientv3.WithLimit(inspectPage),
		}, reads...)
	}
	first := append(page(), clientv3.WithPrefix())
	if o.rev > 0 {
		first = append(first, clientv3.WithRev(o.rev))
	}
	resp, err := cli.Get(ctx, pfx, first...)
	if err != nil {
		return nil, err
	}
	q := &LockQueue{Name: name, Revision: o.rev}
	if q.Revision == 0 {
		// A read at a given revision answers with the current one in its
		// header: the first page's is the queue's.
		q.Revision = resp.Header.Revision
	}
	// Later pages are read linearizably, even for Serializable: the next
	// call may go to another member, which may not have applied the first
	// page's revision yet, and would refuse a serializable read at it.
	p := pager{cli: cli, pfx: pfx, rev: q.Revision, page: func() []clientv3.OpOption {
		return []clientv3.OpOption{
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend),
			clientv3.WithLimit(inspectPage),
		}
	}}
	p.add(resp.Kvs, resp.More)
	for kvs := resp.Kvs; ; {
		for _, kv := range kvs {
			if isChild(pfx, kv.Key) {
				q.Keys = append(q.Keys, queueKey(string(kv.Key), clientv3.LeaseID(kv.Lease), kv.CreateRevision, kv.Value))
			}
		}
		if !p.more {
			return q, nil
		}
		if kvs, err = p.next(ctx); err != nil {
			return nil, err
		}
	}
}

// readLock is the one reading of a lock that every caller shares
// (InspectLock, ListLocks' locks, RequestRelease): the queue's keys, every
// page at one revision, and the lock's delay records at that revision,
// settled into who holds and who waits (settle). With o.rev 0, a
// revision compacted before the last read is read anew at a newer one.
func readLock(ctx context.Context, cli *clientv3.Client, name string, o inspectOptions) (*LockQueue, error) {
	for {
		q, err := readQueue(ctx, cli, name, o)
		var recs []*mvccpb.KeyValue
		if err == nil {
			recs, err = readRecords(ctx, cli, LockDelayPrefix+name+"/", q.Revision, o)
		}
		if err == nil {
			settle(q, recs)
			err = settleSet(ctx, cli, q, o)
		}
		switch {
		case err == nil:
			return q, nil
		case o.rev != 0 || !errors.Is(err, rpctypes.ErrCompacted):
			return nil, err
		}
		// The revision of the first page was compacted before a later
		// read: read the lock anew, at a newer revision.
	}
}

// readRecords reads the library's records under pfx (LockDelayPrefix +
// a lock's prefix) at revision rev. Without read permission on them it
// returns none: the queue is then settled by the grant rule alone.
func readRecords(ctx context.Context, cli *clientv3.Client, pfx string, rev int64, o inspectOptions) ([]*mvccpb.KeyValue, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(rev)}
	if o.serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	resp, err := cli.Get(ctx, pfx, opts...)
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return resp.Kvs, nil
}

// settle answers who holds q's lock, given its delay records read at
// q.Revision (those of nested locks are passed over): the longest prefix
// of the queue that the grant rule admits (Holders), less the keys that a
// pending lock delay keeps out. A record whose key is gone (or has
// another create revision) is a pending delay: it keeps out every key
// behind its hold that did not write a record of its own (admitted
// before the delay began), but a set's, which honours no delay. Those
// keys wait, first in line.
func settle(q *LockQueue, recs []*mvccpb.KeyValue) {
	q.holders = markHolders(q.Keys)
	pfx := LockDelayPrefix + q.Name + "/"
	recorded := map[string]bool{}
	minToken := int64(-1)
	for _, kv := range recs {
		if !isChild(pfx, kv.Key) {
			continue
		}
		key := strings.TrimPrefix(string(kv.Key), LockDelayPrefix)
		rec := parseDelay(kv)
		token := rec.token
		if i := slices.IndexFunc(q.Keys, func(k QueueKey) bool { return k.Key == key && k.Token == token }); i >= 0 {
			recorded[key] = true
			q.Keys[i].MinHold = rec.minHold
			continue
		}
		q.Delays = append(q.Delays, PendingDelay{Key: key, Token: token, Delay: time.Duration(rec.secs) * time.Second,
			MinHold: rec.minHold, Started: kv.Lease != 0, Lease: clientv3.LeaseID(kv.Lease)})
		if minToken < 0 || token < minToken {
			minToken = token
		}
	}
	if minToken < 0 {
		return
	}
	for i, k := range q.Keys[:q.holders] {
		// A set's key honours no delay (a MultiMutex takes none): it
		// holds whatever is pending.
		if k.Token > minToken && !recorded[k.Key] && !k.InSet {
			for j := i; j < q.holders; j++ {
				q.Keys[j].Holds = false
			}
			q.holders = i
			return
		}
	}
}

// settleSet settles a queue whose first key the grant rule admits but
// that is a MultiMutex's: its set holds the lock only once every other
// name of the set admits it too, and until then the key waits, first in
// line (WaitsFor), and nobody holds. Each key of a set names the next
// name of the set (setLine), so from this one the names lead round the
// set: for each, one read at q.Revision of the set's key there (same
// lease, same create revision) and of a page of the keys ahead of it.
// One name in which a key is ahead, or the set's key is gone (its set is
// being released), keeps the set out. A plain lock's queue costs nothing.
func settleSet(ctx context.Context, cli *clientv3.Client, q *LockQueue, o inspectOptions) error {
	if q.holders == 0 || !q.Keys[0].InSet {
		return nil
	}
	head := q.Keys[0]
	lease := strings.TrimPrefix(head.Key, q.Name+"/")
	at := []clientv3.OpOption{clientv3.WithRev(q.Revision)}
	if o.serializable {
		at = append(at, clientv3.WithSerializable())
	}
	next, _ := setNext(head.Value)
	for range MaxMultiNames {
		if next == q.Name {
			return nil // round the set: it holds every name
		}
		pfx := next + "/"
		ahead := append(queueOpts(KeyMode{}, clientv3.SortDescend, head.Token-1, 0, false), at...)
		resp, err := cli.Txn(ctx).Then(
			clientv3.OpGet(pfx+lease, at...),
			clientv3.OpGet(pfx, ahead...),
		).Commit()
		if err != nil {
			return err
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].CreateRevision != head.Token {
			break // the set's key is gone there
		}
		blocked, err := anyChild(ctx, cli, pfx, q.Revision, resp.Responses[1].GetResponseRange())
		if err != nil {
			return err
		}
		if blocked {
			break
		}
		if next, _ = setNext(kvs[0].Value); next == "" {
			return nil // not a set's value: as the grant rule says
		}
	}
	q.Keys[0].Holds, q.Keys[0].WaitsFor, q.holders = false, next, 0
	return nil
}

// anyChild reports whether a range of keys under pfx, newest first, read
// at rev, whose first page is r, holds a direct child of pfx: a key of
// the lock pfx names, not of a nested one. Later pages are read at rev.
func anyChild(ctx context.Context, cli *clientv3.Client, pfx string, rev int64, r *pb.RangeResponse) (bool, error) {
	p := &pager{cli: cli, pfx: pfx, rev: rev, desc: true, tie: []clientv3.OpOption{clientv3.WithKeysOnly()}, page: func() []clientv3.OpOption {
		return queueOpts(KeyMode{}, clientv3.SortDescend, 0, 0, true)
	}}
	p.add(r.Kvs, r.More)
	for kvs := r.Kvs; ; {
		if slices.ContainsFunc(kvs, func(kv *mvccpb.KeyValue) bool { return isChild(pfx, kv.Key) }) {
			return true, nil
		}
		if !p.more {
			return false, nil
		}
		var err error
		if kvs, err = p.next(ctx); err != nil {
			return false, err
		}
	}
}

// readDelayTTLs reads the time left of each started delay of pd.
func readDelayTTLs(ctx context.Context, cli *clientv3.Client, pd []PendingDelay) {
	for i := range pd {
		d := &pd[i]
		if !d.Started {
			continue
		}
		if r, err := cli.TimeToLive(ctx, d.Lease); err == nil && r.TTL > 0 {
			d.Left = time.Duration(r.TTL) * time.Second
		}
	}
}

// readRequests marks the holders of q to which a release request is
// addressed: one range over the lock's request keys, at q's revision. It
// returns only ctx's error: without read permission on the request keys,
// none is marked.
func readRequests(ctx context.Context, cli *clientv3.Client, q *LockQueue, o inspectOptions) error {
	if q.holders == 0 {
		return nil
	}
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(q.Revision)}
	if o.serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	resp, err := cli.Get(ctx, requestKey(q.Name+"/"), opts...)
	if err != nil {
		return ctx.Err()
	}
	asked := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		asked[strings.TrimPrefix(string(kv.Key), ReleaseRequestPrefix)] = string(kv.Value)
	}
	for i := range q.Holders() {
		k := &q.Keys[i]
		k.ReleaseRequested = asked[k.Key] == strconv.FormatInt(k.Token, 10)
	}
	return nil
}

// queueKey is the QueueKey of a key read, with its holds and lease yet
// unknown.
func queueKey(key string, lease clientv3.LeaseID, rev int64, value []byte) QueueKey {
	_, set := setNext(value)
	return QueueKey{Key: key, Lease: lease, Token: rev, Mode: ParseKeyMode(value), Identity: identityOf(value), Value: value, InSet: set}
}

// markHolders sets Holds on the keys that hold (keys is a whole queue,
// oldest first) and returns how many do.
func markHolders(keys []QueueKey) int {
	modes := make([]KeyMode, len(keys))
	for i, k := range keys {
		modes[i] = k.Mode
	}
	n := holdersOf(modes)
	for i := range keys[:n] {
		keys[i].Holds = true
	}
	return n
}

// readLeaseTTLs fills in the TTLs of keys' leases: one LeaseTimeToLive per
// distinct lease, leaseReads at a time.
func readLeaseTTLs(ctx context.Context, cli *clientv3.Client, keys []QueueKey) {
	type ttl struct {
		left, granted int64
		err           error
	}
	ttls := map[clientv3.LeaseID]*ttl{} // each written before the goroutines start
	for _, k := range keys {
		if k.Lease != clientv3.NoLease && ttls[k.Lease] == nil {
			ttls[k.Lease] = new(ttl)
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, leaseReads)
	for id, t := range ttls {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := cli.TimeToLive(ctx, id)
			switch {
			case err != nil:
				t.err = err
			case resp.TTL < 0:
				t.err = errorf("%w: lease %x has ended since the queue was read", rpctypes.ErrLeaseNotFound, int64(id))
			default:
				t.left, t.granted = resp.TTL, resp.GrantedTTL
			}
		}()
	}
	wg.Wait()
	for i := range keys {
		k := &keys[i]
		if k.Lease == clientv3.NoLease {
			k.LeaseErr = errNoLease
			continue
		}
		t := ttls[k.Lease]
		k.TTL, k.GrantedTTL, k.LeaseErr = t.left, t.granted, t.err
	}
}

// A LockSummary is one lock of those ListLocks finds: who holds it and how
// many wait. (Named, rather than a field's anonymous struct, so that a
// caller can pass one on.)
type LockSummary struct {
	Name string
	// Holders are oldest first: at least one, but none while a lock
	// delay keeps the lock free (WithLockDelay) or the first in line is
	// a MultiMutex that still waits for another name (WaitsFor).
	Holders []QueueKey
	Waiters int
	// WaitsFor is set when nobody holds because the key first in line
	// is a MultiMutex's whose set still waits for that other name
	// (QueueKey.WaitsFor).
	WaitsFor string
}

// A LockList is the locks under a prefix at one etcd revision.
type LockList struct {
	Revision int64         // the etcd revision at which every key was read
	Locks    []LockSummary // sorted by name
}

// ListLocks lists every lock whose name starts with prefix and that has a
// key, read through cli: the name, holders and number of waiters of each.
// A key name/x (x with no "/") is a key of the lock name, as InspectLock
// counts them, so a nested lock a/b is listed apart from a. It needs no
// Session and writes nothing.
//
// Like InspectLock it is a snapshot: it pages through the prefix,
// 512 keys a range, every page at the revision of the first
// (a linearizable read), returned as Revision. The holders' leases are not
// read (their LeaseErr says so); InspectLock reads them for one lock. Keys
// under prefix that are no lock's key (no "/" after prefix, or ending in
// "/") are skipped, and so are the library's own keys under
// "__etcdlock/" (release requests, lock delay records), which no lock
// has. Who holds is settled as InspectLock settles it: one more range
// reads the lock delay records under the prefix (LockDelayPrefix +
// prefix), at the same revision, so that a waiter a pending delay keeps
// out counts as waiting. It returns etcd's error if a read fails.
func ListLocks(ctx context.Context, cli *clientv3.Client, prefix string) (*LockList, error) {
	byName, rev, err := readKeysUnder(ctx, cli, prefix)
	if refused(err) {
		return nil, readRefusedErr("a listing of the locks under "+strconv.Quote(prefix), prefix, err)
	}
	if err != nil {
		return nil, err
	}
	l := &LockList{Revision: rev}
	// The delay records of every lock listed, at the same revision: who
	// holds is settled as InspectLock settles it.
	recs, err := readRecords(ctx, cli, LockDelayPrefix+prefix, rev, inspectOptions{})
	if err != nil {
		return nil, err
	}
	recsOf := map[string][]*mvccpb.KeyValue{}
	for _, kv := range recs {
		if name, ok := LockOfKey(strings.TrimPrefix(string(kv.Key), LockDelayPrefix)); ok {
			recsOf[name] = append(recsOf[name], kv)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		keys := byName[name]
		slices.SortFunc(keys, func(a, b QueueKey) int { return cmp.Compare(a.Token, b.Token) })
		for i := range keys {
			keys[i].LeaseErr = errLeasesNotRead
		}
		q := &LockQueue{Name: name, Revision: rev, Keys: keys}
		settle(q, recsOf[name])
		if err := settleSet(ctx, cli, q, inspectOptions{}); err != nil {
			return nil, err
		}
		n := q.holders
		l.Locks = append(l.Locks, LockSummary{Name: name, Holders: keys[:n:n], Waiters: len(keys) - n, WaitsFor: keys[0].WaitsFor})
	}
	return l, nil
}

// readKeysUnder reads every lock key under prefix, a page at a time, every
// page at the revision of the first, which it returns, and gives them by
// lock name (LockOfKey), in the order read.
func readKeysUnder(ctx context.Context, cli *clientv3.Client, prefix string) (map[string][]QueueKey, int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	byName := map[string][]QueueKey{}
	rev := int64(0)
	from := prefix
	if from == "" {
		from = "\x00" // etcd has no empty key; every key is above this one
	}
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(inspectPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision // as in InspectLock
		}
		for _, kv := range resp.Kvs {
			key := string(kv.Key)
			name, ok := LockOfKey(key)
			if !ok || !strings.HasPrefix(name, prefix) {
				continue // not a lock's key, or the library's own (a request, a delay)
			}
			byName[name] = append(byName[name], queueKey(key, clientv3.LeaseID(kv.Lease), kv.CreateRevision, kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return byName, rev, nil
		}
		// The next key after the last one read.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
