package streams_test

import (
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/streams"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cluster is the one-member etcd of this package's tests.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return m.Run()
	}))
}

// TestKeeperRenewsOnOneStream: a client's Keeper, whoever acquires it,
// is one; it renews leases, many at once, on one LeaseKeepAlive stream
// with etcd's TTL as the answer, answers 0 for a lease that does not
// exist, and stops its stream (and goroutines: TestMain checks) when the
// last user releases it.
func TestKeeperRenewsOnOneStream(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	ctx := t.Context()
	k := streams.AcquireKeeper(cli)
	if again := streams.AcquireKeeper(cli); again != k {
		t.Fatal("a second acquire of one client's Keeper made another")
	}
	k.Release() // the second acquire's

	const leases = 8
	ids := make([]clientv3.LeaseID, leases)
	for i := range ids {
		l, err := cli.Grant(ctx, 7)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = l.ID
	}
	streamsBefore := rpcs.Streams()
	patience := streams.StuckAfter(7 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, leases)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			before := time.Now()
			sent, ttl, err := k.Renew(ctx, id, patience, time.Now().Add(time.Minute), nil)
			switch {
			case err != nil:
				errs <- err
			case ttl != 7:
				errs <- fmt.Errorf("lease %x renewed with TTL %d, want 7", id, ttl)
			case sent.Before(before) || sent.After(time.Now()):
				errs <- fmt.Errorf("lease %x: sent at %v, not within the call", id, sent)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := rpcs.Streams() - streamsBefore; n != 1 {
		t.Errorf("%d streams opened for %d renewals at once, want 1", n, leases)
	}

	if _, err := cli.Revoke(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, ttl, err := k.Renew(ctx, ids[0], patience, time.Now().Add(time.Minute), nil); err != nil || ttl > 0 {
		t.Errorf("renewal of a revoked lease: TTL %d, error %v; want TTL 0 or less, no error", ttl, err)
	}
	k.Release()
}

// TestSharedCountsUsers: Shared makes one value per client, and only the
// last Release of it reports the end.
func TestSharedCountsUsers(t *testing.T) {
	var s streams.Shared[*int]
	cli := cluster.Client(t)
	made := 0
	mk := func() *int { made++; v := made; return &v }
	a, b := s.Acquire(cli, mk), s.Acquire(cli, mk)
	if a != b || made != 1 {
		t.Fatalf("two acquires of one client made %d values", made)
	}
	if s.Release(cli) {
		t.Fatal("the first of two releases reported the last")
	}
	if !s.Release(cli) {
		t.Fatal("the last release did not report it")
	}
	if c := s.Acquire(cli, mk); *c != 2 {
		t.Fatalf("an acquire after the last release got the old value")
	}
	s.Release(cli)
}
