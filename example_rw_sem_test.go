package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sessions returns n sessions on cli, for the examples: one per holder,
// as in n processes.
func sessions(ctx context.Context, cli *clientv3.Client, n int) []*etcdlock.Session {
	ss := make([]*etcdlock.Session, n)
	for i := range ss {
		s, err := etcdlock.NewSession(ctx, cli)
		if err != nil {
			log.Fatal(err)
		}
		ss[i] = s
	}
	return ss
}

// Readers share the lock; a writer waits until they are gone. Each holder
// has its own Session, as it would in its own process.
func ExampleRWMutex_RLock() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ss := sessions(ctx, cli, 3)
	for _, s := range ss {
		defer s.Close()
	}

	r1 := etcdlock.NewRWMutex(ss[0], "example/config")
	r2 := etcdlock.NewRWMutex(ss[1], "example/config")
	w := etcdlock.NewRWMutex(ss[2], "example/config")
	if err := r1.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := r2.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("two readers hold the lock")
	fmt.Println("writer, while they read:", errors.Is(w.TryLock(ctx), etcdlock.ErrLocked))

	if err := r1.RUnlock(ctx); err != nil {
		log.Fatal(err)
	}
	if err := r2.RUnlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("writer, once they are gone:", w.TryLock(ctx))
	if err := w.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// two readers hold the lock
	// writer, while they read: true
	// writer, once they are gone: <nil>
}

// A writer excludes readers. A read lock cannot be upgraded: RUnlock, then
// Lock, and queue behind the writers already waiting.
func ExampleRWMutex_Lock() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ss := sessions(ctx, cli, 2)
	for _, s := range ss {
		defer s.Close()
	}

	w := etcdlock.NewRWMutex(ss[0], "example/schema")
	r := etcdlock.NewRWMutex(ss[1], "example/schema")
	if err := w.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("reader, while the writer holds:", errors.Is(r.TryRLock(ctx), etcdlock.ErrLocked))
	if err := w.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	if err := r.RLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("upgrade:", errors.Is(r.Lock(ctx), etcdlock.ErrUpgrade))
	if err := r.RUnlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// reader, while the writer holds: true
	// upgrade: true
}

// Permits of a weighted semaphore: holders share its capacity.
func ExampleSemaphore_Acquire() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	ss := sessions(ctx, cli, 3)
	for _, s := range ss {
		defer s.Close()
	}

	a := etcdlock.NewSemaphore(ss[0], "example/workers", 3)
	b := etcdlock.NewSemaphore(ss[1], "example/workers", 3)
	c := etcdlock.NewSemaphore(ss[2], "example/workers", 3)
	if err := a.Acquire(ctx, 2); err != nil {
		log.Fatal(err)
	}
	fmt.Println("a holds 2 of 3")
	fmt.Println("b, 2 more:", errors.Is(b.TryAcquire(ctx, 2), etcdlock.ErrLocked))
	fmt.Println("c, 1 more:", c.TryAcquire(ctx, 1))
	fmt.Println("b, 4 of 3:", errors.Is(b.Acquire(ctx, 4), etcdlock.ErrInvalidWeight))
	for _, s := range []*etcdlock.Semaphore{a, c} {
		if err := s.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// a holds 2 of 3
	// b, 2 more: true
	// c, 1 more: <nil>
	// b, 4 of 3: true
}

// Do acquires, runs the function, and releases, also when it fails. Its
// ctx is cancelled if the permits are lost.
func ExampleSemaphore_Do() {
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

	sem := etcdlock.NewSemaphore(s, "example/uploads", 4)
	err = sem.Do(ctx, 1, func(ctx context.Context) error {
		fmt.Println("uploading with 1 of 4 permits")
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// uploading with 1 of 4 permits
	// done: <nil>
}
