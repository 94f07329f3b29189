package bench

import (
	"context"
	"errors"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Floor is no lock: its Lock puts the key a Mutex would put (name/<lease
// ID in hex>, an empty value, the session's lease) and its Unlock deletes
// it, each one plain RPC. That is the least any lock on etcd writes per
// Lock+Unlock, so the many-names scenarios run it beside the locks, as an
// implementation, and print each lock's time as a multiple of it. It
// excludes no one: only scenarios whose names are uncontended name it.
// Its sessions are etcd's concurrency.Session, whose lease is renewed on
// the client's one keepalive stream, as every other implementation's.
var Floor = Impl{
	Name: "floor",
	NewSession: func(ctx context.Context, cli *clientv3.Client) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx))
		if err != nil {
			return nil, err
		}
		return floorSession{s}, nil
	},
	NewSessionTTL: func(ctx context.Context, cli *clientv3.Client, ttl time.Duration) (Session, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithContext(ctx), concurrency.WithTTL(int((ttl+time.Second-1)/time.Second)))
		if err != nil {
			return nil, err
		}
		return floorSession{s}, nil
	},
}

type floorSession struct{ *concurrency.Session }

func (s floorSession) NewMutex(name string) Mutex {
	return floorMutex{cli: s.Client(), key: waiterKey(name, s.Lease()), lease: s.Lease()}
}

// NewRWMutex returns nil: the floor is a Mutex's writes only.
func (floorSession) NewRWMutex(string) RWMutex { return nil }

// NewSemaphore returns nil: the floor is a Mutex's writes only.
func (floorSession) NewSemaphore(string, int64) Semaphore { return nil }

// floorMutex is a Put and a Delete of one key: see Floor.
type floorMutex struct {
	cli   *clientv3.Client
	key   string
	lease clientv3.LeaseID
}

var errFloorTryLock = errors.New("bench: the floor is no lock: it has no TryLock")

func (m floorMutex) Lock(ctx context.Context) error {
	_, err := m.cli.Put(ctx, m.key, "", clientv3.WithLease(m.lease))
	return err
}

func (m floorMutex) Unlock(ctx context.Context) error {
	_, err := m.cli.Delete(ctx, m.key)
	return err
}

func (floorMutex) TryLock(context.Context) error { return errFloorTryLock }
