package etcdlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Ask a holder to release: a deploy asks the current holder of a
// long-lived lock to hand it over. The request only asks; the holder sees
// it in ReleaseRequested and decides (here it releases at once). Do made
// WithCancelOnRequest cancels fn instead, and Lead made YieldOnRequest
// steps down to the next candidate.
func ExampleRequestRelease() {
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

	m := etcdlock.NewMutex(s, "example/ingest")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	asked := m.ReleaseRequested()

	// Elsewhere (no Session needed): etcdlock release example/ingest.
	if err := etcdlock.RequestRelease(ctx, cli, "example/ingest"); err != nil {
		log.Fatal(err)
	}

	<-asked
	fmt.Println("asked to release")
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	err = etcdlock.RequestRelease(ctx, cli, "example/ingest")
	fmt.Println("asking a free lock:", err)
	// Output:
	// asked to release
	// asking a free lock: etcdlock: lock is not held by anyone: example/ingest
}
