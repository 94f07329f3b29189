// Package leakcheck finds goroutines left behind after a test binary's
// tests, for the TestMain of each package that starts embedded etcd.
package leakcheck

import "go.uber.org/goleak"

// etcdHTTPLeftovers are goroutines of the embedded members' peer HTTP
// connections, which net/http closes asynchronously after etcd stops.
// etcdlock uses no net/http, so ignoring them hides none of its goroutines.
var etcdHTTPLeftovers = []goleak.Option{
	goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
	goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
	goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
	goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
}

// Find returns an error naming the goroutines still running other than the
// caller's and those opts ignore, once they have had a moment to end
// (goleak retries).
func Find(opts ...goleak.Option) error {
	return goleak.Find(append(opts, etcdHTTPLeftovers...)...)
}
