package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMultiScenarios runs the MultiMutex scenarios, small, for the
// implementations each runs for, so that their harness is checked without
// running the benchmarks.
func TestMultiScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, sc := range multiScenarios {
		for _, impl := range Impls {
			if !sc.RunsFor(impl.Name) {
				continue
			}
			t.Run(sc.Name+"/"+impl.Name, func(t *testing.T) {
				r, err := sc.Run(t.Context(), env, impl, 3, nil)
				require.NoError(t, err)
				require.Positive(t, r.Ops)
				require.Positive(t, r.Elapsed)
			})
		}
	}
}

// TestLeadYieldScenario runs lead-yield-3, small: the leadership goes
// round, once per request.
func TestLeadYieldScenario(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)
	sc, ok := Lookup("lead-yield-3")
	require.True(t, ok)
	r, err := sc.Run(t.Context(), env, Etcdlock, 4, nil)
	require.NoError(t, err)
	require.EqualValues(t, 4, r.Ops)
	require.Positive(t, r.Elapsed)
}
