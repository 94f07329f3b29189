package etcdlock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMinHoldSchedules: each RPC the minimum hold sends of its own meets a
// lost answer, a failed request, another client's deletion of the key
// just before it, or a compaction just before it:
//   - the release that the session sends once an early Unlock's minimum
//     hold has passed (its Txn);
//   - Session.Close's move of the rest onto a lease (its Grant, its Txn);
//   - the drop of the record by a hold that outlives its minimum hold (its
//     Txn), after which the holder's session is closed with the lock held.
//
// Whatever happens, a waiter on another client is admitted no sooner than
// the minimum hold after the holder's Lock was asked for, and at the
// revision of the waiter's admission the holder's key is gone (one
// holder at a time, checked against etcd at that revision). (A leader
// move needs three members: the explorer's MutexMinHold schedules have
// them.)
func TestMinHoldSchedules(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	failed := etcdtest.Action{Fail: status.Error(codes.Unavailable, "test: the request failed")}
	const d = 1500 * time.Millisecond
	type path struct {
		name  string
		match func(etcdtest.RPC) bool
		// run locks m (asked at the time it returns first), ends the
		// hold the path's way, and returns when the path's RPC may come.
		run func(t *testing.T, m *etcdlock.Mutex, s *etcdlock.Session) time.Time
	}
	txn := etcdtest.Method("/etcdserverpb.KV/Txn")
	earlyUnlock := func(t *testing.T, m *etcdlock.Mutex, _ *etcdlock.Session) time.Time {
		asked := time.Now()
		require.NoError(t, m.Lock(t.Context()))
		require.NoError(t, m.Unlock(t.Context()))
		return asked
	}
	paths := []path{
		{"HeldBackRelease", txn, earlyUnlock},
		{"CloseGrant", etcdtest.Method("/etcdserverpb.Lease/LeaseGrant"), func(t *testing.T, m *etcdlock.Mutex, s *etcdlock.Session) time.Time {
			asked := earlyUnlock(t, m, s)
			require.NoError(t, s.Close())
			return asked
		}},
		{"CloseTxn", txn, func(t *testing.T, m *etcdlock.Mutex, s *etcdlock.Session) time.Time {
			asked := earlyUnlock(t, m, s)
			require.NoError(t, s.Close())
			return asked
		}},
		{"RecordDrop", txn, func(t *testing.T, m *etcdlock.Mutex, s *etcdlock.Session) time.Time {
			asked := time.Now()
			require.NoError(t, m.Lock(t.Context()))
			return asked // the hold outlives d: the drop comes at d
		}},
	}
	for _, p := range paths {
		for _, f := range []string{"AnswerLost", "Failed", "KeyDeleted", "Compacted"} {
			t.Run(p.name+"/"+f, func(t *testing.T) {
				t.Parallel()
				name := delayName(t)
				var in etcdtest.Injector
				icli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
				s, err := etcdlock.NewSession(t.Context(), icli)
				require.NoError(t, err)
				t.Cleanup(func() { s.Close() })
				m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(d))
				var key string
				act := map[string]etcdtest.Action{
					"AnswerLost": answerLost,
					"Failed":     failed,
					"KeyDeleted": {Before: func(etcdtest.RPC) {
						if _, err := cli.Delete(t.Context(), key); err != nil {
							t.Errorf("delete the key: %v", err)
						}
					}},
					"Compacted": {Before: func(etcdtest.RPC) {
						resp, err := cli.Get(t.Context(), "compact-probe")
						if err == nil {
							_, err = cli.Compact(t.Context(), resp.Header.Revision)
						}
						if err != nil {
							t.Errorf("compact: %v", err)
						}
					}},
				}[f]
				// The path's RPC is the first of its kind once the hold is
				// taken: arm the injection at Lock's return (a hook-free
				// way: count from the RPCs seen so far).
				key = name + "/" + leaseHex(s.Lease())
				armed := false
				fired := in.At(func(r etcdtest.RPC) bool {
					if !armed {
						armed = isKeyPut(r, key) // the Txn that takes the lock
						return false
					}
					return p.match(r)
				}, act)
				asked := p.run(t, m, s)
				awaitFired(t, fired)
				if p.name == "RecordDrop" {
					require.NoError(t, s.Close()) // a crash after d, the lock held
				}
				w := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMinHold(d))
				require.NoError(t, w.Lock(t.Context()))
				require.GreaterOrEqual(t, time.Since(asked), d, "admitted before the minimum hold had passed")
				resp, err := cli.Get(t.Context(), key, clientv3.WithRev(w.Header().Revision))
				if err == nil { // (a compaction past that revision leaves nothing to read)
					require.Empty(t, resp.Kvs, "the holder's key was there when the waiter was admitted")
				}
				require.NoError(t, w.Unlock(t.Context()))
			})
		}
	}
}

// leaseHex is a lease ID as keys spell it.
func leaseHex(id clientv3.LeaseID) string { return fmt.Sprintf("%x", int64(id)) }

// isKeyPut reports whether r is a Txn that puts key (at its top level).
func isKeyPut(r etcdtest.RPC, key string) bool {
	txn, ok := r.Req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	for _, op := range txn.Success {
		if put := op.GetRequestPut(); put != nil && string(put.Key) == key {
			return true
		}
	}
	return false
}
