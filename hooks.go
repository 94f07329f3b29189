package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Hooks: the events of a Session's locks, lease and streams, for metrics
// and logs, and how the library calls them.

// Hooks are functions a Session calls on the events of its locks, its lease
// and its own end, for metrics and tracing (see WithHooks; the Prometheus
// adapter, module github.com/etcdlock/etcdlock/etcdlockprom, and the
// OpenTelemetry adapter, module github.com/etcdlock/etcdlock/etcdlockotel,
// are built on them). Every field is optional.
//
// Hooks is a struct of functions, like net/http/httptrace's ClientTrace,
// rather than an interface: a program sets only the events it wants; a
// Session without hooks (and without a logger) pays one nil check per
// event, no allocation and no clock read; and a later release can add
// events as new fields without breaking anyone, where a new method on an
// interface breaks every implementation that did not embed a no-op base.
//
// The functions run synchronously in the goroutine where the event happens
// (the caller's Lock or Unlock, a hold's loss watch, the session's
// keepalive goroutine, the session's end for the holds nobody watched),
// never while this package holds a lock of its own: they may call
// accessors such as Err, Token or Key. They must not call what waits for
// those goroutines (Unlock, Close, Orphan and the like: a loss watch's
// HoldDone calling Unlock would wait for itself), and they must return
// quickly, since the event's caller waits for them. They may run
// concurrently with each other.
//
// Gauges are pairs of events: the waiters of this process are AcquireStart
// calls less AcquireDone calls, its holders are AcquireDone calls with
// Outcome Acquired less HoldDone calls. An election won is an AcquireDone
// of KindElection with Outcome Acquired; it is lost at a HoldDone whose End
// is a loss; the process leads in between.
type Hooks struct {
	// AcquireStart is called when Lock, RLock, Acquire, Campaign, one of
	// their Try forms, or a Do begins to take a hold, once its arguments
	// are found valid.
	AcquireStart func(AcquireStartInfo)
	// AcquireDone is called once for each AcquireStart, before the call
	// returns, with the time it took and its outcome.
	AcquireDone func(AcquireDoneInfo)
	// HoldDone is called once for each hold that was acquired, when it
	// ends: released, or lost with its cause. A loss is reported when this
	// package learns of it: at once if Done was called for the hold (Do
	// and Lead call it; HoldDone then follows the closing of Done by
	// moments), else when Unlock (RUnlock, Release, Resign) finds it,
	// before Unlock returns, or, at the latest, when the session ends
	// (Close, Orphan, its lease's end): every hold is reported by the
	// time Close returns.
	HoldDone func(HoldDoneInfo)
	// RenewDone is called after each attempt to renew the session's lease:
	// every TTL/3 while they succeed, more often while they fail. An
	// attempt cut short by Close or Orphan is not reported.
	RenewDone func(RenewDoneInfo)
	// SessionDone is called once, when the session ends, with the cause.
	SessionDone func(SessionDoneInfo)
}

// WithHooks makes the session call h's functions on the events of its
// locks, lease and end (see Hooks). WithHooks may be given more than once:
// each one's functions are called, in the order given. Lead's sessions
// take it through WithSessionOptions. Default: no hooks.
func WithHooks(h Hooks) SessionOption {
	return func(o *sessionOptions) error {
		o.hooks = Hooks{
			AcquireStart: both(o.hooks.AcquireStart, h.AcquireStart),
			AcquireDone:  both(o.hooks.AcquireDone, h.AcquireDone),
			HoldDone:     both(o.hooks.HoldDone, h.HoldDone),
			RenewDone:    both(o.hooks.RenewDone, h.RenewDone),
			SessionDone:  both(o.hooks.SessionDone, h.SessionDone),
		}
		return nil
	}
}

// both returns a function that calls f, then g; nil ones are left out.
func both[T any](f, g func(T)) func(T) {
	switch {
	case f == nil:
		return g
	case g == nil:
		return f
	}
	return func(v T) { f(v); g(v) }
}

// WithLogger makes the session log, through l, what an operator needs to
// know: a hold lost, and why, at Warn (at Info when the program closed the
// session under it); a lease renewal that failed at Warn;
// the session's end, at Warn when its lease ran out or was revoked and at
// Info otherwise (Close, Orphan, its context, its client closed). Messages
// start with "etcdlock: "; attributes say the lock's kind and name, the
// lease in hex, the cause and the error. Default: nil, no logging.
func WithLogger(l *slog.Logger) SessionOption {
	return func(o *sessionOptions) error {
		o.logger = l
		return nil
	}
}

// A Kind is the primitive an event is about and, for an RWMutex, its mode.
type Kind uint8

// The kinds of locks, as String writes them.
const (
	KindMutex        Kind = iota // "mutex"
	KindRWMutexRead              // "rwmutex_read": RLock, TryRLock, RDo
	KindRWMutexWrite             // "rwmutex_write": an RWMutex's Lock, TryLock, Do
	KindSemaphore                // "semaphore"
	KindElection                 // "election": Campaign, and leadership as the hold
	KindMultiMutex               // "multimutex": LockInfo.Name is its names joined by ","
	KindShard                    // "shard": a shard RunShards runs, held while its fn runs; LockInfo.Name is name/<shard>
	numKinds
)

var kindNames = [numKinds]string{"mutex", "rwmutex_read", "rwmutex_write", "semaphore", "election", "multimutex", "shard"}

func (k Kind) String() string {
	if k < numKinds {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// LockInfo says which lock an event is about.
type LockInfo struct {
	Kind Kind
	Name string  // the lock's (or election's) name
	Mode KeyMode // the hold's mode: shared for a read lock, a Semaphore's permits
}

// AcquireStartInfo is the event of Hooks.AcquireStart.
type AcquireStartInfo struct {
	LockInfo
	Wait bool // false for TryLock, TryRLock and TryAcquire
	// Context is the ctx the call was given (Do's, Lead's): a tracer takes
	// the parent span from it. A hook must not keep it past its return.
	Context context.Context
}

// AcquireDoneInfo is the event of Hooks.AcquireDone.
type AcquireDoneInfo struct {
	LockInfo
	Wait    bool          // false for TryLock, TryRLock and TryAcquire
	Waited  time.Duration // from AcquireStart to now: queueing and round trips
	Outcome AcquireOutcome
	Err     error // what the call returns: nil when Acquired
	Token   int64 // the hold's fencing token (see Mutex.Token) when Acquired, else 0
	// Key is the hold's key in etcd when Acquired (a MultiMutex's: its
	// first name's), else "". With Token it names the hold: the HoldDone
	// of this hold has the same two, so a tracer pairs them.
	Key string
	// Context is the ctx the call was given, as in AcquireStartInfo.
	Context context.Context
}

// AcquireOutcome is how an acquisition ended.
type AcquireOutcome uint8

// The outcomes of an acquisition, as String writes them.
const (
	Acquired            AcquireOutcome = iota // "acquired": the hold was taken
	AcquireBusy                               // "busy": a Try form found the lock taken (ErrLocked)
	AcquireCanceled                           // "canceled": the caller's ctx ended
	AcquireSessionEnded                       // "session_ended": the session ended first (ErrSessionExpired)
	AcquireFailed                             // "error": any other error (etcd's, the key deleted while waiting)
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"acquired", "busy", "canceled", "session_ended", "error"}

func (o AcquireOutcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("AcquireOutcome(%d)", uint8(o))
}

// outcome says how an acquisition made with ctx that returned err ended.
func outcome(ctx context.Context, err error) AcquireOutcome {
	switch {
	case err == nil:
		return Acquired
	case errors.Is(err, ErrLocked):
		return AcquireBusy
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return AcquireCanceled
	case errors.Is(err, ErrSessionExpired):
		return AcquireSessionEnded
	}
	return AcquireFailed
}

// HoldDoneInfo is the event of Hooks.HoldDone.
type HoldDoneInfo struct {
	LockInfo // Kind as acquired: a downgraded write lock stays KindRWMutexWrite (its Mode is shared)
	Token    int64
	Key      string        // as in the AcquireDoneInfo that reported the hold acquired
	Held     time.Duration // from acquisition to the end (for a loss, to when it was learnt)
	End      HoldEnd
	Err      error // the loss, matching ErrLockLost; nil when Released
}

// HoldEnd is how a hold ended: released, or lost and why.
type HoldEnd uint8

// The ends of a hold, as String writes them.
const (
	// Released: Unlock, RUnlock, Release or Resign ended it (also when the
	// key went while an Unlock was under way: not known to be lost).
	Released HoldEnd = iota // "released"
	// LostLease: the session's lease expired or was revoked, or could not
	// be renewed before it ran out (etcd out of reach), or someone revoked
	// the hold's WithMaxHold lease.
	LostLease // "lease_ended"
	// LostKeyDeleted: someone deleted the hold's key.
	LostKeyDeleted // "key_deleted"
	// LostMaxHold: the WithMaxHold limit passed.
	LostMaxHold // "max_hold"
	// LostSessionClosed: the session ended by the program's doing: Close,
	// Orphan, its WithContext context, its client closed.
	LostSessionClosed // "session_closed"
	// LostUnknown: the key went, and etcd could not be asked why.
	LostUnknown // "unknown"
	numHoldEnds
)

var holdEndNames = [numHoldEnds]string{"released", "lease_ended", "key_deleted", "max_hold", "session_closed", "unknown"}

func (e HoldEnd) String() string {
	if e < numHoldEnds {
		return holdEndNames[e]
	}
	return fmt.Sprintf("HoldEnd(%d)", uint8(e))
}

// Lost reports whether e is a loss: any end but Released.
func (e HoldEnd) Lost() bool { return e != Released }

// RenewDoneInfo is the event of Hooks.RenewDone.
type RenewDoneInfo struct {
	Lease clientv3.LeaseID
	// Latency is the round trip of a renewal, from when the request was
	// sent to its answer; for a failed attempt, the time the attempt took.
	Latency time.Duration
	// TTL is what etcd granted from the renewal's send; 0 when it failed.
	TTL time.Duration
	// Left is how long the lease is known to live after this attempt,
	// counted from the send of the newest confirmed renewal; the session
	// ends a margin before (see Session).
	Left time.Duration
	// Err is nil for a renewal; else why the attempt failed: etcd out of
	// reach or busy (the session tries again, until Left runs out), or,
	// matching ErrSessionExpired, the lease no longer exists.
	Err error
}

// SessionDoneInfo is the event of Hooks.SessionDone.
type SessionDoneInfo struct {
	Lease clientv3.LeaseID
	Cause SessionEnd
	Err   error // Session.Err: matches ErrSessionExpired
}

// SessionEnd is why a session ended.
type SessionEnd uint8

// The causes of a session's end, as String writes them.
const (
	SessionClosed       SessionEnd = iota // "closed": Close or Orphan
	SessionContextEnded                   // "context_ended": the WithContext context ended
	SessionClientClosed                   // "client_closed": its etcd client was closed
	SessionNotRenewed                     // "not_renewed": no renewal was confirmed before the lease would run out (etcd out of reach)
	SessionLeaseGone                      // "lease_gone": etcd said the lease no longer exists (revoked, or expired)
	numSessionEnds
)

var sessionEndNames = [numSessionEnds]string{"closed", "context_ended", "client_closed", "not_renewed", "lease_gone"}

func (e SessionEnd) String() string {
	if e < numSessionEnds {
		return sessionEndNames[e]
	}
	return fmt.Sprintf("SessionEnd(%d)", uint8(e))
}

// reporter is a session's hooks and logger, read-only. A session with
// neither has none (nil): every event site then costs one nil check. An
// event is logged before the hook is called, so that a hook sees the log
// line written (a test that waits for a hook then reads the log).
type reporter struct {
	Hooks
	log *slog.Logger
}

// newReporter returns the reporter of h and l, or nil when both are unset.
func newReporter(h Hooks, l *slog.Logger) *reporter {
	if h.AcquireStart == nil && h.AcquireDone == nil && h.HoldDone == nil &&
		h.RenewDone == nil && h.SessionDone == nil && l == nil {
		return nil
	}
	return &reporter{Hooks: h, log: l}
}

func (e *reporter) acquireStart(i AcquireStartInfo) {
	if e.AcquireStart != nil {
		e.AcquireStart(i)
	}
}

func (e *reporter) acquireDone(i AcquireDoneInfo) {
	if e.AcquireDone != nil {
		e.AcquireDone(i)
	}
}

func (e *reporter) holdDone(i HoldDoneInfo) {
	if e.log != nil && i.End.Lost() {
		msg := "etcdlock: lock lost"
		if i.Kind == KindElection {
			msg = "etcdlock: leadership lost"
		}
		// Closing a session that holds locks releases them on
		// purpose: no cause for a warning.
		level := slog.LevelWarn
		if i.End == LostSessionClosed {
			level = slog.LevelInfo
		}
		e.log.LogAttrs(context.Background(), level, msg,
			slog.String("kind", i.Kind.String()), slog.String("name", i.Name),
			slog.String("cause", i.End.String()), slog.Duration("held", i.Held),
			slog.Int64("token", i.Token), slog.Any("error", i.Err))
	}
	if e.HoldDone != nil {
		e.HoldDone(i)
	}
}

func (e *reporter) renewDone(i RenewDoneInfo) {
	if e.log != nil && i.Err != nil {
		e.log.LogAttrs(context.Background(), slog.LevelWarn, "etcdlock: lease renewal failed",
			slog.String("lease", fmt.Sprintf("%x", int64(i.Lease))),
			slog.Duration("left", i.Left), slog.Any("error", i.Err))
	}
	if e.RenewDone != nil {
		e.RenewDone(i)
	}
}

func (e *reporter) sessionDone(i SessionDoneInfo) {
	if e.log != nil {
		level := slog.LevelInfo
		if i.Cause == SessionNotRenewed || i.Cause == SessionLeaseGone {
			level = slog.LevelWarn
		}
		e.log.LogAttrs(context.Background(), level, "etcdlock: session ended",
			slog.String("lease", fmt.Sprintf("%x", int64(i.Lease))),
			slog.String("cause", i.Cause.String()), slog.Any("error", i.Err))
	}
	if e.SessionDone != nil {
		e.SessionDone(i)
	}
}
