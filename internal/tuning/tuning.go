// Package tuning carries the engine's settings that only the module's own
// benchmarks change, to measure one setting beside another in one process.
// Users have no way to set them, and need none.
package tuning

import "context"

type releasesKey struct{}

// WithReleasesInFlight returns ctx with n as the number of a Session's
// releases that go to etcd alone at once, before the rest go in batches
// (etcdlock's batch.go), for a Session made with it (NewSession's ctx).
func WithReleasesInFlight(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, releasesKey{}, n)
}

// ReleasesInFlight returns the number ctx carries (WithReleasesInFlight),
// or def.
func ReleasesInFlight(ctx context.Context, def int) int {
	if n, ok := ctx.Value(releasesKey{}).(int); ok {
		return n
	}
	return def
}
