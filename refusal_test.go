package etcdlock_test

import (
	"sync"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRefusedRetryAfterLostAnswer: a join whose first answer was lost
// after etcd applied it, and whose retry etcd refuses (the user's role
// lost the lock's keys in between), is not a write refused at once: the
// key the first attempt put is there, and Lock's error says the cleanup
// was refused too, rather than that nothing needed cleaning up. (A join
// refused at its first attempt wrote nothing, and says nothing of a
// cleanup: TestLockDelayPermission.)
func TestRefusedRetryAfterLostAnswer(t *testing.T) {
	t.Parallel()
	name := "authlost"
	c := authCluster(t, name)
	ctx := t.Context()
	admin := c.Client(t, clientv3.Config{Username: "root", Password: "root-pw"})
	var in etcdtest.Injector
	alice := c.Client(t, clientv3.Config{Username: "alice", Password: "alice-pw", DialOptions: in.DialOptions()})
	s := newSession(t, alice)
	var mu sync.Mutex
	var revoked error
	fired := in.At(etcdtest.Nth(1, etcdtest.Method("/etcdserverpb.KV/Txn")), etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
		if err != nil {
			return err
		}
		_, rerr := admin.RoleRevokePermission(ctx, "locker", name+"/", clientv3.GetPrefixRangeEnd(name+"/"))
		mu.Lock()
		revoked = rerr
		mu.Unlock()
		return status.Error(codes.Unavailable, "test: the answer was lost")
	}})
	err := etcdlock.NewMutex(s, name).Lock(ctx)
	<-fired
	mu.Lock()
	require.NoError(t, revoked)
	mu.Unlock()
	require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
	require.ErrorContains(t, err, "after failed lock", "the cleanup was tried, and refused")
	resp, err := admin.Get(ctx, name+"/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the lost attempt's key is there")
	require.Equal(t, int64(s.Lease()), resp.Kvs[0].Lease, "bound to the session's lease: it goes with it")
}
