package etcdlock

import (
	"context"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Breaking a lock from outside: an operator's Evict of one hold or one
// waiter (etcdlock break).

// Evict ends one hold, or one waiter's place, of the lock name, for an
// operator (etcdlock break): it deletes key, a key of name's queue as
// InspectLock lists it (name/<lease ID in hex>), if its create revision
// is still token, the hold's fencing token (QueueKey.Token). The holder
// did not ask for it, and is not asked.
//
// After it:
//   - the key is gone, and the next in line is admitted as after an
//     Unlock, unless the evicted hold left a lock delay record
//     (WithLockDelay) or a minimum hold's (WithMinHold): that stays,
//     and keeps the lock free for its delay (the rest of the minimum
//     hold), as after a crash;
//   - the evicted holder's Mutex, Election or Lead learns within moments
//     that its hold is lost (Done closes, Err matches ErrLockLost); an
//     evicted waiter's Lock returns an error matching ErrLockLost;
//   - nothing stops the evicted holder's process: what it writes is
//     refused only where it is fenced, by FencedWrite or etcdlocksql once
//     a later holder has written with its larger token, or guarded by
//     IsOwner. Fence what a lock protects before relying on Evict.
//
// It returns nil once etcd deleted the key; an error matching
// ErrNotInQueue if the key was not there with that create revision;
// ErrInvalidName for an invalid name or a key that is not one of
// name's; ErrInvalidOption for a token that is not positive; and etcd's
// error otherwise (it needs write permission on the keys with prefix
// name/). The delete is one Txn, guarded by the token: it never deletes
// a later hold's key.
func Evict(ctx context.Context, cli *clientv3.Client, name, key string, token int64) error {
	if err := checkName(name); err != nil {
		return err
	}
	if rest, ok := strings.CutPrefix(key, name+"/"); !ok || rest == "" || strings.Contains(rest, "/") {
		return errorf("%w: %q is not a key of the lock %s (%s/<lease ID in hex>)", ErrInvalidName, key, name, name)
	}
	if token <= 0 {
		return errorf("%w: token %d: a hold's token is positive", ErrInvalidOption, token)
	}
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", token)).Then(clientv3.OpDelete(key)).Commit()
	switch {
	case err != nil:
		return err
	case !resp.Succeeded:
		return errorf("%w: %s with token %d", ErrNotInQueue, key, token)
	}
	return nil
}
