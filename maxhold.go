package etcdlock

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// The max hold (WithMaxHold): once a hold is admitted, its key is bound to
// a lease of its own with the max hold's TTL, so that etcd ends the hold
// then even if this process hangs; the lease is revoked when the hold
// ends. The hold's limit (holdLimit) and the loss it causes are the
// hold's and the watcher's.

// maxHoldGuard is the max hold's guard: at admission, limitHold.
type maxHoldGuard struct{}

func (maxHoldGuard) check(*queue) error { return nil }

func (maxHoldGuard) admitted(ctx context.Context, q *queue, h *hold, _ bool) error {
	return q.limitHold(ctx, h)
}

// limitHold re-attaches h's key to a lease of its own with the max hold
// TTL, so that etcd ends the hold then even if this process hangs. A Put
// keeps the key's create revision: its place, and the token, stay the same.
// On failure its lease is revoked and the error returned (the caller
// removes the key).
func (q *queue) limitHold(ctx context.Context, h *hold) error {
	sent := time.Now()
	g, err := q.s.cli.Grant(ctx, ttlSeconds(q.opts.maxHold))
	if err != nil {
		return errorf("grant max hold lease: %w", err)
	}
	// etcd counts the lease from when it received the grant: no earlier
	// than sent.
	h.limit = &holdLimit{lease: g.ID, deadline: sent.Add(time.Duration(g.TTL) * time.Second)}
	q.s.trackLease(h.limit.lease, h.limit.deadline) // Close revokes it
	resp, err := q.s.cli.Txn(ctx).
		If(q.ownCmps(h.rev)...).
		Then(q.puts(q.value(h.mode), g.ID)...).
		Commit()
	if err == nil && !resp.Succeeded {
		err = errorf("%w: %w", ErrLockLost, q.whyKeyGone(ctx, 0))
	}
	if err != nil {
		q.revokeMaxHold(ctx, h)
		return err
	}
	return nil
}

// revokeMaxHold revokes h's max hold lease, if it has one that has not run
// out and that Close has not revoked. (Revoking a lease that is gone would
// fail, and etcd's client would log a warning.) Once the session has ended
// it writes nothing: Close revokes the lease, or it runs out.
func (q *queue) revokeMaxHold(ctx context.Context, h *hold) {
	if h.maxLease() == 0 || q.s.Err() != nil || !q.s.untrackLease(h.maxLease()) {
		return
	}
	if !time.Now().Before(h.maxDeadline()) {
		return // it has run out
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// Best effort: if it fails the lease expires on its own at the limit,
	// and Close tries again.
	if _, err := q.s.cli.Revoke(cctx, h.maxLease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		q.s.trackLease(h.maxLease(), h.maxDeadline())
	}
}
