package etcdlock_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"go.uber.org/goleak"
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
	if err := goleak.Find(etcdHTTPLeftovers...); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}

// etcdHTTPLeftovers are goroutines of the embedded members' peer HTTP
// connections, which net/http closes asynchronously after etcd stops. This
// library uses no net/http, so ignoring them hides none of its goroutines.
var etcdHTTPLeftovers = []goleak.Option{
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
}
