package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fence writes to a key that holders write through different sessions: a
// holder whose lease ended while it was paused still believes it holds,
// but once the next holder has written, its late write is refused.
func ExampleFencedWrite() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	const fence, config = "example/config.fence", "example/config"

	s1, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s1.Close()
	first := etcdlock.NewMutex(s1, "example/config-writer")
	if err := first.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	// The first holder pauses past its lease (here: the lease is revoked).
	if _, err := cli.Revoke(ctx, s1.Lease()); err != nil {
		log.Fatal(err)
	}

	s2, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s2.Close()
	next := etcdlock.NewMutex(s2, "example/config-writer")
	if err := next.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := etcdlock.FencedWrite(ctx, cli, fence, next.Token(), clientv3.OpPut(config, "v2")); err != nil {
		log.Fatal(err)
	}
	if err := next.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	// The first holder wakes up and writes with its own token.
	_, err = etcdlock.FencedWrite(ctx, cli, fence, first.Token(), clientv3.OpPut(config, "v1"))
	fmt.Println(errors.Is(err, etcdlock.ErrStaleToken))
	resp, err := cli.Get(ctx, config)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(resp.Kvs[0].Value))
	// Output:
	// true
	// v2
}
