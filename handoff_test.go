package etcdlock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A TryLock whose write etcd applied but whose answer is late returns
// when its ctx ends, without waiting for the answer (issue 41: gocron's
// Locker, bounded by d, waited 3 s for it); once the answer comes, the
// session removes the key the write put, and gives the name back.
func TestTryLockReturnsBeforeLateWrite(t *testing.T) {
	for _, tc := range []struct {
		name string
		lock func(s *etcdlock.Session, name string) interface {
			TryLock(context.Context) error
		}
		keys func(name string) []string
	}{
		{"Mutex", func(s *etcdlock.Session, name string) interface{ TryLock(context.Context) error } {
			return etcdlock.NewMutex(s, name)
		}, func(name string) []string { return []string{name} }},
		{"LockDelay", func(s *etcdlock.Session, name string) interface{ TryLock(context.Context) error } {
			return etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(time.Hour))
		}, func(name string) []string { return []string{name, etcdlock.LockDelayPrefix + name} }},
		{"MultiMutex", func(s *etcdlock.Session, name string) interface{ TryLock(context.Context) error } {
			return etcdlock.NewMultiMutex(s, []string{name + "/a", name + "/b"})
		}, func(name string) []string { return []string{name + "/a", name + "/b"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A name of its own each run (-count): a run's last hold
			// ends with its session, and leaves a lock delay pending.
			name := fmt.Sprintf("%s/%d", lockName(t), time.Now().UnixNano())
			in := &etcdtest.Injector{}
			cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			s := newSession(t, cli)
			answer := make(chan struct{})
			applied := make(chan struct{})
			// The write: the Txn that puts the lock's key (each, for a
			// set) under the session's lease.
			in.At(func(r etcdtest.RPC) bool {
				req, ok := r.Req.(*pb.TxnRequest)
				if !ok || len(req.Success) == 0 {
					return false
				}
				put := req.Success[0].GetRequestPut()
				return put != nil && clientv3.LeaseID(put.Lease) == s.Lease() && strings.HasPrefix(string(put.Key), name+"/")
			}, etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
				assert.NoError(t, err) // (assert: this runs on the RPC's goroutine)
				close(applied)
				<-answer // the answer arrives only once the test says so
				return err
			}})
			// The caller gives up once etcd has applied the write, its
			// answer held back: nothing here depends on timing.
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			l := tc.lock(s, name)
			res := make(chan error, 1)
			go func() { res <- l.TryLock(ctx) }()
			<-applied
			cancel()
			var err error
			select {
			case err = <-res:
			case <-time.After(20 * time.Second): // a bound for the failure only
				close(answer)
				<-res
				t.Fatal("TryLock waited for its write's answer, past its ctx")
			}
			require.ErrorIs(t, err, context.Canceled)
			other := newClient(t)
			for _, k := range tc.keys(name) {
				require.NotEmpty(t, keys(t, other, k), "the write was applied: its key is there until the answer comes")
			}
			close(answer)
			require.Eventually(t, func() bool { return etcdlock.BackgroundRunning(s) == 0 }, 30*time.Second, 10*time.Millisecond)
			for _, k := range tc.keys(name) {
				require.Empty(t, keys(t, other, k), "the session removed what the write put")
			}
			// The name is the session's to take again.
			require.NoError(t, tc.lock(s, name).TryLock(t.Context()))
		})
	}
}
