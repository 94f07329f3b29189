package etcdlock

import (
	"strings"
)

// The key layout, in one place: a lock's keys (name/<lease ID in hex>, as
// etcd's Mutex puts them), which names a lock may take, which keys are a
// lock's (direct children of its prefix), and the library's own keys in
// the one range no lock may take.

// MaxNameLen is the longest lock name accepted. A name appears several times
// in one request; this keeps requests far below etcd's default 1.5 MiB limit.
const MaxNameLen = 32 << 10

// reservedPrefix starts names the library keeps for its own keys.
const reservedPrefix = "__etcdlock/"

// LockDelayPrefix starts the key of every lock delay record:
// LockDelayPrefix + the holder's key (name/<lease ID in hex>). Like
// ReleaseRequestPrefix it lies outside every lock's queue. A lock with
// WithLockDelay needs read and write permission on LockDelayPrefix +
// name + "/" and its range, besides the lock's own.
const LockDelayPrefix = "__etcdlock/delay/"

// ReleaseRequestPrefix starts the key of every release request:
// ReleaseRequestPrefix + the holder's key (name/<lease ID in hex>). A
// request key is never a key of a lock's queue: every call refuses the
// name "__etcdlock" and names under it (ErrInvalidName). Only a lock that
// etcd's Mutex or `etcdctl lock` takes under such a name would count
// requests as waiters.
//
// RequestRelease needs to read the lock's queue (read permission on
// name + "/" and its range) and to write the request keys (write
// permission on ReleaseRequestPrefix + name + "/" and its range); a
// holder that asks ReleaseRequested needs read permission on the latter
// (without it, its ReleaseRequested never closes).
// For a lock with WithLockDelay it also reads the delay records (read
// permission on LockDelayPrefix + name + "/" and its range): without it,
// a waiter a pending delay keeps out counts as a holder.
const ReleaseRequestPrefix = "__etcdlock/release/"

// CheckName returns nil if name is a lock name that every primitive takes,
// and an error matching ErrInvalidName otherwise: an empty name, one
// longer than MaxNameLen, or one in the library's own range (see
// LockDelayPrefix). It makes no RPC: a program or an adapter can check a
// name, or a prefix it builds names from, before it has a Session. Any
// other name is taken as etcd's Mutex takes it.
func CheckName(name string) error { return checkName(name) }

// checkName returns ErrInvalidName for a name no queue can have: empty,
// longer than MaxNameLen, or one whose queue prefix (name + "/") lies in
// the range the library keeps for its own keys (see reservedPrefix):
// "__etcdlock" and every name under "__etcdlock/". Any other name is taken
// as etcd's Mutex takes it, "/my-lock/" and "a//b" included: its keys are
// name + "/" + the lease ID in hex, so that etcd's Mutex, `etcdctl lock`
// and this package on one name are one queue.
func checkName(name string) error {
	switch {
	case name == "":
		return errorf("%w: empty name", ErrInvalidName)
	case len(name) > MaxNameLen:
		return errorf("%w: name is %d bytes, longer than %d", ErrInvalidName, len(name), MaxNameLen)
	}
	return checkReserved(name)
}

// checkReserved returns ErrInvalidName for a name whose queue prefix
// (name + "/") lies in the library's own range: "__etcdlock" itself,
// whose queue would be that whole range (every request and delay record
// would count as its waiters), and every name under it.
func checkReserved(name string) error {
	if strings.HasPrefix(name+"/", reservedPrefix) {
		return errorf("%w: %q: the names %q and those that start with %q are the library's own", ErrInvalidName, name, strings.TrimSuffix(reservedPrefix, "/"), reservedPrefix)
	}
	return nil
}

// isChild reports whether key is a direct child of pfx (name + "/").
func isChild(pfx string, key []byte) bool {
	rest, ok := strings.CutPrefix(string(key), pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}

// LockOfKey returns the name of the lock whose queue key is key, as
// InspectLock and ListLocks count them: key is name/x, with x not empty and
// without "/" (so a/b/x is a key of the nested lock a/b, not of a). It
// returns false for a key of no lock: one without "/", or ending in "/",
// or starting with its only "/", and the library's own keys under
// "__etcdlock/" (release requests, lock delay records), which no lock
// has. A program that watches lock keys (as etcdlock ls --watch does)
// tells with it which lock an event is of.
func LockOfKey(key string) (name string, ok bool) {
	i := strings.LastIndexByte(key, '/')
	if i <= 0 || i == len(key)-1 || checkReserved(key[:i]) != nil {
		return "", false
	}
	return key[:i], true
}

// delayKey returns the key of the delay record of the holder's key.
func delayKey(key string) string { return LockDelayPrefix + key }

// requestKey returns the key of a request addressed to a hold of key.
func requestKey(key string) string { return ReleaseRequestPrefix + key }

// lockName returns the name of q's lock: its key up to the prefix's "/".
func (q *queue) lockName() string { return q.key[:q.plen-1] }

// prefix returns the prefix of the keys of q's lock: its name and "/".
func (q *queue) prefix() string { return q.key[:q.plen] }

// delayPfx returns the prefix of q's delay records (delay.go).
func (q *queue) delayPfx() string { return LockDelayPrefix + q.prefix() }
