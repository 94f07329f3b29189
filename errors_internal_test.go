package etcdlock

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestErrorsReadWell: errors read well in a log, one line with the package
// prefix once, however they are wrapped and joined, and errors.Is still
// finds every error they carry.
func TestErrorsReadWell(t *testing.T) {
	session := errorf("%w: lease %x was revoked or expired", ErrSessionExpired, 0x1a)
	lost := errorf("%w: %w", ErrLockLost, session)
	if got, want := lost.Error(), "etcdlock: lock was lost: session expired: lease 1a was revoked or expired"; got != want {
		t.Errorf("wrapped twice: %q, want %q", got, want)
	}
	for _, target := range []error{ErrLockLost, ErrSessionExpired, session} {
		if !errors.Is(lost, target) {
			t.Errorf("errors.Is(%q, %q) = false", lost, target)
		}
	}
	ctxErr := errorf("unlock %s: %w", "name/1a", context.DeadlineExceeded)
	if !errors.Is(ctxErr, context.DeadlineExceeded) {
		t.Errorf("errors.Is(%q, context.DeadlineExceeded) = false", ctxErr)
	}

	errFn := errors.New("fn failed")
	for _, tc := range []struct {
		errs []error
		want string
	}{
		{[]error{lost, errFn}, "etcdlock: lock was lost: session expired: lease 1a was revoked or expired; fn failed"},
		{[]error{errFn, ctxErr}, "fn failed; etcdlock: unlock name/1a: context deadline exceeded"},
		{[]error{errorf("revoke lease 1: %w", errFn), errorf("revoke lease 2: %w", errFn)},
			"etcdlock: revoke lease 1: fn failed; revoke lease 2: fn failed"},
		{[]error{lost, nil, errorf("%w", lost)}, lost.Error()},
	} {
		err := join(tc.errs...)
		if got := err.Error(); got != tc.want {
			t.Errorf("join: %q, want %q", got, tc.want)
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("join: %q is not one line", err)
		}
		for _, e := range tc.errs {
			if e != nil && !errors.Is(err, e) {
				t.Errorf("errors.Is(%q, %q) = false", err, e)
			}
		}
	}
	if err := join(nil, nil); err != nil {
		t.Errorf("join(nil, nil) = %v", err)
	}
	if err := join(nil, errFn); err != errFn {
		t.Errorf("join(nil, errFn) = %v, want errFn itself", err)
	}
}
