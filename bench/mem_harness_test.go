package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMemHarness runs the memory scenarios small, for both
// implementations, so that their harness is checked (with -race in CI)
// without running BenchmarkMem.
func TestMemHarness(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, impl := range Impls {
		t.Run(impl.Name, func(t *testing.T) {
			c, err := MemHeld(t.Context(), env, impl, 4, false, nil)
			require.NoError(t, err)
			require.EqualValues(t, 4, c.Units)
			c, err = MemWaiting(t.Context(), env, impl, 4, nil)
			require.NoError(t, err)
			require.EqualValues(t, 4, c.Units)
		})
	}
	c, err := MemHeld(t.Context(), env, Etcdlock, 4, true, nil)
	require.NoError(t, err)
	require.EqualValues(t, 4, c.Units)
}
