package bench

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestElectionScenarios runs the election scenarios, small, for every
// implementation (the concurrency package's too), so that their harness
// is checked without running the benchmarks.
func TestElectionScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, impl := range AllImpls {
		if !slices.Contains(withCompat, impl.Name) {
			continue // the floor is no lock
		}
		t.Run(impl.Name, func(t *testing.T) {
			for _, name := range []string{"elect-uncontended", "elect-handoff-4", "elect-observe-10-p99"} {
				sc, ok := Lookup(name)
				require.True(t, ok, name)
				r, err := sc.Run(t.Context(), env, impl, 3, nil)
				require.NoError(t, err, name)
				require.Positive(t, r.Ops, name)
				require.Positive(t, r.Elapsed, name)
			}
		})
	}
}
