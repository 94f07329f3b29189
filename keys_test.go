package etcdlock_test

import (
	"strings"
	"testing"
	"time"

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

// TestCheckOptions: CheckMutexOptions and CheckSessionOptions answer as
// Lock and NewSession do, without a Session: the values they refuse
// they refuse, with the same error, and the others they take.
func TestCheckOptions(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli)
	for _, opts := range [][]etcdlock.MutexOption{
		{etcdlock.WithMaxHold(time.Millisecond)},
		{etcdlock.WithLockDelay(0)},
		{etcdlock.WithLockDelay(etcdlock.MaxLockDelay + time.Second)},
		{etcdlock.WithMinHold(0)},
		{etcdlock.WithMinHold(etcdlock.MaxLockDelay + time.Second)},
		{etcdlock.WithIdentity(strings.Repeat("x", etcdlock.MaxIdentityLen+1))},
	} {
		err := etcdlock.CheckMutexOptions(opts...)
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
		require.Equal(t, err, etcdlock.NewMutex(s, lockName(t), opts...).TryLock(t.Context()))
	}
	for _, opts := range [][]etcdlock.MutexOption{
		nil,
		{etcdlock.WithMaxHold(time.Minute), etcdlock.WithLockDelay(time.Second), etcdlock.WithMinHold(time.Second), etcdlock.WithIdentity("job 7")},
	} {
		require.NoError(t, etcdlock.CheckMutexOptions(opts...))
	}

	for _, opt := range []etcdlock.SessionOption{
		etcdlock.WithTTL(time.Millisecond),
		etcdlock.WithContext(nil),
	} {
		err := etcdlock.CheckSessionOptions(opt)
		require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
		_, nerr := etcdlock.NewSession(t.Context(), cli, opt)
		require.Equal(t, err, nerr)
	}
	require.NoError(t, etcdlock.CheckSessionOptions(etcdlock.WithTTL(5*time.Second)))
}
