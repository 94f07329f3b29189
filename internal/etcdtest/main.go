package etcdtest

import (
	"fmt"
	"os"

	"github.com/etcdlock/etcdlock/internal/leakcheck"
)

// RunMain is the TestMain of a package whose tests share one etcd: it
// starts a one-member cluster in a temporary directory, runs tests with it
// (m.Run, and whatever the package starts around it), stops it, and then,
// if the tests passed, fails unless every goroutine they started has
// ended (leakcheck: no Session, Mutex or client outlives its tests). It
// returns the exit code: os.Exit(etcdtest.RunMain(...)).
func RunMain(tests func(c *Cluster) int) int {
	dir, err := MkdirTemp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	c, err := StartDir(dir, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := tests(c)
	c.Close()
	if code != 0 {
		return code
	}
	if err := leakcheck.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}
