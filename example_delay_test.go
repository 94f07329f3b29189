package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A lock delay protects a resource that cannot check a fencing token: a
// holder that ends without Unlock (here its session is closed with the
// lock held, as a crash ends it when its lease runs out) keeps the lock
// free for the delay, so that its writes still in flight land before the
// next holder starts. An Unlock hands over at once.
func ExampleWithLockDelay() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	const delay = 2 * time.Second

	crashed, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	s, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	m := etcdlock.NewMutex(crashed, "example/printer", etcdlock.WithLockDelay(delay))
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	ended := time.Now()
	crashed.Close() // the lease ends with the lock held: no Unlock

	next := etcdlock.NewMutex(s, "example/printer", etcdlock.WithLockDelay(delay))
	if err := next.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("next holder waited out the delay:", time.Since(ended) >= delay)
	if err := next.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	q, err := etcdlock.InspectLock(ctx, cli, "example/printer")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("delays pending after an Unlock:", len(q.Delays))
	// Output:
	// next holder waited out the delay: true
	// delays pending after an Unlock: 0
}
