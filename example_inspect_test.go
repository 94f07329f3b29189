package etcdlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// See who holds a lock, with the identity it recorded when it joined the
// queue. InspectLock and ListLocks need no Session and write nothing.
func ExampleInspectLock() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	s, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	m := etcdlock.NewMutex(s, "example/inspect/nightly", etcdlock.WithIdentity("billing-7 pid 4242"))
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Unlock(ctx)

	q, err := etcdlock.InspectLock(ctx, cli, "example/inspect/nightly")
	if err != nil {
		log.Fatal(err)
	}
	for _, k := range q.Holders() {
		fmt.Printf("held by %q, mode %s, token is Token: %v, lease TTL %ds\n", k.Identity, k.Mode, k.Token == m.Token(), k.GrantedTTL)
	}
	fmt.Println("waiters:", len(q.Waiters()))

	l, err := etcdlock.ListLocks(ctx, cli, "example/inspect/")
	if err != nil {
		log.Fatal(err)
	}
	for _, lk := range l.Locks {
		fmt.Printf("%s: %q, %d waiting\n", lk.Name, lk.Holders[0].Identity, lk.Waiters)
	}
	// Output:
	// held by "billing-7 pid 4242", mode exclusive, token is Token: true, lease TTL 15s
	// waiters: 0
	// example/inspect/nightly: "billing-7 pid 4242", 0 waiting
}
