// Command etcdbin prints the etcd server binary the tests would run, and
// builds it first if needed, so that CI can build the servers it tests
// against before the tests start (the environment variables are
// etcdtest's: ETCDLOCK_TEST_ETCD, ETCDLOCK_TEST_ETCD_VERSION).
package main

import (
	"fmt"
	"os"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

func main() {
	bin, err := etcdtest.Binary()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(bin)
}
