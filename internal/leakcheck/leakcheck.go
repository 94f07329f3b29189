// Package leakcheck finds goroutines left behind after a test binary's
// tests, for the TestMain of each package that starts embedded etcd.
package leakcheck

import (
	"time"

	"go.uber.org/goleak"
)

// etcdHTTPLeftovers are goroutines of the embedded members' peer HTTP
// connections, which net/http closes asynchronously after etcd stops.
// etcdlock uses no net/http, so ignoring them hides none of its goroutines.
var etcdHTTPLeftovers = []goleak.Option{
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
}

// settle is how long Find gives goroutines to end. goleak's own retries
// last under half a second, which a stall of a loaded machine can exceed
// while a goroutine that is ending waits to run.
const settle = 10 * time.Second

// Find returns an error naming the goroutines still running other than the
// caller's and those opts ignore, once they have had time to end.
func Find(opts ...goleak.Option) error {
	opts = append(opts, etcdHTTPLeftovers...)
	deadline := time.Now().Add(settle)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}
