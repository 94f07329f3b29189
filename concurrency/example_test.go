package concurrency_test

import (
	"context"
	"fmt"
	"log"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/concurrency"
)

// Code written for etcd's package runs as it is: only its import changed.
func ExampleMutex_Lock() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	s1, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		log.Fatal(err)
	}
	defer s1.Close()
	m1 := concurrency.NewMutex(s1, "/my-lock/")

	s2, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		log.Fatal(err)
	}
	defer s2.Close()
	m2 := concurrency.NewMutex(s2, "/my-lock/")

	if err := m1.Lock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired lock for s1")
	if err := m2.TryLock(context.TODO()); err == concurrency.ErrLocked {
		fmt.Println("s2 sees it locked")
	}
	if err := m1.Unlock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	if err := m2.Lock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	fmt.Println("acquired lock for s2")
	if err := m2.Unlock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// acquired lock for s1
	// s2 sees it locked
	// acquired lock for s2
}

// From a lock of the compatible package to etcdlock's own: the fencing
// token of the hold, and the channel closed if the hold is lost, before
// anyone else can acquire.
func ExampleMutex_Etcdlock() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	m := concurrency.NewMutex(s, "jobs/report")
	if err := m.Lock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	hold := m.Etcdlock()
	fmt.Println("fencing token given:", hold.Token() > 0)
	select {
	case <-hold.Done():
		fmt.Println("lost")
	default:
		fmt.Println("held")
	}
	if err := m.Unlock(context.TODO()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// fencing token given: true
	// held
}

// Observe is a channel of the leader's GetResponse, as in etcd's package.
func ExampleElection_Observe() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	s, err := concurrency.NewSession(cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	e := concurrency.NewElection(s, "/my-election/")
	if err := e.Campaign(context.TODO(), "host-a:8080"); err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.TODO())
	defer cancel()
	resp := <-e.Observe(ctx)
	fmt.Println("leader:", string(resp.Kvs[0].Value))
	fmt.Println("fencing token:", e.Etcdlock().Token() == e.Rev())
	if err := e.Resign(context.TODO()); err != nil {
		log.Fatal(err)
	}
	// Output:
	// leader: host-a:8080
	// fencing token: true
}
