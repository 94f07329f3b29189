package etcdlock_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
)

// endpoints are the client URLs of the one-member etcd that TestMain starts
// for the tests and examples of this package.
var endpoints []string

// cluster is that etcd.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := etcdtest.MkdirTemp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	cluster, err = etcdtest.StartDir(dir, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	endpoints = cluster.Endpoints()
	code := m.Run()
	cluster.Close()
	if code != 0 {
		return code
	}
	// Every Session and Mutex goroutine must have ended once the tests
	// closed their sessions and clients, and etcd has stopped.
	if err := leakcheck.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}
