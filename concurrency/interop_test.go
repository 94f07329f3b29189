package concurrency_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	etcd "go.etcd.io/etcd/client/v3/concurrency"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/concurrency"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
)

// Three APIs take one lock name: this package's, etcdlock's own and
// etcd's concurrency package. They share the key layout (name/<lease ID
// in hex>) and the rule that the oldest key holds, so during a migration
// each excludes the others. The tests below check it for every ordered
// pair, each API with itself (across two sessions) included, without
// timing anything: what they check is the state of etcd at the revision
// an API says it acquired at, and which call has returned once a state is
// reached.

// An interopMutex is what the tests use of a Mutex of any of the three.
type interopMutex interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	// Header is the response that showed the lock acquired.
	Header() *pb.ResponseHeader
}

// A mutexAPI is one of the three APIs' Mutex.
type mutexAPI struct {
	name string
	// locked is what its TryLock returns on a lock held by another session.
	locked error
	// newMutex returns a Mutex on name in a new session on cli, closed
	// when t ends, and the key its Lock puts.
	newMutex func(t *testing.T, cli *clientv3.Client, name string) (interopMutex, string)
}

var mutexAPIs = []mutexAPI{
	{"compat", concurrency.ErrLocked, func(t *testing.T, cli *clientv3.Client, name string) (interopMutex, string) {
		s := session(t, cli)
		return concurrency.NewMutex(s, name), leaseKey(name, s.Lease())
	}},
	{"etcdlock", etcdlock.ErrLocked, func(t *testing.T, cli *clientv3.Client, name string) (interopMutex, string) {
		s := etcdlockSession(t, cli)
		return etcdlock.NewMutex(s, name), leaseKey(name, s.Lease())
	}},
	{"etcd", etcd.ErrLocked, func(t *testing.T, cli *clientv3.Client, name string) (interopMutex, string) {
		s := etcdSession(t, cli)
		return etcd.NewMutex(s, name), leaseKey(name, s.Lease())
	}},
}

// TestInteropMutex: while X holds, Y's TryLock fails with Y's own
// "locked" error and leaves no key, and Y's Lock, once its key is queued,
// has not returned; after X's Unlock it returns, and at the revision it
// acquired at X's key is gone and Y's is the oldest of the name.
func TestInteropMutex(t *testing.T) {
	for _, x := range mutexAPIs {
		for _, y := range mutexAPIs {
			t.Run(x.name+"-holds-"+y.name+"-waits", func(t *testing.T) {
				ctx := t.Context()
				cli := client(t)
				name := "interop-mutex/" + x.name + "-" + y.name
				xm, xKey := x.newMutex(t, client(t), name)
				ym, yKey := y.newMutex(t, client(t), name)
				require.NotEqual(t, xKey, yKey, "two sessions, two leases")

				require.NoError(t, xm.Lock(ctx))
				require.ErrorIs(t, ym.TryLock(ctx), y.locked, "%s's TryLock while %s holds", y.name, x.name)
				require.Equal(t, []string{xKey}, keysOf(t, cli, name, 0), "a failed TryLock leaves no key")

				locked := make(chan error, 1)
				go func() { locked <- ym.Lock(ctx) }()
				waitQueued(t, cli, name, yKey, locked)
				require.Equal(t, []string{xKey, yKey}, keysOf(t, cli, name, 0), "X holds, Y waits behind it")

				require.NoError(t, xm.Unlock(ctx))
				require.NoError(t, <-locked)
				rev := ym.Header().Revision
				require.Equal(t, []string{yKey}, keysOf(t, cli, name, rev),
					"at the revision %s's Lock acquired at (%d), %s's key is gone and %s's is the oldest", y.name, rev, x.name, y.name)
				require.NoError(t, ym.Unlock(ctx))
			})
		}
	}
}

// A candidate is what the tests use of an Election of any of the three.
type candidate interface {
	Campaign(ctx context.Context, value string) error
	Resign(ctx context.Context) error
	Header() *pb.ResponseHeader
}

// An observed leader: its key and value, and the revision at which the
// observer says it leads.
type observed struct {
	key, value string
	rev        int64
}

// An electionAPI is one of the three APIs' Election.
type electionAPI struct {
	name string
	// newCandidate returns a candidate in the election name, in a new
	// session on cli, closed when t ends, and the key its Campaign puts.
	newCandidate func(t *testing.T, cli *clientv3.Client, name string) (candidate, string)
	// headerWon says the Header of a Campaign that waited is the response
	// that showed it won; etcd's is that of the Put that queued it.
	headerWon bool
	// observe follows the election name through cli until ctx ends, and
	// sends each leader its observer reports on the channel it returns.
	observe func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) <-chan observed
}

var electionAPIs = []electionAPI{
	{
		name: "compat",
		newCandidate: func(t *testing.T, cli *clientv3.Client, name string) (candidate, string) {
			s := session(t, cli)
			return concurrency.NewElection(s, name), leaseKey(name, s.Lease())
		},
		headerWon: true,
		observe: func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) <-chan observed {
			return fromGetResponses(ctx, concurrency.NewElection(session(t, cli), name).Observe(ctx))
		},
	},
	{
		name: "etcdlock",
		newCandidate: func(t *testing.T, cli *clientv3.Client, name string) (candidate, string) {
			s := etcdlockSession(t, cli)
			return etcdlock.NewElection(s, name), leaseKey(name, s.Lease())
		},
		headerWon: true,
		observe: func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) <-chan observed {
			ch := make(chan observed)
			go func() {
				defer close(ch)
				for l, err := range etcdlock.ObserveLeader(ctx, cli, name) {
					if err != nil {
						return // the test sees the channel close
					}
					if l.Key == "" {
						continue // no leader: the others do not report it
					}
					select {
					case ch <- observed{l.Key, string(l.Value), l.Revision}:
					case <-ctx.Done():
						return
					}
				}
			}()
			return ch
		},
	},
	{
		name: "etcd",
		newCandidate: func(t *testing.T, cli *clientv3.Client, name string) (candidate, string) {
			s := etcdSession(t, cli)
			return etcd.NewElection(s, name), leaseKey(name, s.Lease())
		},
		observe: func(ctx context.Context, t *testing.T, cli *clientv3.Client, name string) <-chan observed {
			return fromGetResponses(ctx, etcd.NewElection(etcdSession(t, cli), name).Observe(ctx))
		},
	},
}

// TestInteropElection: while X leads, Y's Campaign, once its key is
// queued, has not returned; after X's Resign it returns, at a revision
// (where its API says) where X's key is gone. An observer of each API
// reports X's value, then Y's, each at a revision where that candidate's
// key is the oldest of the election.
func TestInteropElection(t *testing.T) {
	for _, x := range electionAPIs {
		for _, y := range electionAPIs {
			t.Run(x.name+"-leads-"+y.name+"-waits", func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				cli := client(t)
				name := "interop-election/" + x.name + "-" + y.name
				xe, xKey := x.newCandidate(t, client(t), name)
				ye, yKey := y.newCandidate(t, client(t), name)
				xVal, yVal := x.name+" leads", y.name+" leads next"

				require.NoError(t, xe.Campaign(ctx, xVal))
				require.Equal(t, []string{xKey}, keysOf(t, cli, name, 0), "X leads")
				observers := make([]<-chan observed, len(electionAPIs))
				for i, o := range electionAPIs {
					observers[i] = o.observe(ctx, t, cli, name)
				}
				for i, o := range electionAPIs {
					checkObserved(t, cli, name, o.name, observers[i], xKey, xVal)
				}

				campaigned := make(chan error, 1)
				go func() { campaigned <- ye.Campaign(ctx, yVal) }()
				waitQueued(t, cli, name, yKey, campaigned)
				require.Equal(t, []string{xKey, yKey}, keysOf(t, cli, name, 0), "X leads, Y waits behind it")

				require.NoError(t, xe.Resign(ctx))
				require.NoError(t, <-campaigned)
				if y.headerWon {
					rev := ye.Header().Revision
					require.Equal(t, []string{yKey}, keysOf(t, cli, name, rev),
						"at the revision %s's Campaign won at (%d), %s's key is gone", y.name, rev, x.name)
				}
				for i, o := range electionAPIs {
					checkObserved(t, cli, name, o.name, observers[i], yKey, yVal)
				}
				require.NoError(t, ye.Resign(ctx))
			})
		}
	}
}

// checkObserved receives the next leader that the observer of the API
// called api reports: it must be the one with the given key and value,
// and its key the oldest of the election at the revision reported.
func checkObserved(t *testing.T, cli *clientv3.Client, name, api string, obs <-chan observed, key, value string) {
	t.Helper()
	var o observed
	select {
	case got, ok := <-obs:
		require.True(t, ok, "%s's observer ended", api)
		o = got
	case <-t.Context().Done():
		t.Fatalf("%s's observer reported no leader", api)
	}
	require.Equal(t, key, o.key, "%s's observer: the leader's key", api)
	require.Equal(t, value, o.value, "%s's observer: the leader's value", api)
	keys := keysOf(t, cli, name, o.rev)
	require.NotEmpty(t, keys, "%s's observer reported a leader at revision %d, where the election has no key", api, o.rev)
	require.Equal(t, key, keys[0], "%s's observer reported %s at revision %d, where the oldest key is another", api, key, o.rev)
}

// fromGetResponses turns an Observe channel of etcd's API into observed
// leaders (etcdtest.GetResponses: its element type depends on etcd's
// version).
func fromGetResponses(ctx context.Context, in any) <-chan observed {
	ch := make(chan observed)
	go func() {
		defer close(ch)
		for resp := range etcdtest.GetResponses(in) {
			if len(resp.Kvs) == 0 {
				continue
			}
			kv := resp.Kvs[0]
			select {
			case ch <- observed{string(kv.Key), string(kv.Value), resp.Header.Revision}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

// etcdlockSession returns an etcdlock Session on cli, closed when t ends.
func etcdlockSession(t *testing.T, cli *clientv3.Client) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// etcdSession returns a Session of etcd's concurrency package on cli,
// closed when t ends.
func etcdSession(t *testing.T, cli *clientv3.Client) *etcd.Session {
	t.Helper()
	s, err := etcd.NewSession(cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// leaseKey is the key a session with the given lease puts for name, in
// all three APIs.
func leaseKey(name string, lease clientv3.LeaseID) string {
	return fmt.Sprintf("%s/%x", name, int64(lease))
}

// keysOf returns the keys under name + "/" at revision rev (the current
// one when 0), oldest first.
func keysOf(t *testing.T, cli *clientv3.Client, name string, rev int64) []string {
	t.Helper()
	resp, err := cli.Get(t.Context(), name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithRev(rev))
	require.NoError(t, err)
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys
}

// waitQueued waits until key is under name + "/" in etcd, a state to
// reach however long the machine takes, and fails if the call that puts
// it, which sends its result on returned, returns before or by then: it
// is to wait behind a holder that stays.
func waitQueued(t *testing.T, cli *clientv3.Client, name, key string, returned <-chan error) {
	t.Helper()
	for {
		keys := keysOf(t, cli, name, 0)
		select {
		case err := <-returned:
			t.Fatalf("the call that queues %s returned %v while the holder holds (keys %q)", key, err, keys)
		default:
		}
		if slices.Contains(keys, key) {
			return
		}
		select {
		case err := <-returned:
			t.Fatalf("the call that queues %s returned %v while the holder holds", key, err)
		case <-t.Context().Done():
			t.Fatalf("%s never queued", key)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestLockAgainAfterLoss: a Mutex whose key someone else deleted (an
// operator's etcdctl del, a stale Unlock of another process) takes the
// lock again without an Unlock first, as etcd's does: its TryLock of the
// free lock puts a new key. This package's waits first until its
// etcdlock hold has noticed the loss, so that it cannot take the hold for
// still held.
func TestLockAgainAfterLoss(t *testing.T) {
	for _, api := range mutexAPIs {
		if api.name == "etcdlock" {
			continue // its contract: Unlock a lost hold before locking again
		}
		t.Run(api.name, func(t *testing.T) {
			ctx := t.Context()
			cli := client(t)
			name := "lost-then-locked/" + api.name
			m, key := api.newMutex(t, client(t), name)
			require.NoError(t, m.Lock(ctx))
			_, err := cli.Delete(ctx, key)
			require.NoError(t, err)
			if cm, ok := m.(*concurrency.Mutex); ok {
				select {
				case <-cm.Etcdlock().Done():
				case <-ctx.Done():
					t.Fatal("the loss was never noticed")
				}
			}
			require.NoError(t, m.TryLock(ctx), "TryLock of a free lock, after the hold was lost")
			require.Equal(t, []string{key}, keysOf(t, cli, name, 0))
			require.NoError(t, m.Unlock(ctx))
		})
	}
}

// The same for a leadership: a Campaign after the leadership was lost
// (its key deleted) campaigns anew, as etcd's puts its key again; it
// used to wait for ever without an RPC.
func TestCampaignAgainAfterLoss(t *testing.T) {
	ctx := t.Context()
	cli := client(t)
	e := concurrency.NewElection(session(t, client(t)), "lost-then-campaigned")
	require.NoError(t, e.Campaign(ctx, "first"))
	lost := e.Etcdlock().Done()
	_, err := cli.Delete(ctx, e.Key())
	require.NoError(t, err)
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("the loss was never noticed")
	}
	// No one else campaigns: a bound that fails clearly, not a measure.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, e.Campaign(cctx, "again"), "a Campaign after the loss never took the leadership")
	lr, err := e.Leader(ctx)
	require.NoError(t, err)
	require.Equal(t, "again", string(lr.Kvs[0].Value))
	require.NoError(t, e.Resign(ctx))
}
