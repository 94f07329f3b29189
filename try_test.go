package etcdlock_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestTryRidesOutElection: a Try's read that etcd refuses with an error
// that passes (a leader election, etcd's own timeout, a dropped proposal)
// is sent again: TryLock, TryRLock and TryAcquire answer whether the lock
// is free, not that etcd was electing a leader. Each schedule fails the
// Try's first read, and then its second, on a free lock and on a held one.
func TestTryRidesOutElection(t *testing.T) {
	t.Parallel()
	// try takes the lock without waiting; hold takes it so that no try
	// is admitted (a writer for the RWMutex). Each returns the release.
	type try struct {
		name      string
		try, hold func(ctx context.Context, s *etcdlock.Session, name string) (release func() error, err error)
	}
	tries := []try{
		{"TryLock", func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			m := etcdlock.NewMutex(s, name)
			return func() error { return m.Unlock(ctx) }, m.TryLock(ctx)
		}, func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			m := etcdlock.NewMutex(s, name)
			return func() error { return m.Unlock(ctx) }, m.Lock(ctx)
		}},
		{"TryRLock", func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			rw := etcdlock.NewRWMutex(s, name)
			return func() error { return rw.RUnlock(ctx) }, rw.TryRLock(ctx)
		}, func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			rw := etcdlock.NewRWMutex(s, name)
			return func() error { return rw.Unlock(ctx) }, rw.Lock(ctx)
		}},
		{"TryAcquire", func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			sem := etcdlock.NewSemaphore(s, name, 1)
			return func() error { return sem.Release(ctx) }, sem.TryAcquire(ctx, 1)
		}, func(ctx context.Context, s *etcdlock.Session, name string) (func() error, error) {
			sem := etcdlock.NewSemaphore(s, name, 1)
			return func() error { return sem.Release(ctx) }, sem.Acquire(ctx, 1)
		}},
	}
	fails := []struct {
		name string
		err  error
	}{
		{"LeaderChanged", rpctypes.ErrGRPCLeaderChanged},
		{"NoLeader", rpctypes.ErrGRPCNoLeader},
		{"Timeout", rpctypes.ErrGRPCTimeout},
		{"ProposalDropped", status.Error(codes.Unknown, "raft proposal dropped")},
	}
	for _, tr := range tries {
		for _, f := range fails {
			t.Run(tr.name+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				name := lockName(t)
				var in etcdtest.Injector
				cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
				s := newSession(t, cli)
				// Free: the first two reads fail, the third admits. (An
				// action armed after another counts the RPCs that one
				// did not take: each takes the next.)
				failed := []<-chan struct{}{
					in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: f.err}),
					in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: f.err}),
				}
				release, err := tr.try(ctx, s, name)
				require.NoError(t, err)
				for _, c := range failed {
					<-c
				}
				require.Equal(t, []string{fmt.Sprintf("%s/%x", name, s.Lease())}, keys(t, cli, name))
				require.NoError(t, release())

				// Held by another session: the Try answers ErrLocked.
				release, err = tr.hold(ctx, newSession(t, newClient(t)), name)
				require.NoError(t, err)
				failed[0] = in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: f.err})
				_, err = tr.try(ctx, s, name)
				require.ErrorIs(t, err, etcdlock.ErrLocked)
				<-failed[0]
				require.NoError(t, release())
				require.Empty(t, keys(t, cli, name), "the Try left nothing behind")
			})
		}
	}
}
