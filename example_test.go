package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lock around a critical section. The Session's lease is what keeps the
// lock: if this process dies, the lock passes to the next waiter TTL later.
func ExampleMutex_Lock() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	// NewSession waits for etcd as Lock does: its ctx bounds the start.
	// The session lives on after that ctx ends, until Close.
	start, cancel := context.WithTimeout(ctx, 10*time.Second)
	s, err := etcdlock.NewSession(start, cli)
	cancel()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // revokes the lease: releases anything still held

	m := etcdlock.NewMutex(s, "example/report")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding the lock, token > 0:", m.Token() > 0)
	// ... the critical section ...
	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released")
	// Output:
	// holding the lock, token > 0: true
	// released
}

// TryLock for a non-blocking check: a held lock costs one read and leaves
// nothing behind.
func ExampleMutex_TryLock() {
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

	a := etcdlock.NewMutex(s1, "example/trylock")
	b := etcdlock.NewMutex(s2, "example/trylock")
	if err := a.TryLock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("a took the free lock")

	err = b.TryLock(ctx)
	fmt.Println("b:", errors.Is(err, etcdlock.ErrLocked))

	if err := a.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("b after a unlocked:", b.TryLock(ctx))
	if err := b.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// a took the free lock
	// b: true
	// b after a unlocked: <nil>
}

// Guard a write with IsOwner: etcd applies it only while this hold is
// current, so a holder that lost the lock (lease expired during a pause)
// cannot overwrite the next holder's work.
func ExampleMutex_IsOwner() {
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

	m := etcdlock.NewMutex(s, "example/config")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	resp, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("example/config-value", "v2")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("write while holding applied:", resp.Succeeded)

	if err := m.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	resp, err = cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut("example/config-value", "v3")).Commit()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("write after unlock applied:", resp.Succeeded)
	// Output:
	// write while holding applied: true
	// write after unlock applied: false
}

// fencedStore stands for a resource outside etcd (a database, a file
// server) that accepts a write only with a fencing token at least as high
// as any it has seen.
type fencedStore struct {
	mu      sync.Mutex
	highest int64
	value   string
}

func (f *fencedStore) Write(token int64, v string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if token < f.highest {
		return fmt.Errorf("stale token %d: a newer holder wrote with a higher one", token)
	}
	f.highest, f.value = token, v
	return nil
}

// Fence writes to a resource outside etcd with Token: a holder that lost
// the lock without knowing (paused past its TTL) is turned away once a
// newer holder has written.
func ExampleMutex_Token() {
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

	store := &fencedStore{}
	old := etcdlock.NewMutex(s1, "example/fenced")
	if err := old.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	staleToken := old.Token()
	// The old holder stalls; meanwhile its key goes (here: deleted, as if
	// its lease had expired) and a new holder takes over and writes.
	if _, err := cli.Delete(ctx, old.Key()); err != nil {
		log.Fatal(err)
	}
	next := etcdlock.NewMutex(s2, "example/fenced")
	if err := next.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("new holder writes:", store.Write(next.Token(), "new"))
	// The old holder wakes up and tries to write with its token.
	fmt.Println("old holder writes:", store.Write(staleToken, "old") != nil)
	fmt.Println("old holder unlocks:", errors.Is(old.Unlock(ctx), etcdlock.ErrLockLost))
	if err := next.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// new holder writes: <nil>
	// old holder writes: true
	// old holder unlocks: true
}

// Do runs a function under the lock, with a context cancelled the moment the
// lock is lost.
func ExampleMutex_Do() {
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

	m := etcdlock.NewMutex(s, "example/do")
	err = m.Do(ctx, func(ctx context.Context) error {
		// Someone deletes the key while we work: the hold is lost.
		if _, err := cli.Delete(ctx, m.Key()); err != nil {
			return err
		}
		<-ctx.Done() // long work notices through its ctx
		return context.Cause(ctx)
	})
	fmt.Println("lost:", errors.Is(err, etcdlock.ErrLockLost))
	// Output:
	// lost: true
}
