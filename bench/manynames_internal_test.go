package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestManyNamesScenarios runs the many-names scenarios, small, for every
// implementation they run for, the floor too: every cycle is one write to
// lock and one to unlock, on one session or on a session each.
func TestManyNamesScenarios(t *testing.T) {
	env, err := NewEnv(t.TempDir(), 1)
	require.NoError(t, err)
	t.Cleanup(env.Close)

	for _, sc := range manyNamesScenarios {
		require.Equal(t, withFloor, sc.Impls, sc.Name)
	}
	for _, own := range []bool{false, true} {
		for _, impl := range AllImpls {
			t.Run(fmt.Sprintf("sessions=%v/%s", own, impl.Name), func(t *testing.T) {
				r, err := manyNames("many-names-test", 5, own)(t.Context(), env, impl, 3, nil)
				require.NoError(t, err)
				require.EqualValues(t, 15, r.Ops, "n iterations of g cycles")
				require.Positive(t, r.Elapsed)
				require.Equal(t, 2.0, r.RPCsPerOp())
				require.Equal(t, 2.0, r.RevsPerOp())
			})
		}
	}

	// A lock whose Unlock leaves its key fails the run.
	_, err = manyNames("many-names-leak", 3, false)(t.Context(), env, leakyFloor, 2, nil)
	require.ErrorContains(t, err, "keys left under")
}

// leakyFloor is the floor with an Unlock that deletes nothing.
var leakyFloor = Impl{
	Name: "leaky-floor",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := Floor.NewSession(ctx, cli)
		if err != nil {
			return nil, err
		}
		return leakySession{s.(floorSession)}, nil
	},
}

type leakySession struct{ floorSession }

func (s leakySession) NewMutex(name string) Mutex {
	return leakyMutex{s.floorSession.NewMutex(name).(floorMutex)}
}

type leakyMutex struct{ floorMutex }

func (leakyMutex) Unlock(context.Context) error { return nil }
