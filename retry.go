package etcdlock

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock/internal/streams"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Errors that pass, and what the library does about them: a write that
// joins or leaves the queue is sent again, a waiter reads the queue again,
// a release is sent again, after a pause that grows from minBackoff to
// maxBackoff, while the caller's ctx and the session last; retry is that
// loop for an RPC that is only sent again.

// cleanupTimeout bounds a best-effort RPC whose failure leaves nothing
// behind that the session's lease does not remove: release.go's unlock
// attempts, its check read and the revoke of a max hold lease. The writes
// that join the queue, and the removal of a key after a failed Lock, have
// no such bound (writeCtx): a deadline there would leave a key behind.
const cleanupTimeout = 5 * time.Second

// minBackoff and maxBackoff bound the pause before a waiter reads the
// queue again, or a write that joins or leaves it is sent again, after an
// error that passes (retryable).
const minBackoff, maxBackoff = 50 * time.Millisecond, time.Second

// transient reports whether err passes: a broken watch, or an etcd error
// that a later attempt may not meet.
func transient(err error) bool {
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
	// A cluster out of space (etcd's NOSPACE alarm) refuses every write
	// that puts a key or grants a lease until an operator frees space and
	// disarms the alarm. It shares its code with "too many requests", but
	// waiting on it would turn a clear error into the caller's deadline.
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		return false
	}
	// etcd's transient errors (no leader, leader changed, its own request
	// timeouts, too many requests), by their gRPC code.
	return streams.TransientCode(err)
}

// errProposalDropped is raft's ErrProposalDropped as etcd sends it.
const errProposalDropped = "raft proposal dropped"

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

// retry calls rpc until it answers, fails with an error that pass does
// not let through, or ctx ends during the pause between calls (pause); it
// returns the last answer and error. A queue's loops pass q.passes(ctx):
// etcd's errors that pass, while ctx and the session last. The loops that
// do more between calls than pause (a waiter's, a release's, Lead's, a
// Try's) are written out where they are.
func retry[T any](ctx context.Context, pass func(error) bool, rpc func(context.Context) (T, error)) (T, error) {
	backoff := minBackoff
	for {
		resp, err := rpc(ctx)
		if err == nil || !pass(err) || !pause(ctx, &backoff) {
			return resp, err
		}
	}
}

// pauseOr is pause that also ends, early, when stop is closed.
func pauseOr(ctx context.Context, backoff *time.Duration, stop <-chan struct{}) {
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-stop:
	case <-t.C:
	}
	*backoff = min(2**backoff, maxBackoff)
}

// refused reports whether err is etcd refusing the user permission.
func refused(err error) bool {
	// A refused watch ends with an error that only carries etcd's text
	// (the client makes it from the watch's cancel reason).
	return errors.Is(err, rpctypes.ErrPermissionDenied) ||
		err != nil && strings.HasSuffix(err.Error(), rpctypes.ErrPermissionDenied.Error())
}

// rpcErr maps etcd's "lease not found" to ErrSessionExpired.
func (q *queue) rpcErr(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		q.s.lost()
		return errorf("%w: %w", ErrSessionExpired, err)
	}
	return err
}

// passes returns retryable with ctx, for retry.
func (q *queue) passes(ctx context.Context) func(error) bool {
	return func(err error) bool { return q.retryable(ctx, err) }
}

// retryable reports whether a waiter may try again after err: a broken
// watch, or an etcd error that passes (no leader, leader changed, a
// timeout inside etcd, a member out of reach), while ctx and the session
// last.
func (q *queue) retryable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || q.s.Err() != nil {
		return false
	}
	return transient(err)
}

// cause returns err, or the session's end when that is what stopped a call
// made with ctx bound to the session.
func (q *queue) cause(ctx context.Context, err error) error {
	if serr := q.s.Err(); serr != nil && ctx.Err() == nil && !errors.Is(err, ErrSessionExpired) {
		return serr
	}
	return err
}
