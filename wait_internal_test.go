package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRetryable: a waiter keeps its place through errors that pass (a
// leader election, a broken watch, a member out of reach) and gives up on
// the others, and on any error once ctx or the session has ended.
func TestRetryable(t *testing.T) {
	s := &Session{donec: make(chan struct{})}
	m := &Mutex{}
	m.s = s
	ctx := context.Background()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("%w: %w", errWatchBroken, rpctypes.ErrCompacted), true},
		{rpctypes.ErrNoLeader, true},
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrTimeout, true},
		{rpctypes.ErrTimeoutDueToLeaderFail, true},
		{rpctypes.ErrTooManyRequests, true},
		{rpctypes.ErrNotCapable, true},
		// An error this client version has no sentinel for (etcd 3.5.0's
		// rpctypes lacks ErrTimeoutWaitAppliedIndex): judged by its code.
		{rpctypes.Error(status.Error(codes.Unavailable, "etcdserver: request timed out, waiting for the applied index took too long")), true},
		{status.Error(codes.Unavailable, "connection refused"), true},
		// A leader handing over drops proposals; etcd sends raft's
		// error as it is, with code Unknown.
		{rpctypes.Error(status.Error(codes.Unknown, "raft proposal dropped")), true},
		{status.Error(codes.Unknown, "something else"), false},
		{rpctypes.ErrPermissionDenied, false},
		// Out of space: ResourceExhausted, as "too many requests", but
		// only an operator mends it.
		{rpctypes.ErrNoSpace, false},
		{rpctypes.ErrGRPCNoSpace, false},
		{rpctypes.ErrLeaseNotFound, false},
		{ErrSessionExpired, false},
		{context.Canceled, false},
		{errors.New("something else"), false},
	} {
		if got := m.retryable(ctx, tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if m.retryable(cctx, rpctypes.ErrNoLeader) {
		t.Error("retryable after ctx ended")
	}
	s.err = ErrSessionExpired
	if m.retryable(ctx, rpctypes.ErrNoLeader) {
		t.Error("retryable after the session ended")
	}
}
