package etcdlock

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fencing at etcd: writes to keys that holders of different locks, or of
// one lock through different sessions, share, refused once a holder with a
// newer token has written (FencedWrite). IsOwner guards a write by the
// writer's own key; a fence guards it by every writer's token.

// fenceDigits is the width of a token in a fence key: int64's largest
// value has 19 decimal digits.
const fenceDigits = 19

// FenceValue returns the value FencedWrite stores in a fence key for
// token: the token in decimal, zero-padded to 19 digits, so that etcd's
// comparison of values, byte by byte, orders tokens as numbers.
func FenceValue(token int64) string { return fmt.Sprintf("%0*d", fenceDigits, token) }

// FencedWrite applies ops in one etcd Txn only if token is at least every
// token that fenced fenceKey before, and records token in fenceKey in that
// Txn; otherwise it applies nothing and returns ErrStaleToken. It returns
// the responses of ops, in order, with the Txn's header.
//
// Give every writer of a resource the same fenceKey and its hold's Token
// (Mutex.Token, or ETCDLOCK_TOKEN from `etcdlock run`): once a holder has
// written with its token, no holder before it (a smaller token) can
// write, even one that still believes it holds because its process was
// paused past its lease. The same token passes again, so a holder may
// write many times, and may send a write again after an error whose
// outcome is unknown (FencedWrite sends it once). The tokens of one
// lock's exclusive holds (a Mutex's, an RWMutex's write locks) strictly
// increase from holder to holder. Shared holds (an RWMutex's readers, a
// Semaphore's permits) hold at once with different tokens: fence their
// writes only where the older of two may be refused while it still
// holds. Across locks, a fence orders writers by their tokens, the
// revisions at which their keys joined their locks' queues, not by when
// they acquired: a writer that queued for one lock behind a long hold and
// acquired it last is refused once a writer of another lock that queued
// after it has written. Writers that must be ordered by acquisition take
// one lock (or one MultiMutex over the names, whose hold has one token).
//
// fenceKey is the program's to choose, outside the library's reserved
// range (ErrInvalidName), and only FencedWrite writes it: a value it did
// not write compares as bytes. Keep it out of every lock's queue (not
// under NAME/ of a lock name): a key there, bound to no lease, would wait
// in that queue for good. token must be positive, as every hold's
// is. The Txn needs read and write permission on fenceKey and whatever ops
// touch.
func FencedWrite(ctx context.Context, cli *clientv3.Client, fenceKey string, token int64, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	switch {
	case fenceKey == "":
		return nil, errorf("%w: empty fence key", ErrInvalidName)
	case token <= 0:
		return nil, errorf("etcdlock: fencing token %d: a hold's token is positive", token)
	case strings.HasPrefix(fenceKey, reservedPrefix):
		return nil, errorf("%w: fence key %q is in the library's own range %q", ErrInvalidName, fenceKey, reservedPrefix)
	}
	v := FenceValue(token)
	write := append([]clientv3.Op{clientv3.OpPut(fenceKey, v)}, ops...)
	// etcd fails every comparison of a missing key's value, and has no
	// "<=": the first write is the Then, a later one the nested Txn's
	// Else, taken when the fence's value is not above ours.
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", 0)).
		Then(write...).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(fenceKey), ">", v)}, nil, write)).
		Commit()
	if err != nil {
		return nil, err
	}
	rs := resp.Responses
	if !resp.Succeeded {
		in := rs[0].GetResponseTxn()
		if in.Succeeded {
			return nil, errorf("%w: %s holds a higher token than %d", ErrStaleToken, fenceKey, token)
		}
		rs = in.Responses
	}
	return &clientv3.TxnResponse{Header: resp.Header, Succeeded: true, Responses: rs[1:]}, nil
}
