package etcdlock

import "errors"

// Sentinel errors. Match them with errors.Is: they are usually wrapped with
// detail.
var (
	// ErrLocked is returned by TryLock when another holder or waiter is
	// ahead, in etcd or in this process.
	ErrLocked = errors.New("etcdlock: lock is held by another session")
	// ErrSessionExpired is returned when the session's lease is gone
	// (expired, revoked, or closed), or the session has ended.
	ErrSessionExpired = errors.New("etcdlock: session expired")
	// ErrLockReleased is returned by Unlock when the Mutex is not held.
	ErrLockReleased = errors.New("etcdlock: lock is not held")
	// ErrLockLost is returned when a hold (or a place in the queue) ended
	// without Unlock: the key was deleted or its lease ended.
	ErrLockLost = errors.New("etcdlock: lock was lost")
	// ErrInvalidName is returned by Lock and TryLock for an empty name or
	// one longer than MaxNameLen.
	ErrInvalidName = errors.New("etcdlock: invalid lock name")
	// ErrInvalidOption is returned by NewSession for an invalid option.
	ErrInvalidOption = errors.New("etcdlock: invalid option")
)
