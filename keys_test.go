package etcdlock_test

import (
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// TestCheckName: CheckName answers as Lock does, without a Session: the
// names Lock refuses it refuses, and the names etcd's Mutex takes it takes.
func TestCheckName(t *testing.T) {
	t.Parallel()
	s := newSession(t, newClient(t))
	for _, name := range []string{"", "__etcdlock", "__etcdlock/x", strings.Repeat("n", etcdlock.MaxNameLen+1)} {
		require.ErrorIs(t, etcdlock.CheckName(name), etcdlock.ErrInvalidName, "%.20q", name)
		require.ErrorIs(t, etcdlock.NewMutex(s, name).TryLock(t.Context()), etcdlock.ErrInvalidName, "%.20q", name)
	}
	for _, name := range []string{"/my-lock/", "a//b", "jobs/backup", "__etcdlockx", strings.Repeat("n", etcdlock.MaxNameLen)} {
		require.NoError(t, etcdlock.CheckName(name), "%.20q", name)
	}
}
