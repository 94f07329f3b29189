package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The release batcher's schedules (batch.go): a session's releases made
// while others are in flight go to etcd in one Txn. Each test sends every
// release in a batch, holds the first batch's RPC at the injector until
// the others wait for the next, so the batch is the same on every run,
// and checks against etcd what it did.

// batchRig is a session whose every release goes in a batch, with its
// locks on names of the test.
type batchRig struct {
	t   *testing.T
	in  *etcdtest.Injector
	cli *clientv3.Client
	s   *etcdlock.Session
	ms  []*etcdlock.Mutex

	mu   sync.Mutex
	txns int // Txns the client sent
}

// countTxns returns how many Txns the rig's client has sent.
func (r *batchRig) countTxns() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.txns
}

// newBatchRig locks names on a session of a client of c whose releases
// all go in batches.
func newBatchRig(t *testing.T, c *etcdtest.Cluster, names []string, cfg clientv3.Config) *batchRig {
	t.Helper()
	r := &batchRig{t: t, in: &etcdtest.Injector{}}
	cfg.DialOptions = r.in.DialOptions()
	r.cli = c.Client(t, cfg)
	r.in.Trace(func(rpc etcdtest.RPC) {
		if rpc.Method == etcdtest.MethodTxn {
			r.mu.Lock()
			r.txns++
			r.mu.Unlock()
		}
	})
	r.s = newSession(t, r.cli)
	etcdlock.SetReleasesInFlight(r.s, 0)
	for _, name := range names {
		m := etcdlock.NewMutex(r.s, name)
		require.NoError(t, m.Lock(t.Context()))
		r.ms = append(r.ms, m)
	}
	return r
}

// unlockTogether unlocks ms[0], and, while its batch (of one) waits at
// the injector, the others, once they all wait for the next batch; before
// and after run at that batch's RPC (nil: nothing). It returns each
// Unlock's error, and the batch's request.
func (r *batchRig) unlockTogether(before func(), after func(error) error) ([]error, *pb.TxnRequest) {
	t := r.t
	ctx := t.Context()
	errs := make([]error, len(r.ms))
	var wg sync.WaitGroup
	start := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.ms[i].Unlock(ctx)
		}()
	}
	var batch *pb.TxnRequest
	r.in.At(etcdtest.Nth(1, etcdtest.Method(etcdtest.MethodTxn)), etcdtest.Action{Before: func(etcdtest.RPC) {
		r.in.At(etcdtest.Nth(1, etcdtest.Method(etcdtest.MethodTxn)), etcdtest.Action{
			Before: func(rpc etcdtest.RPC) {
				batch = rpc.Req.(*pb.TxnRequest)
				if before != nil {
					before()
				}
			},
			After: func(_ etcdtest.RPC, err error) error {
				if after != nil {
					return after(err)
				}
				return err
			},
		})
		for i := 1; i < len(r.ms); i++ {
			start(i)
		}
		// (assert, not require: this runs on the batcher's goroutine,
		// which a FailNow would end, and the test with it would hang.)
		assert.Eventually(t, func() bool { return etcdlock.ReleasesWaiting(r.s) == len(r.ms)-1 }, 10*time.Second, time.Millisecond)
	}})
	start(0)
	wg.Wait()
	return errs, batch
}

// batchNames returns n names of the test.
func batchNames(t *testing.T, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", lockName(t), i)
	}
	return names
}

// requireNested requires req to be a batch of n releases: no compare of its
// own, and each release a Txn nested in its Then.
func requireNested(t *testing.T, req *pb.TxnRequest, n int) {
	t.Helper()
	require.NotNil(t, req, "no batch was sent")
	require.Empty(t, req.Compare)
	require.Len(t, req.Success, n)
	for _, op := range req.Success {
		require.NotNil(t, op.GetRequestTxn(), "a batch's op is not a release's Txn: %v", op)
	}
}

func TestUnlocksBatched(t *testing.T) {
	names := batchNames(t, 4)
	r := newBatchRig(t, cluster, names, clientv3.Config{})
	// A waiter on a batched name is admitted when the batch releases it.
	w := startWaiter(t.Context(), etcdlock.NewMutex(newSession(t, newClient(t)), names[2]))
	w.waitIdle(t)

	before := r.countTxns()
	errs, batch := r.unlockTogether(nil, nil)
	for i, err := range errs {
		require.NoError(t, err, "Unlock of %s", names[i])
	}
	requireNested(t, batch, 3)
	require.Equal(t, 2, r.countTxns()-before, "two Txns for four releases: a batch of one, then of three")
	for _, name := range names {
		if name != names[2] {
			require.Empty(t, keys(t, r.cli, name), name)
		}
	}
	require.NoError(t, w.result(t, 10*time.Second))
}

// A batched release whose key went, and came back with the same lease (a
// second process on the lease, or an operator), deletes nothing: its
// compare guards its own delete, and the others are released.
func TestBatchedUnlockDeletesNoOtherKey(t *testing.T) {
	names := batchNames(t, 3)
	r := newBatchRig(t, cluster, names, clientv3.Config{})
	other := newClient(t)
	key := r.ms[1].Key()
	errs, batch := r.unlockTogether(func() {
		_, err := other.Delete(t.Context(), key)
		assert.NoError(t, err)
		_, err = other.Put(t.Context(), key, "another's", clientv3.WithLease(r.s.Lease()))
		assert.NoError(t, err)
	}, nil)
	requireNested(t, batch, 2)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], etcdlock.ErrLockLost)
	require.NoError(t, errs[2])
	resp, err := other.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the batch deleted a key that was not the hold's")
	require.Equal(t, "another's", string(resp.Kvs[0].Value))
	require.Empty(t, keys(t, r.cli, names[2]))
}

// A batch whose answer is lost after etcd applied it: each release is
// sent again, finds its key gone by its own earlier attempt, and Unlock
// returns nil.
func TestBatchAnswerLost(t *testing.T) {
	names := batchNames(t, 3)
	r := newBatchRig(t, cluster, names, clientv3.Config{})
	lost := 0
	errs, batch := r.unlockTogether(nil, func(err error) error {
		assert.NoError(t, err)
		lost++
		return rpctypes.ErrGRPCTimeout
	})
	requireNested(t, batch, 2)
	require.Equal(t, 1, lost)
	for i, err := range errs {
		require.NoError(t, err, "Unlock of %s", names[i])
		require.Empty(t, keys(t, r.cli, names[i]))
	}
}

// A batch etcd refuses for one release's sake (a permission revoked while
// held) is sent again release by release: the others are released, and
// the refused one's Unlock says why; it can be released once permitted.
func TestBatchRefusedOneByOne(t *testing.T) {
	name := lockName(t)
	c := authCluster(t, name)
	names := []string{name + "/a", name + "/b", name + "/c"}
	r := newBatchRig(t, c, names, clientv3.Config{Username: "alice", Password: "alice-pw"})
	root := c.Client(t, clientv3.Config{Username: "root", Password: "root-pw"})
	ctx := t.Context()
	// alice may still write under name/ but no longer name/c/.
	_, err := root.RoleRevokePermission(ctx, "locker", name+"/", clientv3.GetPrefixRangeEnd(name+"/"))
	require.NoError(t, err)
	for _, p := range []string{names[0] + "/", names[1] + "/"} {
		_, err = root.RoleGrantPermission(ctx, "locker", p, clientv3.GetPrefixRangeEnd(p), clientv3.PermissionType(clientv3.PermReadWrite))
		require.NoError(t, err)
	}
	_, err = root.RoleGrantPermission(ctx, "locker", names[2]+"/", clientv3.GetPrefixRangeEnd(names[2]+"/"), clientv3.PermissionType(clientv3.PermRead))
	require.NoError(t, err)

	before := r.countTxns()
	errs, batch := r.unlockTogether(nil, nil)
	requireNested(t, batch, 2)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	if strings.HasPrefix(c.Version(), "3.4.") {
		// etcd 3.4 (Debian's 3.4.23) does not check the permissions of a
		// nested Txn's operations, as 3.5 does: the batch deletes the key
		// alice may no longer delete, as a MultiMutex's release (a nested
		// Txn in its Else) always could there. Her own key, by its
		// create revision.
		require.NoError(t, errs[2])
		require.Empty(t, keys(t, root, names[2]))
		return
	}
	require.True(t, errors.Is(errs[2], rpctypes.ErrPermissionDenied) || errors.Is(errs[2], rpctypes.ErrGRPCPermissionDenied), "Unlock of a key alice may not delete: %v", errs[2])
	require.Equal(t, 4, r.countTxns()-before, "the first batch, the second, then each of its two alone")
	require.Empty(t, keys(t, root, names[1]))
	require.Len(t, keys(t, root, names[2]), 1, "the refused release's key stays")

	_, err = root.RoleGrantPermission(ctx, "locker", names[2]+"/", clientv3.GetPrefixRangeEnd(names[2]+"/"), clientv3.PermissionType(clientv3.PermReadWrite))
	require.NoError(t, err)
	require.NoError(t, r.ms[2].Unlock(ctx))
	require.Empty(t, keys(t, root, names[2]))
}

// On an etcd whose Txns may hold fewer operations than a batch, the batch
// is refused, sent again release by release, and later batches are
// smaller.
func TestBatchTooManyOps(t *testing.T) {
	c := etcdtest.StartFlags(t, 1, "--max-txn-ops=2")
	names := batchNames(t, 4)
	r := newBatchRig(t, c, names, clientv3.Config{})
	errs, batch := r.unlockTogether(nil, nil)
	requireNested(t, batch, 3)
	for i, err := range errs {
		require.NoError(t, err, "Unlock of %s", names[i])
		require.Empty(t, keys(t, r.cli, names[i]))
	}
	// The bound is now one release a batch (half of 3): four more go as
	// four batches of one, all accepted.
	for _, m := range r.ms {
		require.NoError(t, m.Lock(t.Context()))
	}
	errs, batch = r.unlockTogether(nil, nil)
	requireNested(t, batch, 1)
	for i, err := range errs {
		require.NoError(t, err, "Unlock of %s", names[i])
		require.Empty(t, keys(t, r.cli, names[i]))
	}
}

// An Unlock whose ctx ends while it waits for a batch returns ctx's error
// at once, though the batch in flight has not answered, and its release
// goes on in the background: the key goes, and the session's other
// releases are not held up.
func TestBatchWaitCancelled(t *testing.T) {
	names := batchNames(t, 3)
	r := newBatchRig(t, cluster, names, clientv3.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	// (assert, not require: the hook runs on the batcher's goroutine.)
	r.in.At(etcdtest.Nth(1, etcdtest.Method(etcdtest.MethodTxn)), etcdtest.Action{Before: func(etcdtest.RPC) {
		go func() { done <- r.ms[1].Unlock(ctx) }()
		assert.Eventually(t, func() bool { return etcdlock.ReleasesWaiting(r.s) == 1 }, 10*time.Second, time.Millisecond)
		cancel()
		// The batch in flight waits here: the Unlock returns without it.
		// (The session's releaser may queue the release again at once.)
		assert.ErrorIs(t, <-done, context.Canceled)
	}})
	require.NoError(t, r.ms[0].Unlock(t.Context()))
	require.NoError(t, r.ms[2].Unlock(t.Context()))
	require.Empty(t, keys(t, r.cli, names[2]))
	require.Eventually(t, func() bool { return len(keys(t, r.cli, names[1])) == 0 }, 10*time.Second, 10*time.Millisecond, "the background release")
}
