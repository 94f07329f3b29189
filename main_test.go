package etcdlock_test

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

// endpoints are the client URLs of the one-member etcd that TestMain starts
// for the tests and examples of this package.
var endpoints []string

// cluster is that etcd.
var cluster *etcdtest.Cluster

// parallel is how many tests marked t.Parallel run at once unless
// -test.parallel says otherwise. Those tests spend their time waiting for
// leases, TTLs, late answers and elections, not on the CPU: the default,
// GOMAXPROCS, would leave them waiting in turn. Tests that load the CPU
// (long queues, three-member clusters), that count on contenders
// overlapping, or that need the shared etcd to themselves (compaction,
// goroutine counts, package settings) are not parallel: Go runs every
// parallel test after the others have ended.
const parallel = 8

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(parallel)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	if os.Getenv(helperEnv) != "" {
		// A helper process (TestHelperProcess) uses its parent's etcd:
		// it starts none of its own, which would take ports, time and
		// a process that dies with it when it is killed.
		os.Exit(m.Run())
	}
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster, endpoints = c, c.Endpoints()
		return m.Run()
	}))
}
