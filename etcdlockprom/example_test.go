package etcdlockprom_test

import (
	"context"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockprom"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Export a session's lock metrics to Prometheus: one Metrics, registered
// once, serves every session given its Hooks.
func ExampleNew() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer

	m := etcdlockprom.New(etcdlockprom.Options{}) // LockNames: true adds the label name
	reg.MustRegister(m)
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(m.Hooks()))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	mu := etcdlock.NewMutex(s, "example/metrics")
	if err := mu.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := mu.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "etcdlock_acquire_duration_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			if n := s.GetHistogram().GetSampleCount(); n > 0 {
				fmt.Print(f.GetName(), "{")
				for i, l := range s.GetLabel() {
					if i > 0 {
						fmt.Print(",")
					}
					fmt.Printf("%s=%q", l.GetName(), l.GetValue())
				}
				fmt.Println("} count", n)
			}
		}
	}
	// Output:
	// etcdlock_acquire_duration_seconds{kind="mutex",outcome="acquired"} count 1
}
