package etcdlockgocron_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Run each tick of a job on one replica: every replica's scheduler gets a
// Locker with the same minimum hold. Here two replicas, each with a
// client of its own as in a process of its own, fire the same tick: one
// runs it, the other skips it.
func ExampleNewLocker() {
	const minHold = 500 * time.Millisecond // half the interval, for a job every second
	at := time.Now().Add(time.Second)
	ran := make(chan string, 2)
	skipped := make(chan error, 2)
	var lockers []*etcdlockgocron.Locker
	for _, replica := range []string{"a", "b"} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()

		locker, err := etcdlockgocron.NewLocker(cli, minHold, etcdlockgocron.WithPrefix("example/gocron/"))
		if err != nil {
			log.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown() // before the locker's Close: Shutdown waits for the runs
		_, err = s.NewJob(
			gocron.OneTimeJob(gocron.OneTimeJobStartDateTime(at)), // or gocron.CronJob("* * * * * *", true)
			gocron.NewTask(func() { ran <- replica }),
			gocron.WithName("report"), // the lock is example/gocron/report
			gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
				skipped <- err
			})),
		)
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
		lockers = append(lockers, locker)
	}

	<-ran
	err := <-skipped
	fmt.Println("ran once; the other replica was refused the lock:", errors.Is(err, etcdlock.ErrLocked))

	// Close would leave the rest of the minimum hold to an etcd lease, in
	// whole seconds: wait it out, so that the example can run again at
	// once.
	time.Sleep(time.Until(at.Add(minHold)))
	for _, l := range lockers {
		l.Close()
	}
	// Output:
	// ran once; the other replica was refused the lock: true
}

// Run every job on one replica, the leader: every replica's scheduler
// gets an Elector of the same election. When the leader stops (Close), or
// dies, the next replica leads.
func ExampleNewElector() {
	ctx := context.Background()
	var electors []*etcdlockgocron.Elector
	for _, replica := range []string{"replica-a", "replica-b"} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
		if err != nil {
			log.Fatal(err)
		}
		defer cli.Close()

		// Its value names the replica: `etcdlock status example/gocron-leader` shows it.
		elector, err := etcdlockgocron.NewElector(cli, "example/gocron-leader", replica)
		if err != nil {
			log.Fatal(err)
		}
		defer elector.Close() // resigns: the next replica leads at once
		s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() { /* runs on the leader only */ }))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
		electors = append(electors, elector)
	}

	// leader waits for one of electors to lead, and returns its index.
	leader := func(electors ...*etcdlockgocron.Elector) int {
		for {
			for i, e := range electors {
				if e.IsLeader(ctx) == nil {
					return i
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	first := leader(electors...)
	fmt.Println("one replica leads")
	electors[first].Close()
	leader(electors[1-first])
	fmt.Println("after its Close, the other leads")
	// Output:
	// one replica leads
	// after its Close, the other leads
}
