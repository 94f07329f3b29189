package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lock two accounts for a transfer. The MultiMutex holds both names or
// neither: it never holds one while it waits for the other, so two
// transfers naming the accounts in opposite orders cannot deadlock, and a
// Mutex on either account queues with it.
func ExampleMultiMutex_Lock() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	s1, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s1.Close()
	s2, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s2.Close()

	transfer := etcdlock.NewMultiMutex(s1, []string{"example/accounts/alice", "example/accounts/bob"})
	reverse := etcdlock.NewMultiMutex(s2, []string{"example/accounts/bob", "example/accounts/alice"})
	if err := transfer.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding both accounts")
	fmt.Println("the reverse transfer, meanwhile:", errors.Is(reverse.TryLock(ctx), etcdlock.ErrLocked))

	// Fence a write on both names: etcd applies it only while the hold
	// is current on each.
	resp, err := cli.Txn(ctx).
		If(transfer.IsOwner("example/accounts/alice"), transfer.IsOwner("example/accounts/bob")).
		Then(clientv3.OpPut("example/accounts/ledger", "alice->bob 10")).
		Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ledger write applied:", resp.Succeeded)

	first := transfer.Token()
	if err := transfer.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := reverse.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("the reverse transfer holds both, with a larger token:", reverse.Token() > first)
	if err := reverse.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding both accounts
	// the reverse transfer, meanwhile: true
	// ledger write applied: true
	// the reverse transfer holds both, with a larger token: true
}
