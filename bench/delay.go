package bench

import (
	"context"
	"time"

	"github.com/etcdlock/etcdlock"
)

// The lock delay scenarios measure what WithLockDelay costs while nothing
// crashes: the record's write when a hold is admitted (one more RPC), and
// one more range in the queue's reads. etcd's Mutex has no lock delay:
// they compare our Mutex with a delay with our Mutex without one.
//
//   - delay-uncontended: Lock+Unlock, against uncontended (ours);
//   - delay-contend-4: 4 contenders, against contend-4 (ours).
var delayScenarios = []Scenario{
	{
		Name: "delay-uncontended", Unit: "Lock+Unlock", Short: true, N: 100, ShortN: 20,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"uncontended", Etcdlock.Name},
		Baseline: "etcdlock Mutex without a delay",
		Targets:  []Target{RPCsEqual(2)},
		Run: uncontendedOf("delay-uncontended", func(s Session, name string) func(context.Context) error {
			m := delayMutex(s, name)
			return func(ctx context.Context) error { return lockUnlock(ctx, m) }
		}),
	},
	{
		Name: "delay-contend-4", Unit: "acquisition", Short: true, N: 100, ShortN: 20,
		Impls:    []string{Etcdlock.Name},
		Versus:   &Ref{"contend-4", Etcdlock.Name},
		Baseline: "etcdlock Mutex without a delay",
		Run:      contendWith("delay-contend-4", 4, 1, delayMutex),
	},
}

func init() { Scenarios = append(Scenarios, delayScenarios...) }

// delayMutex returns our Mutex with Consul's default lock delay, 15s.
// The scenarios run only for ours.
func delayMutex(s Session, name string) Mutex {
	return etcdlockMutex{etcdlock.NewMutex(s.(etcdlockSession).Session, name, etcdlock.WithLockDelay(15*time.Second))}
}
