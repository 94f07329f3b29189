package etcdlock

import (
	"context"
	"fmt"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the lease TTL of a Session made without WithTTL.
const DefaultTTL = 15 * time.Second

// MinTTL is the shortest TTL WithTTL accepts: etcd leases count whole seconds.
const MinTTL = time.Second

// sessionOptions holds a Session's settings; defaults live in
// defaultSessionOptions and nowhere else.
type sessionOptions struct {
	ttl   time.Duration
	lease clientv3.LeaseID
	ctx   context.Context
}

func defaultSessionOptions() sessionOptions {
	return sessionOptions{ttl: DefaultTTL, ctx: context.Background()}
}

// A SessionOption configures NewSession. An invalid value makes NewSession
// return an error wrapping ErrInvalidOption.
type SessionOption func(*sessionOptions) error

// WithTTL sets the TTL of the session's lease: how long etcd keeps the
// session's locks after the process stops renewing it (it died or was cut
// off). Default DefaultTTL (15s). Values below MinTTL (1s) are an error;
// fractions of a second round up, since etcd leases count whole seconds.
// WithTTL has no effect together with WithLease, whose lease keeps its TTL.
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) error {
		if d < MinTTL {
			return fmt.Errorf("%w: TTL %v is below the minimum %v", ErrInvalidOption, d, MinTTL)
		}
		if d > time.Duration(math.MaxInt64/2) {
			return fmt.Errorf("%w: TTL %v is too large", ErrInvalidOption, d)
		}
		o.ttl = d
		return nil
	}
}

// WithLease makes the session use an existing lease instead of granting a
// new one. NewSession checks the lease is alive and takes over its
// keepalives; Close revokes it. Default: a new lease. A lease must never be
// used by two processes at once: locks of one session share the key
// name/<lease> and exclude each other only inside one process.
func WithLease(id clientv3.LeaseID) SessionOption {
	return func(o *sessionOptions) error {
		if id <= 0 {
			return fmt.Errorf("%w: lease ID %d", ErrInvalidOption, id)
		}
		o.lease = id
		return nil
	}
}

// WithContext sets a context that bounds the session: NewSession's RPCs use
// it, and when it is cancelled the session stops renewing its lease and
// ends (Done is closed; the lease is left to expire, as with Orphan).
// Default context.Background().
func WithContext(ctx context.Context) SessionOption {
	return func(o *sessionOptions) error {
		if ctx == nil {
			return fmt.Errorf("%w: nil context", ErrInvalidOption)
		}
		o.ctx = ctx
		return nil
	}
}

// ttlSeconds is the lease TTL etcd is asked for: d rounded up to seconds.
func ttlSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
