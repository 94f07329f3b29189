package etcdlock

import (
	"context"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MultiMutex, one hold over several names: its API, its constructor and
// the check of its names. Its parts are queues of the one engine, and its
// claim (claim.go) is one key per name: the engine places them in one Txn
// (place.go: acquireSet), tries them in one (try.go: tryAcquireSet), and
// reads, deletes and watches each of them through the claim.

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
	slices.SortFunc(set.order, func(a, b int) int { return strings.Compare(set.parts[a].lockName(), set.parts[b].lockName()) })
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
