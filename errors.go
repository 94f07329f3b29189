package etcdlock

import (
	"errors"
	"fmt"
	"strings"
)

// The sentinel errors of every call, in one block, and the helpers that
// wrap them.

// ErrSessionClosed is Session.Err, and the error of calls on the session,
// after the program ended it: Close, Orphan, or the end of its WithContext
// context. It also matches ErrSessionExpired, which every call on an ended
// session returns; check it first to tell a normal end from a lost lease.
var ErrSessionClosed error = sessionClosed{}

// sessionClosed is ErrSessionClosed's type: its own message, and a match
// for ErrSessionExpired.
type sessionClosed struct{}

func (sessionClosed) Error() string        { return "etcdlock: session closed" }
func (sessionClosed) Is(target error) bool { return target == ErrSessionExpired }

// Sentinel errors. Match them with errors.Is: they are usually wrapped with
// detail.
var (
	// ErrLocked is returned by TryLock, TryRLock and TryAcquire when
	// another holder or waiter is ahead, in etcd or in this process.
	ErrLocked = errors.New("etcdlock: lock is held by another session")
	// ErrSessionExpired is returned when the session's lease is gone
	// (expired, revoked, or closed), or the session has ended. An end the
	// program asked for also matches ErrSessionClosed.
	ErrSessionExpired = errors.New("etcdlock: session expired")
	// ErrLockReleased is returned by Unlock, RUnlock and Release when
	// this Mutex (RWMutex, Semaphore, ...) holds nothing in that mode: it
	// was never locked, or was released already. Others may hold the
	// lock. Not to be confused with ErrNotHeld, RequestRelease's "nobody
	// holds the lock".
	ErrLockReleased = errors.New("etcdlock: nothing to release: this lock value holds nothing in that mode")
	// ErrLockLost is returned when a hold (or a place in the queue) ended
	// without Unlock: the key was deleted or its lease ended.
	ErrLockLost = errors.New("etcdlock: lock was lost")
	// ErrInvalidName is returned for a name that is empty, longer than
	// MaxNameLen, or in the range the library keeps for its own keys
	// ("__etcdlock" and names under "__etcdlock/"). Every other name is
	// taken as etcd's Mutex takes it: "/my-lock/" queues under
	// "/my-lock//", with etcd's Mutex and `etcdctl lock` on that name.
	ErrInvalidName = errors.New("etcdlock: invalid lock name")
	// ErrInvalidOption is returned by NewSession for an invalid option, and
	// by Lock, Acquire and the like for an invalid MutexOption or a
	// Semaphore's capacity below 1.
	ErrInvalidOption = errors.New("etcdlock: invalid option")
	// ErrUpgrade is returned by an RWMutex's Lock, TryLock and Do while it
	// holds a read lock: RUnlock first (a read lock cannot become a write
	// lock in place; writers queued behind it would be overtaken).
	ErrUpgrade = errors.New("etcdlock: read lock cannot be upgraded")
	// ErrInvalidWeight is returned by a Semaphore's Acquire, TryAcquire and
	// Do for n below 1 or above the capacity.
	ErrInvalidWeight = errors.New("etcdlock: invalid semaphore weight")
	// ErrNotLeader is returned by an Election's Proclaim when it is not
	// the leader: it has not won, it resigned, or its leadership was lost.
	ErrNotLeader = errors.New("etcdlock: not the leader")
	// ErrNoLeader is returned by an Election's Leader and by CurrentLeader
	// when no one is leader of the election.
	ErrNoLeader = errors.New("etcdlock: election has no leader")
	// ErrInvalidValue is returned by Campaign and Proclaim for a value
	// that starts with "etcdlock/1 ", which this package reserves for the
	// modes of lock keys (see ParseKeyMode).
	ErrInvalidValue = errors.New("etcdlock: invalid election value")
	// ErrStaleToken is returned by FencedWrite when a write with a higher
	// fencing token has already fenced the key: a newer holder has
	// written, so the caller's exclusive hold has ended, or is about to.
	ErrStaleToken = errors.New("etcdlock: stale fencing token: a newer holder has written")
	// ErrNotInQueue is returned by Evict when the key is not in the
	// lock's queue with the token given: it left, or it is a later
	// hold's of the same lease.
	ErrNotInQueue = errors.New("etcdlock: no such key in the lock's queue")
	// ErrNotHeld is returned by RequestRelease when nobody holds the
	// lock: there is no hold to ask. Not to be confused with
	// ErrLockReleased, an Unlock's "this lock value holds nothing".
	ErrNotHeld = errors.New("etcdlock: lock is not held by anyone")
	// ErrReleaseRequested is the context.Cause of fn's ctx when Do (with
	// WithCancelOnRequest) or Lead (with YieldOnRequest) ended fn because
	// the hold was asked to release (RequestRelease).
	ErrReleaseRequested = errors.New("etcdlock: release requested")
)

// prefix starts the message of every error of this package, exactly once.
const prefix = "etcdlock: "

// errorf is fmt.Errorf for this package's errors. The message starts with
// prefix, and the errors among args that start with it too (this
// package's own) are written without it: however deep the wrapping, a log
// line reads "etcdlock: lock was lost: session expired: ...", not
// "etcdlock: lock was lost: etcdlock: session expired: ...". errors.Is
// and errors.As see every error wrapped with %w.
func errorf(format string, args ...any) error {
	for i, a := range args {
		if err, ok := a.(error); ok {
			args[i] = &unprefixed{err}
		}
	}
	return &prefixed{fmt.Errorf(format, args...)}
}

// prefixed is an error whose message starts with prefix.
type prefixed struct{ err error }

func (e *prefixed) Error() string { return prefix + strings.TrimPrefix(e.err.Error(), prefix) }
func (e *prefixed) Unwrap() error { return e.err }

// unprefixed is an error written without a leading prefix.
type unprefixed struct{ err error }

func (e *unprefixed) Error() string { return strings.TrimPrefix(e.err.Error(), prefix) }
func (e *unprefixed) Unwrap() error { return e.err }

// join is errors.Join on one line, for logs: the messages are separated by
// "; ", a message equal to an earlier one is left out, and prefix is
// written once, where it first appears. It returns nil when every err is
// nil, and the one error when only one is not nil. errors.Is and errors.As
// see each error.
func join(errs ...error) error {
	var nonNil []error
	for _, err := range errs {
		if err != nil {
			nonNil = append(nonNil, err)
		}
	}
	switch len(nonNil) {
	case 0:
		return nil
	case 1:
		return nonNil[0]
	}
	return &joined{nonNil}
}

// joined is the error join returns.
type joined struct{ errs []error }

func (e *joined) Error() string {
	var b strings.Builder
	written := make(map[string]bool, len(e.errs))
	hasPrefix := false
	for _, err := range e.errs {
		msg, ours := strings.CutPrefix(err.Error(), prefix)
		if written[msg] {
			continue
		}
		written[msg] = true
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		if ours && !hasPrefix {
			b.WriteString(prefix)
			hasPrefix = true
		}
		b.WriteString(msg)
	}
	return b.String()
}

func (e *joined) Unwrap() []error { return e.errs }
