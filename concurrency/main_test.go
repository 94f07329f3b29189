package concurrency_test

import (
	"os"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

// cluster is the one-member etcd that TestMain starts for the tests and
// examples of this package.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return m.Run()
	}))
}

// client returns a client of the test cluster, closed when t ends.
func client(t testing.TB) *clientv3.Client { return cluster.Client(t) }
