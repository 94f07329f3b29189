package main

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The grace that fits a TTL: CMD is stopped only once renewals have
// failed for at least half the TTL, and is gone killMargin before the
// lease can expire.
func TestGraceFitsTTL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ttl, margin, max, byDefault time.Duration
	}{
		{time.Second, 500 * time.Millisecond, 0, 0},
		{3 * time.Second, 500 * time.Millisecond, time.Second, 500 * time.Millisecond},
		{15 * time.Second, 750 * time.Millisecond, 6750 * time.Millisecond, 4250 * time.Millisecond},
		{60 * time.Second, 3 * time.Second, 27 * time.Second, 10 * time.Second},
	} {
		require.Equal(t, tc.margin, killMargin(tc.ttl), "killMargin(%v)", tc.ttl)
		require.Equal(t, tc.max, maxGrace(tc.ttl), "maxGrace(%v)", tc.ttl)
		fset := flag.NewFlagSet("run", flag.ContinueOnError)
		var grace time.Duration
		durationVar(fset, &grace, "grace", defaultGrace, "")
		require.NoError(t, fset.Parse(nil))
		got, err := graceFor(fset, "run", grace, tc.ttl)
		require.NoError(t, err)
		require.Equal(t, tc.byDefault, got, "default grace at --ttl %v", tc.ttl)
		// What the TTL leaves before CMD is stopped is at least half of it.
		require.GreaterOrEqual(t, tc.ttl-tc.max-tc.margin, tc.ttl/2)
	}
	// The TTL a refused grace is pointed to is the shortest that fits it.
	for _, g := range []time.Duration{time.Second, 10 * time.Second, 90 * time.Second} {
		ttl := ttlFor(g)
		require.GreaterOrEqual(t, maxGrace(ttl), g)
		require.Less(t, maxGrace(ttl-time.Second), g)
	}
	// A TTL with a fraction is etcd's: rounded up.
	fset := flag.NewFlagSet("run", flag.ContinueOnError)
	var grace time.Duration
	durationVar(fset, &grace, "grace", defaultGrace, "")
	require.NoError(t, fset.Parse([]string{"--grace", "1s"}))
	got, err := graceFor(fset, "run", grace, 2500*time.Millisecond)
	require.NoError(t, err, "1s fits in 3s, what etcd grants for 2.5s")
	require.Equal(t, time.Second, got)
}
