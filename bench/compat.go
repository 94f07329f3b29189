package bench

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	compat "github.com/etcdlock/etcdlock/concurrency"
)

// Compat is this module's concurrency package, etcd's API on etcdlock's
// queue, with default session options. It should cost what etcdlock's own
// API costs (the same RPCs and revisions, level times), so it runs beside
// the two in the Mutex and election scenarios that name it (withCompat),
// and the compare command prints it against Etcdlock.
var Compat = Impl{
	Name: "etcdlock-compat",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := compat.NewSession(cli, compat.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return compatSession{s}, nil
	},
	NewSessionTTL: func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error) {
		s, err := compat.NewSession(cli, compat.WithContext(ctx), compat.WithTTL(int((ttl+time.Second-1)/time.Second)))
		if err != nil {
			return nil, err
		}
		return compatSession{s}, nil
	},
}

// withCompat is Scenario.Impls for the scenarios Compat runs in besides
// Etcdlock and Etcd: those of a Mutex and of an Election, which are all
// etcd's API has.
var withCompat = []string{Etcdlock.Name, Etcd.Name, Compat.Name}

type compatSession struct{ *compat.Session }

func (s compatSession) NewMutex(name string) Mutex {
	return compatMutex{compat.NewMutex(s.Session, name)}
}

// NewRWMutex returns nil: etcd's API, and so the package, has none.
func (compatSession) NewRWMutex(string) RWMutex { return nil }

// NewSemaphore returns nil: etcd's API, and so the package, has none.
func (compatSession) NewSemaphore(string, int64) Semaphore { return nil }

type compatMutex struct{ *compat.Mutex }

func (m compatMutex) TryLock(ctx context.Context) error {
	return lockedErr(m.Mutex.TryLock(ctx), compat.ErrLocked)
}
