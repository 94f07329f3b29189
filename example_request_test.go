package etcdlock_test

import (
	"context"
	"errors"
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

// Break a wedged hold: an operator reads who holds, and evicts that hold
// by its key and token (etcdlock break does the same). The holder is not
// asked: it learns its hold is lost, and its writes are refused where
// they are fenced once a later holder has written.
func ExampleEvict() {
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
	wedged := etcdlock.NewMutex(s, "example/evict")
	if err := wedged.Lock(ctx); err != nil {
		log.Fatal(err)
	}

	// The operator, with a client of its own.
	q, err := etcdlock.InspectLock(ctx, cli, "example/evict")
	if err != nil {
		log.Fatal(err)
	}
	h := q.Holders()[0]
	if err := etcdlock.Evict(ctx, cli, "example/evict", h.Key, h.Token); err != nil {
		log.Fatal(err)
	}

	<-wedged.Done()
	fmt.Println("holder told:", errors.Is(wedged.Err(), etcdlock.ErrLockLost))
	err = etcdlock.Evict(ctx, cli, "example/evict", h.Key, h.Token)
	fmt.Println("again:", errors.Is(err, etcdlock.ErrNotInQueue))
	// Output:
	// holder told: true
	// again: true
}
