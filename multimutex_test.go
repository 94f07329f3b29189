package etcdlock_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// startMulti starts m.Lock(ctx) in a goroutine.
func startMulti(ctx context.Context, m *etcdlock.MultiMutex) *qwaiter { return startQ(ctx, m, m.Lock) }

// multiNames returns n lock names under the test's name.
func multiNames(t *testing.T, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/n%d", lockName(t), i)
	}
	return names
}

// keyRevs returns the create revision of each key, 0 for a missing one.
func keyRevs(t *testing.T, cli *clientv3.Client, keys []string) []int64 {
	t.Helper()
	revs := make([]int64, len(keys))
	for i, k := range keys {
		resp, err := cli.Get(t.Context(), k)
		require.NoError(t, err)
		if len(resp.Kvs) > 0 {
			revs[i] = resp.Kvs[0].CreateRevision
			continue
		}
	}
	return revs
}

// eventuallyEmpty asserts that within 10s no key is left under any of the
// names: a set lost with one key has the others deleted in the background.
func eventuallyEmpty(t *testing.T, cli *clientv3.Client, names []string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, n := range names {
			if len(keys(t, cli, n)) > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "keys left under %v", names)
}

// allEmpty asserts no key is left under any of the names.
func allEmpty(t *testing.T, cli *clientv3.Client, names []string) {
	t.Helper()
	for _, n := range names {
		require.Empty(t, keys(t, cli, n), "keys left under %s", n)
	}
}

func TestMultiMutexLockUnlock(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli)
	names := []string{lockName(t) + "/b", lockName(t) + "/a", lockName(t) + "/c"}
	m := etcdlock.NewMultiMutex(s, names)

	want := make([]string, len(names))
	for i, n := range names {
		want[i] = fmt.Sprintf("%s/%x", n, int64(s.Lease()))
	}
	require.Equal(t, want, m.Keys(), "keys in the order of the names")
	require.Zero(t, m.Token())
	require.Nil(t, m.Header())

	require.NoError(t, m.Lock(t.Context()))
	for i, k := range m.Keys() {
		resp, err := cli.Get(t.Context(), k)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1, "key of %s", names[i])
		require.Equal(t, m.Token(), resp.Kvs[0].CreateRevision, "every key shares the token")
		require.Equal(t, clientv3.LeaseID(resp.Kvs[0].Lease), s.Lease())
		// A Mutex's value (etcd's Mutex and ours read it as exclusive),
		// after a first line that names the set's next name: from any
		// key of the set, a reader of its queue finds the others.
		require.Equal(t, fmt.Sprintf("etcdlock/1 set %q", names[(i+1)%len(names)]), string(resp.Kvs[0].Value))
		require.True(t, etcdlock.ParseKeyMode(resp.Kvs[0].Value).Exclusive())
	}
	require.NotNil(t, m.Header())
	require.GreaterOrEqual(t, m.Header().Revision, m.Token())

	// IsOwner guards a write on each name, and never on a name not in
	// the set.
	for _, n := range names {
		tr, err := cli.Txn(t.Context()).If(m.IsOwner(n)).Commit()
		require.NoError(t, err)
		require.True(t, tr.Succeeded, "IsOwner(%s)", n)
	}
	tr, err := cli.Txn(t.Context()).If(m.IsOwner(lockName(t) + "/d")).Commit()
	require.NoError(t, err)
	require.False(t, tr.Succeeded, "IsOwner of a name not in the set")

	// Held: a Mutex on any one of the names is refused.
	other := newSession(t, cli)
	for _, n := range names {
		require.ErrorIs(t, etcdlock.NewMutex(other, n).TryLock(t.Context()), etcdlock.ErrLocked, n)
	}

	require.NoError(t, m.Unlock(t.Context()))
	require.Zero(t, m.Token())
	allEmpty(t, cli, names)
	for _, n := range names {
		tr, err := cli.Txn(t.Context()).If(m.IsOwner(n)).Commit()
		require.NoError(t, err)
		require.False(t, tr.Succeeded, "IsOwner(%s) after Unlock", n)
	}
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockReleased)
}

// TestMultiMutexUncontendedIsTwoRPCs: one Txn places every key and reads
// every queue; one Txn deletes them.
func TestMultiMutexUncontendedIsTwoRPCs(t *testing.T) {
	t.Parallel()
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	m := etcdlock.NewMultiMutex(newSession(t, cli), multiNames(t, 3))
	before := rpcs.Total()
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.EqualValues(t, 2, rpcs.Total()-before)
	before = rpcs.Total()
	require.NoError(t, m.TryLock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.EqualValues(t, 3, rpcs.Total()-before, "TryLock: a read and a write")
}

func TestMultiMutexBadInput(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	many := make([]string, etcdlock.MaxMultiNames+1)
	for i := range many {
		many[i] = fmt.Sprintf("%s/%d", name, i)
	}
	long := make([]string, 3)
	for i := range long {
		long[i] = name + "/" + strings.Repeat(string(rune('a'+i)), etcdlock.MaxNameLen/3)
	}
	for _, c := range []struct {
		what  string
		names []string
	}{
		{"none", nil},
		{"duplicate", []string{name + "/a", name + "/b", name + "/a"}},
		{"empty name", []string{name + "/a", ""}},
		{"the library's own", []string{name + "/a", "__etcdlock"}},
		{"too many", many},
		{"too long in all", long},
	} {
		m := etcdlock.NewMultiMutex(s, c.names)
		require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrInvalidName, c.what)
		require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrInvalidName, c.what)
		require.ErrorIs(t, m.Do(t.Context(), func(context.Context) error { return nil }), etcdlock.ErrInvalidName, c.what)
	}
	resp, err := cli.Get(t.Context(), name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "an invalid set wrote keys")

	// The most names one Txn carries are taken.
	m := etcdlock.NewMultiMutex(s, many[:etcdlock.MaxMultiNames])
	require.NoError(t, m.Lock(t.Context()))
	require.Len(t, slices.Compact(keyRevs(t, cli, m.Keys())), 1)
	require.NoError(t, m.Unlock(t.Context()))

	require.ErrorIs(t, etcdlock.NewMultiMutex(nil, []string{name}).Lock(t.Context()), etcdlock.ErrSessionExpired)
	require.ErrorIs(t, etcdlock.NewMultiMutex(s, []string{name}, etcdlock.WithMaxHold(time.Millisecond)).Lock(t.Context()), etcdlock.ErrInvalidOption)
}

// TestMultiMutexWaitsInEveryQueue: a set waits for the holder of one of
// its names while its keys wait in every queue, holding none: a Mutex on
// another of its names queues behind it, and gets that name only after
// the set.
func TestMultiMutexWaitsInEveryQueue(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 2)
	holder := etcdlock.NewMutex(newSession(t, cli), names[1])
	require.NoError(t, holder.Lock(t.Context()))

	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	w := startMulti(t.Context(), m)
	require.Equal(t, []string{holder.Key()}, w.waitIdle(t), "the set watches the key ahead of it")
	// Name 0 is free, yet not held: the set's key waits in its queue.
	later := etcdlock.NewMutex(newSession(t, cli), names[0])
	require.ErrorIs(t, later.TryLock(t.Context()), etcdlock.ErrLocked)
	lw := startWaiter(t.Context(), later)
	require.Equal(t, m.Keys()[0], lw.waitIdle(t), "a Mutex queues behind the set's waiting key")
	w.assertWaiting(t)

	held := holder.Token()
	require.NoError(t, holder.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.Greater(t, m.Token(), held, "the set's token")
	lw.assertWaiting(t)
	token := m.Token()
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, lw.result(t, 10*time.Second))
	require.Greater(t, later.Token(), token)
	require.NoError(t, later.Unlock(t.Context()))
	allEmpty(t, cli, names)
}

// TestMultiMutexInterop: etcd's concurrency.Mutex on one of the names
// queues with the set both ways.
func TestMultiMutexInterop(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 2)
	es, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer es.Close()
	theirs := concurrency.NewMutex(es, names[1])
	m := etcdlock.NewMultiMutex(newSession(t, cli), names)

	require.NoError(t, theirs.Lock(t.Context()))
	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked)
	w := startMulti(t.Context(), m)
	require.Equal(t, []string{theirs.Key()}, w.waitIdle(t))
	require.NoError(t, theirs.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))

	require.ErrorIs(t, theirs.TryLock(t.Context()), concurrency.ErrLocked)
	got := make(chan error, 1)
	go func() { got <- theirs.Lock(t.Context()) }()
	require.Eventually(t, func() bool { return len(keys(t, cli, names[1])) == 2 }, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("etcd's Mutex acquired (%v) while the set holds", err)
	default:
	}
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, <-got)
	require.NoError(t, theirs.Unlock(t.Context()))
}

// TestMultiMutexCancelLeavesNothing: a set whose ctx ends while it waits
// removes every key, also those whose names were free.
func TestMultiMutexCancelLeavesNothing(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	holder := etcdlock.NewMutex(newSession(t, cli), names[2])
	require.NoError(t, holder.Lock(t.Context()))

	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	ctx, cancel := context.WithCancel(t.Context())
	w := startMulti(ctx, m)
	w.waitIdle(t)
	cancel()
	require.ErrorIs(t, w.result(t, 10*time.Second), context.Canceled)
	allEmpty(t, cli, names[:2])
	require.Equal(t, []string{holder.Key()}, keys(t, cli, names[2]))
	require.Zero(t, m.Token())

	// The session's rights to the names were given back.
	require.NoError(t, holder.Unlock(t.Context()))
	require.NoError(t, m.TryLock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
}

// TestMultiMutexTryLock: a Try takes a free set; it refuses, writing
// nothing, a set of which any name is held or waited for.
func TestMultiMutexTryLock(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	s := newSession(t, cli)
	m := etcdlock.NewMultiMutex(s, names)

	for i, n := range names {
		other := etcdlock.NewMutex(newSession(t, cli), n)
		require.NoError(t, other.Lock(t.Context()))
		require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked, "name %d held", i)
		require.Equal(t, []int64{0, 0, 0}, keyRevs(t, cli, m.Keys()), "a refused Try wrote")
		require.NoError(t, other.Unlock(t.Context()))
	}
	require.NoError(t, m.TryLock(t.Context()))
	require.Len(t, slices.Compact(keyRevs(t, cli, m.Keys())), 1)
	// Two values of one session exclude each other.
	require.ErrorIs(t, etcdlock.NewMultiMutex(s, names[1:]).TryLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, m.Unlock(t.Context()))
	allEmpty(t, cli, names)
}

// TestMultiMutexLosesOneKey: the deletion of any one key of a held set is
// its loss: Done closes, Err and Unlock say so, and Unlock removes the
// other keys.
func TestMultiMutexLosesOneKey(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	for i := range names {
		require.NoError(t, m.Lock(t.Context()))
		done := m.Done()
		_, err := cli.Delete(t.Context(), m.Keys()[i])
		require.NoError(t, err)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("Done still open 10s after key %d was deleted", i)
		}
		require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
		require.ErrorContains(t, m.Err(), m.Keys()[i], "the error names the key that went")
		require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
		eventuallyEmpty(t, cli, names)
	}

	// Without Done, Unlock finds the loss itself.
	require.NoError(t, m.Lock(t.Context()))
	_, err := cli.Delete(t.Context(), m.Keys()[1])
	require.NoError(t, err)
	err = m.Unlock(t.Context())
	require.ErrorIs(t, err, etcdlock.ErrLockLost)
	require.ErrorContains(t, err, m.Keys()[1])
	allEmpty(t, cli, names)
}

// TestMultiMutexWaiterNoticesLoss: a waiting set learns at once that a
// key of a name it does not wait for is gone, or that its lease is.
func TestMultiMutexWaiterNoticesLoss(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	holder := etcdlock.NewMutex(newSession(t, cli), names[1])
	require.NoError(t, holder.Lock(t.Context()))

	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	w := startMulti(t.Context(), m)
	w.waitIdle(t)
	_, err := cli.Delete(t.Context(), m.Keys()[2])
	require.NoError(t, err)
	err = w.result(t, 10*time.Second)
	require.ErrorIs(t, err, etcdlock.ErrLockLost)
	require.ErrorContains(t, err, m.Keys()[2])
	allEmpty(t, cli, []string{names[0], names[2]})

	s := newSession(t, cli)
	m = etcdlock.NewMultiMutex(s, names)
	w = startMulti(t.Context(), m)
	w.waitIdle(t)
	_, err = cli.Revoke(t.Context(), s.Lease())
	require.NoError(t, err)
	require.ErrorIs(t, w.result(t, 10*time.Second), etcdlock.ErrSessionExpired)
	require.Equal(t, []string{holder.Key()}, keys(t, cli, names[1]))
	require.NoError(t, holder.Unlock(t.Context()))
}

// TestMultiMutexNoDeadlock: MultiMutexes over overlapping sets, naming
// them in every order, and single Mutexes on the same names, 1000 holds
// in all, never deadlock and never overlap. Each hold checks against etcd
// that every key it holds is its own, at one revision, and that no other
// hold of a name it holds is current (a checker that sees every key).
func TestMultiMutexNoDeadlock(t *testing.T) {
	t.Parallel()
	const (
		workers = 8
		holds   = 1000
	)
	names := multiNames(t, 4)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()

	var (
		mu      sync.Mutex
		inside  = map[string]int{} // holders inside, per name
		total   int
		maxSeen int
	)
	enter := func(held []string) error {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range held {
			if inside[n]++; inside[n] > 1 {
				return fmt.Errorf("two holders of %s at once", n)
			}
		}
		total++
		maxSeen = max(maxSeen, len(held))
		return nil
	}
	leave := func(held []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range held {
			inside[n]--
		}
	}

	clis := []*clientv3.Client{newClient(t), newClient(t)}
	errc := make(chan error, workers)
	for wi := range workers {
		s := newSession(t, clis[wi%len(clis)])
		rnd := rand.New(rand.NewPCG(uint64(wi), 1))
		go func() {
			for range holds / workers {
				// A random subset of 1 to 4 names, in a random order;
				// a single name is a Mutex half the time.
				k := 1 + rnd.IntN(len(names))
				set := slices.Clone(names)
				rnd.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
				set = set[:k]
				var (
					lock, unlock func(context.Context) error
					guard        []clientv3.Cmp
				)
				if k == 1 && rnd.IntN(2) == 0 {
					m := etcdlock.NewMutex(s, set[0])
					lock, unlock = m.Lock, m.Unlock
					if err := lock(ctx); err != nil {
						errc <- err
						return
					}
					guard = []clientv3.Cmp{m.IsOwner()}
				} else {
					m := etcdlock.NewMultiMutex(s, set)
					lock, unlock = m.Lock, m.Unlock
					if err := lock(ctx); err != nil {
						errc <- err
						return
					}
					for _, n := range set {
						guard = append(guard, m.IsOwner(n))
					}
				}
				if err := enter(set); err != nil {
					errc <- err
					return
				}
				// Against etcd: every key of the hold is its own at one
				// revision, and it is the oldest key of each name.
				resp, err := clis[0].Txn(ctx).If(guard...).Then(queueReads(set)...).Commit()
				switch {
				case err != nil:
				case !resp.Succeeded:
					err = fmt.Errorf("the hold of %v is not current in etcd", set)
				default:
					for i, r := range resp.Responses {
						kvs := r.GetResponseRange().Kvs
						if len(kvs) == 0 || !ownKey(kvs[0].Key, s) {
							err = fmt.Errorf("%s is held by %v, not by its hold", set[i], kvs)
						}
					}
				}
				leave(set)
				if err != nil {
					errc <- err
					return
				}
				if err := unlock(ctx); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errc)
	}
	require.Equal(t, holds, total)
	require.Greater(t, maxSeen, 1, "no MultiMutex held more than one name")
	allEmpty(t, clis[0], names)
}

// queueReads reads the oldest key of each name's queue.
func queueReads(names []string) []clientv3.Op {
	ops := make([]clientv3.Op, len(names))
	for i, n := range names {
		ops[i] = clientv3.OpGet(n+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	}
	return ops
}

// ownKey reports whether key is a key of s.
func ownKey(key []byte, s *etcdlock.Session) bool {
	return strings.HasSuffix(string(key), fmt.Sprintf("/%x", int64(s.Lease())))
}

// TestMultiMutexSharedRevisionAtPageBoundary (issue 17, item 7, made by a
// set): a set over a lock and ten locks nested in it creates eleven keys
// in the lock's range at one revision, and the keys-only page of a Mutex
// holds eight. The Mutex must find the set's key among them, wherever
// etcd puts it in the order of equal revisions.
func TestMultiMutexSharedRevisionAtPageBoundary(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	var names []string
	for i := range 10 {
		names = append(names, fmt.Sprintf("%s/sub%02d", name, i))
	}
	names = append(names, name)
	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	require.NoError(t, m.Lock(t.Context()))
	require.Len(t, slices.Compact(keyRevs(t, cli, m.Keys())), 1)

	mu := etcdlock.NewMutex(newSession(t, cli), name)
	require.ErrorIs(t, mu.TryLock(t.Context()), etcdlock.ErrLocked, "granted while the set holds %s", name)
	w := startWaiter(t.Context(), mu)
	require.Equal(t, m.Keys()[10], w.waitIdle(t), "the waiter does not wait for the set's key")
	token := m.Token()
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.Greater(t, mu.Token(), token)
	require.NoError(t, mu.Unlock(t.Context()))
}

// TestMultiMutexFIFO: sets and Mutexes queue on one name first come, first
// served: each set also holds a name of its own (free), and waits for
// the key just ahead in the shared queue; the queue drains in order, one
// holder at a time, tokens rising (Redisson's MultiLock retries until it
// gets every lock: whoever retries at the right moment wins).
func TestMultiMutexFIFO(t *testing.T) {
	t.Parallel()
	clis := spreadClients(t, cluster, 3)
	name := lockName(t)
	holder := etcdlock.NewMutex(newSession(t, clis[0]), name)
	require.NoError(t, holder.Lock(t.Context()))
	qs := []fifoKey{{l: holder}}
	for i := range 12 {
		s := newSession(t, clis[i%len(clis)])
		var l locker = etcdlock.NewMutex(s, name)
		if i%2 == 0 {
			m := etcdlock.NewMultiMutex(s, []string{fmt.Sprintf("%s/own%d", name, i), name})
			l = multiL{m, m.Keys()[1]}
		}
		q := fifoKey{l: l, w: startL(t.Context(), l)}
		require.Equal(t, []string{qs[len(qs)-1].l.Key()}, q.w.waitIdle(t), "waiter %d watches the key just ahead", i)
		qs = append(qs, q)
	}
	checkFIFO(t, clis[0], name, qs, func(rest []int) int { return min(len(rest), 1) }, func([]int) int { return 0 })
}

// TestMultiMutexOptions: WithMaxHold binds every key of a set to one
// lease of its own, which ends the whole hold at the limit; WithIdentity
// records the identity in every key.
func TestMultiMutexOptions(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	s := newSession(t, cli)
	m := etcdlock.NewMultiMutex(s, names, etcdlock.WithMaxHold(2*time.Second), etcdlock.WithIdentity("host-a"))
	require.NoError(t, m.Lock(t.Context()))
	var lease int64
	for _, k := range m.Keys() {
		resp, err := cli.Get(t.Context(), k)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		kv := resp.Kvs[0]
		require.Equal(t, m.Token(), kv.CreateRevision)
		require.NotEqual(t, int64(s.Lease()), kv.Lease, "%s is on the max hold lease", k)
		if lease == 0 {
			lease = kv.Lease
		}
		require.Equal(t, lease, kv.Lease, "every key on one lease")
		require.True(t, strings.HasSuffix(string(kv.Value), "\nhost-a"), "%q", kv.Value)
	}
	q, err := etcdlock.InspectLock(t.Context(), cli, names[1])
	require.NoError(t, err)
	require.Equal(t, "host-a", q.Keys[0].Identity)

	select {
	case <-m.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after Lock, with a max hold of 2s")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	require.NoError(t, s.Err(), "the session outlives the hold")
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	eventuallyEmpty(t, cli, names)
}

// heldSet returns a client of the shared etcd, and a MultiMutex over 3
// names that holds them, whose session's client has the Injector given.
func heldSet(t *testing.T) (*clientv3.Client, *etcdtest.Injector, *etcdlock.MultiMutex, []string) {
	t.Helper()
	names := multiNames(t, 3)
	in := new(etcdtest.Injector)
	hcli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	m := etcdlock.NewMultiMutex(newSession(t, hcli), names)
	require.NoError(t, m.Lock(t.Context()))
	return newClient(t), in, m, names
}

// TestMultiMutexKeyGoesDuringRelease: while Unlock's delete is in flight,
// one key of the set is deleted by someone else and the loss watch sees
// it; then the delete fails, its outcome unknown. For a Mutex the key seen
// gone ends the release; for a set the other keys may still be there, so
// the release goes on until etcd answers, and leaves no key. Before, Unlock
// returned nil and left them, blocking their names until the session
// ended.
func TestMultiMutexKeyGoesDuringRelease(t *testing.T) {
	t.Parallel()
	cli, in, m, names := heldSet(t)
	m.Done() // the loss watches
	var saw bool
	fired := in.At(etcdtest.Nth(1, unary), etcdtest.Action{
		Before: func(etcdtest.RPC) {
			if _, err := cli.Delete(t.Context(), m.Keys()[1]); err != nil {
				t.Errorf("delete: %v", err)
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for !saw && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
				saw = etcdlock.SawGoneMidRelease(m)
			}
		},
		Fail: status.Error(codes.Unavailable, "test: the delete's outcome is unknown"),
	})
	require.NoError(t, m.Unlock(t.Context()))
	<-fired
	require.True(t, saw, "the loss watch did not see the key go while the delete was in flight")
	allEmpty(t, cli, names)
}

// TestMultiMutexKeyGoesAfterRefusedUnlock: etcd refuses Unlock's delete (a
// permission denied: the set stays held, as a Mutex does), then one key
// of the set is deleted by someone else. The hold ends, not known to be
// lost (the refused delete may have been applied); the set's other keys
// are deleted too, and the next Unlock ends it. Before, they stayed until
// the session ended.
func TestMultiMutexKeyGoesAfterRefusedUnlock(t *testing.T) {
	t.Parallel()
	cli, in, m, names := heldSet(t)
	done := m.Done()
	in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: rpctypes.ErrGRPCPermissionDenied})
	require.ErrorIs(t, m.Unlock(t.Context()), rpctypes.ErrPermissionDenied)
	_, err := cli.Delete(t.Context(), m.Keys()[1])
	require.NoError(t, err)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed 10s after a key went")
	}
	eventuallyEmpty(t, cli, names)
	require.NoError(t, m.Unlock(t.Context()))
}

// TestInspectWaitingSetPages: to tell whether a set first in one queue
// holds, a reader follows the set round its other names and looks for a
// key ahead of the set's in each, at the revision of its first read. Keys
// of nested locks ahead of the set (more than a page of them) do not keep
// it out; a lock's own key behind them, a page further, does.
func TestInspectWaitingSetPages(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 3)
	b := etcdlock.NewMutex(newSession(t, cli), names[2])
	require.NoError(t, b.Lock(t.Context()))
	for i := range 12 { // nested lock keys, newer than b's own
		_, err := cli.Put(t.Context(), fmt.Sprintf("%s/sub/%d", names[2], i), "")
		require.NoError(t, err)
	}
	t.Cleanup(func() { cli.Delete(context.Background(), names[2]+"/sub/", clientv3.WithPrefix()) })
	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	q := startMulti(t.Context(), m)
	q.waitIdle(t)
	for _, name := range names[:2] {
		lq, err := etcdlock.InspectLock(t.Context(), cli, name, etcdlock.WithoutLeases())
		require.NoError(t, err)
		require.Empty(t, lq.Holders(), name)
		require.Equal(t, names[2], lq.Keys[0].WaitsFor, name)
	}
	lq, err := etcdlock.InspectLock(t.Context(), cli, names[2], etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.Equal(t, b.Key(), lq.Holders()[0].Key)
	require.Empty(t, lq.Waiters()[0].WaitsFor, "a waiter behind a holder waits for no other name")

	require.NoError(t, b.Unlock(t.Context()))
	require.NoError(t, q.result(t, 10*time.Second))
	for _, name := range names {
		lq, err := etcdlock.InspectLock(t.Context(), cli, name, etcdlock.WithoutLeases())
		require.NoError(t, err)
		require.Len(t, lq.Holders(), 1, name)
		require.Equal(t, m.Token(), lq.Holders()[0].Token, name)
	}
	require.NoError(t, m.Unlock(t.Context()))
}
