package etcdlock

import (
	"context"
	"errors"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A pager reads the rest of a range of keys in create-revision order, a
// page at a time, after a first page read elsewhere (in the Txn that put
// or checked a key, say). Two rules make its pages one consistent read:
//
//   - Every page is read at the revision of the first. A later page read
//     at a newer revision, bounded below the keys already read, misses
//     every key created in between, and a decision that takes the first
//     page's revision for the whole read (a Try's guard, a hold's header)
//     is then wrong.
//   - A page can end in the middle of keys that share a create revision:
//     one Txn creates all its keys at one revision, and etcd orders equal
//     ones as it likes. So each later read also reads every key of the
//     boundary revision, and returns those not read yet: a page bounded
//     past that revision would skip them, one bounded at it would return
//     some twice, or return the same keys again and again when more of
//     them share the revision than a page holds.
//
// Both reads of a step go in one read-only Txn: one round trip, as before.
// A pager is used by one goroutine.
type pager struct {
	cli  *clientv3.Client
	pfx  string
	rev  int64 // the revision every page is read at
	desc bool  // newest first
	// page returns the options of the next page, beyond the boundary
	// revision edge: its order, limit and any reads-only options. It is
	// given to OpGet with the prefix, the bound and the revision.
	page func() []clientv3.OpOption
	tie  []clientv3.OpOption // options of the read of the boundary's keys (keys only, serializable)

	edge int64    // the create revision of the last key read
	seen []string // the keys read whose create revision is edge
	more bool     // keys beyond the last page may remain
}

// errPageCompacted says the revision of a read's first page was compacted
// before a later page was read: the read starts again from a new first
// page. It matches rpctypes.ErrCompacted.
var errPageCompacted = errorf("queue read: %w", rpctypes.ErrCompacted)

// add records kvs, a page just read (in the pager's order), and whether
// more keys remain beyond it.
func (p *pager) add(kvs []*mvccpb.KeyValue, more bool) {
	p.more = more
	for _, kv := range kvs {
		if kv.CreateRevision != p.edge {
			p.edge, p.seen = kv.CreateRevision, p.seen[:0]
		}
		p.seen = append(p.seen, string(kv.Key))
	}
}

// next reads the next page, at the pager's revision, and returns its keys
// that were not read before, in order. It returns nil when the range has
// been read (p.more is false then). If etcd has compacted the revision, it
// returns errPageCompacted.
func (p *pager) next(ctx context.Context) ([]*mvccpb.KeyValue, error) {
	if !p.more {
		return nil, nil
	}
	at := clientv3.WithRev(p.rev)
	tie := append(p.tie[:len(p.tie):len(p.tie)], clientv3.WithPrefix(), at,
		clientv3.WithMinCreateRev(p.edge), clientv3.WithMaxCreateRev(p.edge))
	ops := []clientv3.Op{clientv3.OpGet(p.pfx, tie...)}
	// Beyond the edge: nothing lies below revision 1.
	if !p.desc || p.edge > 1 {
		page := append(p.page(), clientv3.WithPrefix(), at)
		if p.desc {
			page = append(page, clientv3.WithMaxCreateRev(p.edge-1))
		} else {
			page = append(page, clientv3.WithMinCreateRev(p.edge+1))
		}
		ops = append(ops, clientv3.OpGet(p.pfx, page...))
	}
	resp, err := p.cli.Txn(ctx).Then(ops...).Commit()
	if errors.Is(err, rpctypes.ErrCompacted) {
		return nil, errPageCompacted
	}
	if err != nil {
		return nil, err
	}
	var out []*mvccpb.KeyValue
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if !slices.Contains(p.seen, string(kv.Key)) {
			out = append(out, kv)
		}
	}
	p.more = false
	if len(ops) > 1 {
		r := resp.Responses[1].GetResponseRange()
		out = append(out, r.Kvs...)
		p.add(r.Kvs, r.More)
	}
	return out, nil
}
