package etcdlock_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A locker is one mode of one primitive, seen as a Mutex: the contract
// tests run on each.
type locker interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Done() <-chan struct{}
	Err() error
	Key() string
	Token() int64
	ReleaseRequested() <-chan struct{}
	etcdlock.Hooked
}

// rwRead is an RWMutex's read lock as a locker.
type rwRead struct{ *etcdlock.RWMutex }

func (r rwRead) Lock(ctx context.Context) error    { return r.RLock(ctx) }
func (r rwRead) TryLock(ctx context.Context) error { return r.TryRLock(ctx) }
func (r rwRead) Unlock(ctx context.Context) error  { return r.RUnlock(ctx) }

// semN is n permits of a Semaphore as a locker.
type semN struct {
	*etcdlock.Semaphore
	n int64
}

func (s semN) Lock(ctx context.Context) error    { return s.Acquire(ctx, s.n) }
func (s semN) TryLock(ctx context.Context) error { return s.TryAcquire(ctx, s.n) }
func (s semN) Unlock(ctx context.Context) error  { return s.Release(ctx) }

// multiL is a MultiMutex over a lock and a lock nested in it as a
// locker: Key is its key of the lock, and both its keys fall in the lock's
// prefix (keysOf).
type multiL struct {
	*etcdlock.MultiMutex
	key string
}

func (m multiL) Key() string { return m.key }

// keysOf returns every key of l's holds: its Key, or a MultiMutex's Keys.
func keysOf(l locker) []string {
	if m, ok := l.(multiL); ok {
		return m.Keys()
	}
	return []string{l.Key()}
}

type newLocker func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker

var (
	mutexL newLocker = func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker {
		return etcdlock.NewMutex(s, name, opts...)
	}
	writeL newLocker = func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker {
		return etcdlock.NewRWMutex(s, name, opts...)
	}
	readL newLocker = func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker {
		return rwRead{etcdlock.NewRWMutex(s, name, opts...)}
	}
	multiSetL newLocker = func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker {
		m := etcdlock.NewMultiMutex(s, []string{name + "/m", name}, opts...)
		return multiL{m, m.Keys()[1]}
	}
	semL = func(n, capacity int64) newLocker {
		return func(s *etcdlock.Session, name string, opts ...etcdlock.MutexOption) locker {
			return semN{etcdlock.NewSemaphore(s, name, capacity, opts...), n}
		}
	}
)

// A flavor is a pair of lockers where the holder's hold keeps the waiter
// out.
type flavor struct {
	name           string
	holder, waiter newLocker
}

var flavors = []flavor{
	{"Mutex", mutexL, mutexL},
	{"WriteThenRead", writeL, readL},
	{"ReadThenWrite", readL, writeL},
	{"Sem2of2Then1of2", semL(2, 2), semL(1, 2)},
	{"Sem1of1ThenMutex", semL(1, 1), mutexL},
	{"MultiMutex", multiSetL, multiSetL},
	{"MutexThenMultiMutex", mutexL, multiSetL},
	{"MultiMutexThenRead", multiSetL, readL},
}

// forEach runs f for every flavor.
func forEach(t *testing.T, f func(t *testing.T, fl flavor)) {
	for _, fl := range flavors {
		t.Run(fl.name, func(t *testing.T) { f(t, fl) })
	}
}

func startL(ctx context.Context, l locker) *qwaiter { return startQ(ctx, l, l.Lock) }

// TestContractCtxEndLeavesNoKey: a waiting call whose ctx ends returns
// ctx's error and leaves only the holder's key; an ended ctx costs no RPC.
func TestContractCtxEndLeavesNoKey(t *testing.T) {
	forEach(t, func(t *testing.T, fl flavor) {
		var rpcs etcdtest.RPCCounter
		cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
		name := lockName(t)
		h := fl.holder(newSession(t, cli), name)
		require.NoError(t, h.Lock(t.Context()))
		w := fl.waiter(newSession(t, cli), name)

		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, w.Lock(ctx), context.DeadlineExceeded)
		require.ElementsMatch(t, keysOf(h), keys(t, cli, name))

		ctx, cancel = context.WithCancel(t.Context())
		q := startL(ctx, w)
		q.waitIdle(t)
		cancel()
		require.ErrorIs(t, q.result(t, 10*time.Second), context.Canceled)
		require.ElementsMatch(t, keysOf(h), keys(t, cli, name))
		require.Zero(t, w.Token())

		before := rpcs.Total()
		require.ErrorIs(t, w.Lock(ctx), context.Canceled)
		require.ErrorIs(t, w.TryLock(ctx), context.Canceled)
		require.EqualValues(t, 0, rpcs.Total()-before, "an ended ctx costs no RPC")
		require.NoError(t, h.Unlock(t.Context()))
	})
}

// TestContractGrantedAsCtxEnds races a waiter's cancellation against the
// holder's release: an error leaves no key, success leaves a hold.
func TestContractGrantedAsCtxEnds(t *testing.T) {
	forEach(t, func(t *testing.T, fl flavor) {
		cli := newClient(t)
		name := lockName(t)
		h := fl.holder(newSession(t, cli), name)
		w := fl.waiter(newSession(t, cli), name)
		for range 10 {
			require.NoError(t, h.Lock(t.Context()))
			ctx, cancel := context.WithCancel(t.Context())
			q := startL(ctx, w)
			q.waitIdle(t)
			go cancel()
			require.NoError(t, h.Unlock(t.Context()))
			if err := q.result(t, 10*time.Second); err != nil {
				require.ErrorIs(t, err, context.Canceled)
				require.Empty(t, keys(t, cli, name), "a failed call left its key")
				continue
			}
			require.ElementsMatch(t, keysOf(w), keys(t, cli, name))
			require.NoError(t, w.Unlock(t.Context()))
		}
	})
}

// TestContractDoneOnLoss: Done closes within a second of any loss, and Err
// and the release report it.
func TestContractDoneOnLoss(t *testing.T) {
	ends := []struct {
		name string
		end  func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, l locker)
	}{
		{"LeaseRevoked", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, l locker) {
			_, err := cli.Revoke(t.Context(), s.Lease())
			require.NoError(t, err)
		}},
		{"KeyDeleted", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, l locker) {
			_, err := cli.Delete(t.Context(), l.Key())
			require.NoError(t, err)
		}},
		{"SessionClosed", func(t *testing.T, cli *clientv3.Client, s *etcdlock.Session, l locker) {
			require.NoError(t, s.Close())
		}},
	}
	forEach(t, func(t *testing.T, fl flavor) {
		for _, e := range ends {
			t.Run(e.name, func(t *testing.T) {
				cli := newClient(t)
				s := newSession(t, cli)
				l := fl.waiter(s, lockName(t))
				require.NoError(t, l.Lock(t.Context()))
				done := l.Done()
				require.NoError(t, l.Err())
				e.end(t, cli, s, l)
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Fatal("Done not closed within 10s of the loss")
				}
				require.ErrorIs(t, l.Err(), etcdlock.ErrLockLost)
				require.ErrorIs(t, l.Unlock(t.Context()), etcdlock.ErrLockLost)
				require.Zero(t, l.Token())
			})
		}
	})
}

// TestContractReleaseRequest: a request to release reaches the holder,
// not the waiter, and not the waiter's hold once it takes over.
func TestContractReleaseRequest(t *testing.T) {
	forEach(t, func(t *testing.T, fl flavor) {
		cli := newClient(t)
		name := lockName(t)
		h := fl.holder(newSession(t, cli), name)
		require.NoError(t, h.Lock(t.Context()))
		w := fl.waiter(newSession(t, cli), name)
		q := startL(t.Context(), w)
		q.waitIdle(t)
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
		requested(t, h.ReleaseRequested(), "holder")
		require.NoError(t, h.Unlock(t.Context()))
		require.NoError(t, q.result(t, 10*time.Second))
		notRequested(t, w.ReleaseRequested(), "the waiter, holding now")
		require.NoError(t, w.Unlock(t.Context()))
	})
}

// TestContractCompaction: contention while etcd is compacted every few
// milliseconds; no waiter fails and the holder's hold excludes the
// waiters' every time.
func TestContractCompaction(t *testing.T) {
	forEach(t, func(t *testing.T, fl flavor) {
		cli := newClient(t)
		stop := startCompactor(t, cli)
		name := lockName(t)
		var inside atomic.Int64
		errs := make(chan error, 4)
		for i := range 4 {
			mk := fl.waiter
			if i == 0 {
				mk = fl.holder
			}
			l := mk(newSession(t, newClient(t)), name)
			exclusive := i == 0 // the holder's kind excludes the waiters'
			go func() {
				for range 10 {
					if err := l.Lock(t.Context()); err != nil {
						errs <- err
						return
					}
					n := int64(1)
					if exclusive {
						n = 1000
					}
					if now := inside.Add(n); exclusive && now != 1000 || !exclusive && now >= 1000 {
						errs <- fmt.Errorf("the holder's kind is inside with the waiters' kind")
						return
					}
					inside.Add(-n)
					if err := l.Unlock(t.Context()); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 4 {
			require.NoError(t, <-errs)
		}
		require.Positive(t, stop())
	})
}

// TestContractAuth: a role with read-write permission on the lock's prefix
// only is enough for every mode (the nested Txn, the value compare and the
// prefix watch stay within it); without it, every mode fails with
// ErrPermissionDenied and leaves no key.
func TestContractAuth(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	name := "authlock"
	c := authCluster(t, name)
	alice := c.Client(t, clientv3.Config{Username: "alice", Password: "alice-pw"})
	bob := c.Client(t, clientv3.Config{Username: "bob", Password: "bob-pw"})
	rootAuthed := c.Client(t, clientv3.Config{Username: "root", Password: "root-pw"})

	for _, fl := range flavors {
		h := fl.holder(newSession(t, alice), name)
		w := fl.waiter(newSession(t, alice), name)
		require.NoError(t, h.Lock(ctx), fl.name)
		require.ErrorIs(t, w.TryLock(ctx), etcdlock.ErrLocked, fl.name)
		q := startL(ctx, w)
		q.waitIdle(t)
		require.NoError(t, h.Unlock(ctx), fl.name)
		require.NoError(t, q.result(t, 10*time.Second), fl.name)
		require.NoError(t, w.Unlock(ctx), fl.name)
		require.NoError(t, w.TryLock(ctx), fl.name)
		require.NoError(t, w.Unlock(ctx), fl.name)

		// A leftover of this session in another mode is replaced: the
		// nested Txn's delete, within the prefix too.
		s := newSession(t, alice)
		_, err := alice.Put(ctx, fl.waiter(s, name).Key(), "etcdlock/1 permits 1 of 9", clientv3.WithLease(s.Lease()))
		require.NoError(t, err)
		l := fl.holder(s, name)
		require.NoError(t, l.Lock(ctx), fl.name)
		require.NoError(t, l.Unlock(ctx), fl.name)

		b := fl.holder(newSession(t, bob), name)
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		require.ErrorIs(t, b.Lock(lctx), rpctypes.ErrPermissionDenied, fl.name)
		require.ErrorIs(t, b.TryLock(lctx), rpctypes.ErrPermissionDenied, fl.name)
		cancel()
		require.Empty(t, keys(t, rootAuthed, name), fl.name)
	}
}

// TestContractHolderDiesHandsOver: a holder that stops renewing hands over
// when its lease runs out, in every mode.
func TestContractHolderDiesHandsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for leases to expire")
	}
	t.Parallel()
	forEach(t, func(t *testing.T, fl flavor) {
		t.Parallel()
		cli := newClient(t)
		name := lockName(t)
		hs := newSession(t, cli, etcdlock.WithTTL(2*time.Second))
		h := fl.holder(hs, name)
		require.NoError(t, h.Lock(t.Context()))
		w := fl.waiter(newSession(t, cli), name)
		q := startL(t.Context(), w)
		q.waitIdle(t)
		hs.Orphan()
		require.NoError(t, q.result(t, hs.TTL()+2*time.Second))
		require.ErrorIs(t, h.Unlock(t.Context()), etcdlock.ErrLockLost)
		require.NoError(t, w.Unlock(t.Context()))
	})
}

// A fifoKey is one key of a FIFO test's queue.
type fifoKey struct {
	l locker
	w *qwaiter // its waiting call; nil for the first holder
}

// checkFIFO drains a queue and checks it is first come, first served. qs
// is the queue in key creation order: qs[0] holds, every other one waits
// in qs[i].w. Releasing one holder at a time (the one pick chooses, given
// the indices of the holders), it waits after each release for the holds
// admitted then, which must be the first admits(rest) of the keys still
// in the queue (the test's own statement of the grant rule) and exactly
// those etcdlock.Holders finds in etcd; then it checks every pair of a
// holder and a waiter: the holder is ahead in the queue, and the waiter's
// call has not returned. At the end every pair of keys was admitted in
// queue order (the later one at the same release or after), and tokens,
// each its key's create revision, strictly increase along the queue.
func checkFIFO(t *testing.T, cli *clientv3.Client, name string, qs []fifoKey, admits func(rest []int) int, pick func(held []int) int) {
	t.Helper()
	pos := make(map[string]int, len(qs))
	for i, q := range qs {
		pos[q.l.Key()] = i
	}
	step := make([]int, len(qs)) // the release after which each was admitted; -1 while it waits
	tokens := make([]int64, len(qs))
	admitted := func(j, s int) {
		t.Helper()
		step[j], tokens[j] = s, qs[j].l.Token()
		resp, err := cli.Get(t.Context(), qs[j].l.Key())
		require.NoError(t, err)
		require.Equal(t, resp.Kvs[0].CreateRevision, tokens[j], "key %d's token", j)
	}
	for i := range step {
		step[i] = -1
	}
	admitted(0, 0)
	held, rest := []int{0}, make([]int, len(qs)) // rest: indices not released, queue order
	for i := range rest {
		rest[i] = i
	}
	for s := 1; len(held) > 0; s++ {
		k := pick(held)
		i := held[k]
		require.NoError(t, qs[i].l.Unlock(t.Context()), "release %d", i)
		held = slices.Delete(held, k, k+1)
		rest = slices.DeleteFunc(rest, func(j int) bool { return j == i })

		want := rest[:admits(rest)]
		got := holding(t, cli, name)
		require.Len(t, got, len(want), "holders after release %d", s)
		for n, j := range want {
			require.Equal(t, qs[j].l.Key(), got[n], "holder %d after release %d", n, s)
			if step[j] < 0 {
				require.NoError(t, qs[j].w.result(t, 10*time.Second), "key %d", j)
				admitted(j, s)
				held = append(held, j)
			}
		}
		require.Len(t, held, len(want))
		for _, j := range rest[len(want):] {
			qs[j].w.assertWaiting(t)
			for _, h := range held {
				require.Less(t, h, j, "holder %d is behind waiter %d", h, j)
			}
		}
	}
	require.Empty(t, rest)
	for i := range qs {
		for j := i + 1; j < len(qs); j++ {
			require.LessOrEqual(t, step[i], step[j], "key %d admitted before key %d ahead of it", j, i)
			require.Less(t, tokens[i], tokens[j], "tokens of keys %d and %d", i, j)
		}
	}
	require.Empty(t, keys(t, cli, name))
}

// spreadClients returns n clients of c, each on one member in turn: a
// queue of a multi-member cluster then has waiters on every member.
func spreadClients(t *testing.T, c *etcdtest.Cluster, n int) []*clientv3.Client {
	t.Helper()
	clis := make([]*clientv3.Client, n)
	for i := range clis {
		clis[i] = c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(i % c.Size())}})
	}
	return clis
}
