package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A job that every replica fires on the same tick runs once: the first
// replica to fire takes the lock and runs the job, and the lock stays
// taken for the minimum hold, so that a replica whose clock is behind,
// firing a little later, finds it taken and skips the tick.
func ExampleWithMinHold() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	// Above the replicas' clock skew, below the job's interval less it.
	const minHold = 2 * time.Second
	// The lock stays taken after the example: a name of its own for each
	// run, so that it may run again at once.
	name := fmt.Sprintf("example/report/%d", time.Now().UnixNano())

	tick := func(s *etcdlock.Session, replica string) {
		m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(minHold))
		err := m.TryLock(ctx)
		if errors.Is(err, etcdlock.ErrLocked) {
			fmt.Println(replica, "skips the tick")
			return
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(replica, "runs the job")
		if err := m.Unlock(ctx); err != nil { // returns at once; the lock stays taken
			log.Fatal(err)
		}
	}
	var sessions []*etcdlock.Session
	for range 2 {
		s, err := etcdlock.NewSession(ctx, cli)
		if err != nil {
			log.Fatal(err)
		}
		defer s.Close()
		sessions = append(sessions, s)
	}
	tick(sessions[0], "replica A")
	time.Sleep(100 * time.Millisecond) // B's clock is 100ms behind A's
	tick(sessions[1], "replica B")
	// Output:
	// replica A runs the job
	// replica B skips the tick
}
