package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Campaign to become the primary, publish an address, and step down. The
// Session's lease keeps the leadership: if this process dies, the next
// candidate wins TTL later.
func ExampleElection_Campaign() {
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
	defer s.Close() // revokes the lease: resigns if still leader

	e := etcdlock.NewElection(s, "example/primary")
	if err := e.Campaign(ctx, "10.0.0.1:8080"); err != nil {
		log.Fatal(err)
	}
	l, err := e.Leader(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("leader: %s, it is us: %v\n", l.Value, l.Key == e.Key())

	// The leader moves; observers see the new value, same token.
	if err := e.Proclaim(ctx, "10.0.0.1:9090"); err != nil {
		log.Fatal(err)
	}
	l, _ = e.Leader(ctx)
	fmt.Printf("leader: %s, same token: %v\n", l.Value, l.Token == e.Token())

	// Work while leader, stop when leadership ends: Done closes before
	// anyone else can win.
	select {
	case <-e.Done():
		log.Fatal("leadership lost: ", e.Err())
	default:
	}

	if err := e.Resign(ctx); err != nil {
		log.Fatal(err)
	}
	_, err = e.Leader(ctx)
	fmt.Println("after Resign:", err)
	// Output:
	// leader: 10.0.0.1:8080, it is us: true
	// leader: 10.0.0.1:9090, same token: true
	// after Resign: etcdlock: election has no leader: example/primary
}

// Follow an election without a Session: a client that routes to the
// primary learns each new leader, and that there is none, as it happens.
func ExampleObserveLeader() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
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
	e := etcdlock.NewElection(s, "example/observed")

	n := 0
	for l, err := range etcdlock.ObserveLeader(ctx, cli, "example/observed") {
		if err != nil {
			log.Fatal(err) // etcd refused, or the client closed: the sequence ends
		}
		if l.Key == "" {
			fmt.Println("no leader")
		} else {
			fmt.Println("leader:", string(l.Value))
		}
		n++
		switch n {
		case 1:
			if err := e.Campaign(ctx, "primary-a"); err != nil {
				log.Fatal(err)
			}
		case 2:
			if err := e.Proclaim(ctx, "primary-a, moved"); err != nil {
				log.Fatal(err)
			}
		case 3:
			if err := e.Resign(ctx); err != nil {
				log.Fatal(err)
			}
		}
		if n == 4 {
			break // ends the watch
		}
	}
	// Output:
	// no leader
	// leader: primary-a
	// leader: primary-a, moved
	// no leader
}

// Fence a primary's writes: fn's ctx carries the term Lead won. A write to
// etcd guarded by the term's IsOwner is applied only while the term lasts,
// so a primary that lost its term (paused past the TTL, say) cannot
// overwrite its successor's work; writes elsewhere carry the term's Token.
func ExampleTermFromContext() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	var term etcdlock.Term
	err = etcdlock.Lead(ctx, cli, "example/fenced", "instance-a", func(ctx context.Context) error {
		var ok bool
		term, ok = etcdlock.TermFromContext(ctx)
		if !ok {
			return errors.New("not in Lead's fn")
		}
		resp, err := cli.Txn(ctx).
			If(term.IsOwner()).
			Then(clientv3.OpPut("example/fenced-state", "written by "+string(term.Value))).
			Commit()
		if err != nil {
			return err
		}
		fmt.Println("while leading, write applied:", resp.Succeeded)
		// Outside etcd, send term.Token with each write, and have the
		// store reject tokens lower than the highest it has accepted.
		return nil // done: Lead resigns and returns
	})
	fmt.Println("Lead returned:", err)

	// The term ended with the resign: its guard holds no more.
	resp, err := cli.Txn(ctx).
		If(term.IsOwner()).
		Then(clientv3.OpPut("example/fenced-state", "stale")).
		Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("after the term, write applied:", resp.Succeeded)
	_, ok := etcdlock.TermFromContext(ctx)
	fmt.Println("a term outside fn:", ok)
	// Output:
	// while leading, write applied: true
	// Lead returned: <nil>
	// after the term, write applied: false
	// a term outside fn: false
}
