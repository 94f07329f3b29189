package bench

import (
	"context"
	"time"

	"github.com/etcdlock/etcdlock"
)

// The minimum hold scenario measures what WithMinHold costs an
// uncontended Lock+Unlock: the record written in the Txn that takes the
// lock (no RPC of its own), and the release sent by the session when the
// minimum hold has passed instead of by Unlock (the same one RPC). The
// minimum hold is 1ms, less than one round trip, so that the loop's next
// Lock (same session and name) seldom waits for it. etcd's Mutex has no
// minimum hold: it compares our Mutex with one with our Mutex without.
//
//   - minhold-uncontended: Lock+Unlock, against uncontended (ours).
var minHoldScenarios = []Scenario{
	{
		Name: "minhold-uncontended", Unit: "Lock+Unlock", Short: true, N: 100, ShortN: 20,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"uncontended", Etcdlock.Name},
		Baseline: "etcdlock Mutex without a minimum hold",
		Targets:  []Target{RPCsEqual(2)},
		Run: uncontendedOf("minhold-uncontended", func(s Session, name string) func(context.Context) error {
			m := etcdlockMutex{etcdlock.NewMutex(s.(etcdlockSession).Session, name, etcdlock.WithMinHold(time.Millisecond))}
			return func(ctx context.Context) error { return lockUnlock(ctx, m) }
		}),
	},
}

func init() { Scenarios = append(Scenarios, minHoldScenarios...) }
