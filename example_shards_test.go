package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Spread 8 shards of work (tenants, partitions, queues) over the replicas
// alive: each shard runs on one replica at a time, and moves when a
// replica joins, leaves or drains. Here two replicas run in one process;
// in production each is a process of its own, with the same call.
func ExampleRunShards() {
	ctx, cancel := context.WithCancel(context.Background())
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	const name, n = "example/tenants", 8
	var wg sync.WaitGroup
	replica := func(identity string) *etcdlock.Session {
		s, err := etcdlock.NewSession(ctx, cli)
		if err != nil {
			log.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			err := etcdlock.RunShards(ctx, s, name, n, func(ctx context.Context, sh etcdlock.Shard) error {
				// Work on shard sh.Num until ctx ends: the shard moved
				// away, was lost, or RunShards is ending. Fence writes
				// with sh.Token (FencedWrite, etcdlocksql).
				<-ctx.Done()
				return nil
			}, etcdlock.WithShardIdentity(identity))
			if err != nil {
				log.Print(err)
			}
		}()
		return s
	}

	replica("a")
	show(ctx, cli, name, n, 1)
	b := replica("b")
	show(ctx, cli, name, n, 2)

	// Before a deploy, drain b: its shards are handed over to a.
	if err := etcdlock.SetShardWeight(ctx, cli, name, b.Lease(), 0); err != nil {
		log.Fatal(err)
	}
	show(ctx, cli, name, n, 2)

	cancel() // each replica releases its shards and leaves
	wg.Wait()
	// Output:
	// a owns 8
	// a owns 4, b owns 4
	// a owns 8, b owns 0
}

// show waits until the set has members replicas and every shard runs
// where the assignment puts it, and prints who owns how many.
func show(ctx context.Context, cli *clientv3.Client, name string, n, members int) {
	for {
		set, err := etcdlock.InspectShards(ctx, cli, name, n)
		if err != nil {
			log.Fatal(err)
		}
		settled := len(set.Members) == members
		for _, sh := range set.Shards {
			settled = settled && !sh.Moving()
		}
		if settled {
			slices.SortFunc(set.Members, func(a, b etcdlock.ShardMember) int { return strings.Compare(a.Identity, b.Identity) })
			var owns []string
			for _, m := range set.Members {
				owns = append(owns, fmt.Sprintf("%s owns %d", m.Identity, m.Owns))
			}
			fmt.Println(strings.Join(owns, ", "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
