package etcdlock_test

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// rlocker starts m.RLock(ctx) in a goroutine.
func rlocker(ctx context.Context, m *etcdlock.RWMutex) *qwaiter {
	return startQ(ctx, m, m.RLock)
}

// wlocker starts m.Lock(ctx) in a goroutine.
func wlocker(ctx context.Context, m *etcdlock.RWMutex) *qwaiter {
	return startQ(ctx, m, m.Lock)
}

func TestRWMutexReadersShare(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	name := lockName(t)
	r1 := etcdlock.NewRWMutex(newSession(t, cli), name)
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	w := etcdlock.NewRWMutex(newSession(t, cli), name)

	require.NoError(t, r1.RLock(t.Context()))
	require.NoError(t, r2.RLock(t.Context()))
	require.Equal(t, []string{r1.Key(), r2.Key()}, holding(t, cli, name), "two readers hold at once")
	resp, err := cli.Get(t.Context(), r1.Key())
	require.NoError(t, err)
	require.Equal(t, "etcdlock/1 shared", string(resp.Kvs[0].Value))

	r0, err := cli.Get(t.Context(), "x")
	require.NoError(t, err)
	before := rpcs.Total()
	require.ErrorIs(t, w.TryLock(t.Context()), etcdlock.ErrLocked)
	require.EqualValues(t, 1, rpcs.Total()-before, "TryLock on a read-held lock: one read")
	r1b, err := cli.Get(t.Context(), "x")
	require.NoError(t, err)
	require.Equal(t, r0.Header.Revision, r1b.Header.Revision, "TryLock consumed a revision")

	ww := wlocker(t.Context(), w)
	require.Equal(t, []string{r2.Key()}, ww.waitIdle(t), "a writer watches the key just ahead: the newest reader")
	// A reader behind the waiting writer waits for it.
	r3 := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.ErrorIs(t, r3.TryRLock(t.Context()), etcdlock.ErrLocked)
	wr3 := rlocker(t.Context(), r3)
	require.Equal(t, []string{w.Key()}, wr3.waitIdle(t), "a reader watches the last writer ahead")

	require.NoError(t, r1.RUnlock(t.Context()))
	ww.assertWaiting(t)
	require.NoError(t, r2.RUnlock(t.Context()))
	require.NoError(t, ww.result(t, 10*time.Second))
	wr3.assertWaiting(t)
	require.ErrorIs(t, r1.TryRLock(t.Context()), etcdlock.ErrLocked)
	require.NoError(t, w.Unlock(t.Context()))
	require.NoError(t, wr3.result(t, 10*time.Second))
	require.NoError(t, r3.RUnlock(t.Context()))
	require.Empty(t, keys(t, cli, name))
}

func TestRWMutexUncontendedIsTwoRPCs(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	m := etcdlock.NewRWMutex(newSession(t, cli), lockName(t))
	before := rpcs.Total()
	require.NoError(t, m.RLock(t.Context()))
	require.NoError(t, m.RUnlock(t.Context()))
	require.EqualValues(t, 2, rpcs.Total()-before, "RLock+RUnlock")
	before = rpcs.Total()
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
	require.EqualValues(t, 2, rpcs.Total()-before, "Lock+Unlock")
}

// TestRWMutexFIFO: readers and writers in a random pattern, waiting on
// three clients, are admitted in queue order (checkFIFO): all readers
// between two writers at once, each writer alone, whatever order the
// holders release in. Each waiter watches exactly its rule's blocker.
func TestRWMutexFIFO(t *testing.T) {
	testRWFIFO(t, cluster, 120)
}

func testRWFIFO(t *testing.T, c *etcdtest.Cluster, n int) {
	clis := spreadClients(t, c, 3)
	name := lockName(t)
	rng := rand.New(rand.NewSource(3))

	holder := etcdlock.NewRWMutex(newSession(t, clis[0]), name)
	require.NoError(t, holder.Lock(t.Context()))
	qs := []fifoKey{{l: holder}}
	readers := []bool{false}
	lastWriter := holder.Key()
	for i := range n {
		m := etcdlock.NewRWMutex(newSession(t, clis[i%len(clis)]), name)
		reader := rng.Intn(3) != 0
		q, want := fifoKey{l: m}, qs[len(qs)-1].l.Key() // a writer: the key just ahead
		if reader {
			q.l, q.w, want = rwRead{m}, rlocker(t.Context(), m), lastWriter
		} else {
			q.w, lastWriter = wlocker(t.Context(), m), m.Key()
		}
		require.Equal(t, []string{want}, q.w.waitIdle(t), "waiter %d (reader %v)", i, reader)
		qs, readers = append(qs, q), append(readers, reader)
	}
	// One writer holds, or the readers up to the next writer.
	admits := func(rest []int) int {
		if len(rest) == 0 || !readers[rest[0]] {
			return min(len(rest), 1)
		}
		n := 0
		for n < len(rest) && readers[rest[n]] {
			n++
		}
		return n
	}
	checkFIFO(t, clis[0], name, qs, admits, func(held []int) int { return rng.Intn(len(held)) })
}

// TestRWMutexReleaseWakes: a writer's release wakes exactly the holds it
// admits; a reader's release wakes at most the writer just behind it.
func TestRWMutexReleaseWakes(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	w := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, w.Lock(t.Context()))

	pattern := []bool{true, true, true, true, false, true, true} // R1..R4, W2, R5, R6
	var ms []*etcdlock.RWMutex
	var ws []*qwaiter
	var counters []*etcdtest.RPCCounter
	for _, reader := range pattern {
		c := new(etcdtest.RPCCounter)
		m := etcdlock.NewRWMutex(newSession(t, cluster.Client(t, clientv3.Config{DialOptions: c.DialOptions()})), name)
		var q *qwaiter
		if reader {
			q = rlocker(t.Context(), m)
		} else {
			q = wlocker(t.Context(), m)
		}
		q.waitIdle(t)
		ms, ws, counters = append(ms, m), append(ws, q), append(counters, c)
	}
	// Each waiter has a client of its own: its counter tells the RPCs it
	// made, its own releases included.
	snapshot := func() []int64 {
		s := make([]int64, len(counters))
		for i, c := range counters {
			s[i] = c.Unary()
		}
		return s
	}
	// requireWoken checks that the waiters woken made one read each (see
	// RPCCounter.Reads) and the others none.
	requireWoken := func(before, _ []int64, woken ...int) {
		t.Helper()
		for i := range before {
			want := int64(0)
			if slices.Contains(woken, i) {
				want = 1
			}
			require.Equal(t, want, counters[i].Reads(before[i]), "waiter %d: calls %v", i, counters[i].UnaryMethods(before[i]))
		}
	}

	before := snapshot()
	require.NoError(t, w.Unlock(t.Context()))
	for _, q := range ws[:4] {
		require.NoError(t, q.result(t, 10*time.Second))
	}
	requireWoken(before, snapshot(), 0, 1, 2, 3)

	before = snapshot()
	require.NoError(t, ms[3].RUnlock(t.Context())) // W2's predecessor
	require.Equal(t, []string{ms[2].Key()}, ws[4].waitIdle(t))
	requireWoken(before, snapshot(), 3, 4) // 3: its own RUnlock

	for i := 2; i >= 0; i-- {
		before = snapshot()
		require.NoError(t, ms[i].RUnlock(t.Context()))
		if i > 0 {
			require.Equal(t, []string{ms[i-1].Key()}, ws[4].waitIdle(t))
		} else {
			require.NoError(t, ws[4].result(t, 10*time.Second))
		}
		requireWoken(before, snapshot(), i, 4) // i: its own RUnlock
	}

	before = snapshot()
	require.NoError(t, ms[4].Unlock(t.Context()))
	require.NoError(t, ws[5].result(t, 10*time.Second))
	require.NoError(t, ws[6].result(t, 10*time.Second))
	requireWoken(before, snapshot(), 4, 5, 6) // 4: its own Unlock
	require.NoError(t, ms[5].RUnlock(t.Context()))
	require.NoError(t, ms[6].RUnlock(t.Context()))
}

// TestRWMutexReaderKeyGoneWithWriter: a reader whose key goes in the same
// revision as the writer it waits for is not admitted without its key,
// whichever of the two deletions it sees first (a release that admits it
// is confirmed with a read of its own key).
func TestRWMutexReaderKeyGoneWithWriter(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	w := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, w.Lock(t.Context()))
	for range 5 {
		r := etcdlock.NewRWMutex(newSession(t, cli), name)
		q := rlocker(t.Context(), r)
		require.Equal(t, []string{w.Key()}, q.waitIdle(t))
		_, err := cli.Txn(t.Context()).Then(clientv3.OpDelete(r.Key()), clientv3.OpDelete(w.Key())).Commit()
		require.NoError(t, err)
		require.ErrorIs(t, q.result(t, 10*time.Second), etcdlock.ErrLockLost)
		require.Zero(t, r.Token())
		require.Empty(t, keys(t, cli, name))
		require.ErrorIs(t, w.Unlock(t.Context()), etcdlock.ErrLockLost)
		require.NoError(t, w.Lock(t.Context()))
	}
	require.NoError(t, w.Unlock(t.Context()))
}

// TestRWMutexWaiterLeaseRevoked guards against etcd issue 16221: in etcd's
// recipe, a waiting reader whose lease is revoked keeps waiting, then
// "acquires" without a key alongside the writer behind it. Here the
// waiter learns at once, and the writer behind gets the lock alone.
func TestRWMutexWaiterLeaseRevoked(t *testing.T) {
	for _, reader := range []bool{true, false} {
		t.Run(fmt.Sprintf("reader=%v", reader), func(t *testing.T) {
			cli := newClient(t)
			name := lockName(t)
			a := etcdlock.NewRWMutex(newSession(t, cli), name)
			require.NoError(t, a.Lock(t.Context()))
			sb := newSession(t, cli)
			b := etcdlock.NewRWMutex(sb, name)
			var wb *qwaiter
			if reader {
				wb = rlocker(t.Context(), b)
			} else {
				wb = wlocker(t.Context(), b)
			}
			wb.waitIdle(t)
			c := etcdlock.NewRWMutex(newSession(t, cli), name)
			wc := wlocker(t.Context(), c)
			require.Equal(t, []string{b.Key()}, wc.waitIdle(t))

			_, err := cli.Revoke(t.Context(), sb.Lease())
			require.NoError(t, err)
			require.ErrorIs(t, wb.result(t, 10*time.Second), etcdlock.ErrSessionExpired)
			require.Zero(t, b.Token())
			require.Equal(t, []string{a.Key()}, holding(t, cli, name), "a still holds alone")
			wc.assertWaiting(t)
			require.NoError(t, a.Unlock(t.Context()))
			require.NoError(t, wc.result(t, 10*time.Second))
			require.Equal(t, []string{c.Key()}, keys(t, cli, name))

			// A waiter whose key an operator deletes learns it too.
			d := etcdlock.NewRWMutex(newSession(t, cli), name)
			wd := rlocker(t.Context(), d)
			wd.waitIdle(t)
			_, err = cli.Delete(t.Context(), d.Key())
			require.NoError(t, err)
			require.ErrorIs(t, wd.result(t, 10*time.Second), etcdlock.ErrLockLost)
			require.NoError(t, c.Unlock(t.Context()))
		})
	}
}

// TestRWMutexInterop: to a reader, etcd's concurrency.Mutex, etcdlock's
// Mutex and any key it does not recognise are writers; to them, a reader
// is a holder like any other.
func TestRWMutexInterop(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	es, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer es.Close()
	theirs := concurrency.NewMutex(es, name)
	r := etcdlock.NewRWMutex(newSession(t, cli), name)

	require.NoError(t, theirs.Lock(t.Context()))
	require.ErrorIs(t, r.TryRLock(t.Context()), etcdlock.ErrLocked)
	w := rlocker(t.Context(), r)
	require.Equal(t, []string{theirs.Key()}, w.waitIdle(t))
	require.NoError(t, theirs.Unlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))

	// A reader holds: theirs cannot take it, and waits.
	require.ErrorIs(t, theirs.TryLock(t.Context()), concurrency.ErrLocked)
	got := make(chan error, 1)
	go func() { got <- theirs.Lock(t.Context()) }()
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("etcd's Mutex acquired (%v) while a reader holds", err)
	default:
	}
	require.NoError(t, r.RUnlock(t.Context()))
	require.NoError(t, <-got)
	require.NoError(t, theirs.Unlock(t.Context()))

	// The same with etcdlock's Mutex.
	m := etcdlock.NewMutex(newSession(t, cli), name)
	require.NoError(t, r.RLock(t.Context()))
	mw := startWaiter(t.Context(), m)
	require.Equal(t, r.Key(), mw.waitIdle(t))
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	w2 := rlocker(t.Context(), r2)
	require.Equal(t, []string{m.Key()}, w2.waitIdle(t), "a Mutex is a writer")
	require.NoError(t, r.RUnlock(t.Context()))
	require.NoError(t, mw.result(t, 10*time.Second))
	w2.assertWaiting(t)
	require.NoError(t, m.Unlock(t.Context()))
	require.NoError(t, w2.result(t, 10*time.Second))
	require.NoError(t, r2.RUnlock(t.Context()))

	// A key whose value is `etcdlock run`'s record, or unknown, is a writer.
	ls := newSession(t, cli)
	_, err = cli.Put(t.Context(), name+"/other", `{"pid":1}`, clientv3.WithLease(ls.Lease()))
	require.NoError(t, err)
	require.ErrorIs(t, r.TryRLock(t.Context()), etcdlock.ErrLocked)
	_, err = cli.Delete(t.Context(), name+"/other")
	require.NoError(t, err)
	require.NoError(t, r.TryRLock(t.Context()))
	require.NoError(t, r.RUnlock(t.Context()))
}

// TestRWMutexUpgradeRefused: Lock while this RWMutex holds a read lock
// returns ErrUpgrade at once; the read lock stays.
func TestRWMutexUpgradeRefused(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	cli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	m := etcdlock.NewRWMutex(newSession(t, cli), lockName(t))
	require.NoError(t, m.RLock(t.Context()))
	before := rpcs.Total()
	require.ErrorIs(t, m.Lock(t.Context()), etcdlock.ErrUpgrade)
	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrUpgrade)
	require.ErrorIs(t, m.Do(t.Context(), func(context.Context) error { panic("ran") }), etcdlock.ErrUpgrade)
	require.EqualValues(t, 0, rpcs.Total()-before, "no RPC")
	tr, err := cli.Txn(t.Context()).If(m.IsOwner()).Commit()
	require.NoError(t, err)
	require.True(t, tr.Succeeded, "the read lock is still held")
	require.NoError(t, m.RUnlock(t.Context()))
	require.NoError(t, m.Lock(t.Context()))
	require.NoError(t, m.Unlock(t.Context()))
}

// TestRWMutexWrongUnlock: RUnlock of a write lock and Unlock of a read lock
// return ErrLockReleased, and the hold stays for the right call.
func TestRWMutexWrongUnlock(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	m := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, m.Lock(t.Context()))
	require.ErrorIs(t, m.RUnlock(t.Context()), etcdlock.ErrLockReleased)
	require.Equal(t, []string{m.Key()}, keys(t, cli, name))
	require.NoError(t, m.Unlock(t.Context()))

	require.NoError(t, m.RLock(t.Context()))
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockReleased)
	require.Equal(t, []string{m.Key()}, keys(t, cli, name))
	require.NoError(t, m.RUnlock(t.Context()))
	require.ErrorIs(t, m.RUnlock(t.Context()), etcdlock.ErrLockReleased, "double RUnlock")
	require.Empty(t, keys(t, cli, name))
}

// TestRWMutexNestedNames: keys of nested locks, more than a page of them,
// never count as readers or writers of the parent, and the reverse.
func TestRWMutexNestedNames(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	for i := range 12 {
		n := etcdlock.NewMutex(newSession(t, cli), fmt.Sprintf("%s/n%d", name, i))
		require.NoError(t, n.Lock(t.Context()))
	}
	r := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, r.TryRLock(t.Context()))
	w := etcdlock.NewRWMutex(newSession(t, cli), name)
	ww := wlocker(t.Context(), w)
	require.Equal(t, []string{r.Key()}, ww.waitIdle(t))
	for i := range 12 {
		n := etcdlock.NewMutex(newSession(t, cli), fmt.Sprintf("%s/later%d", name, i))
		require.NoError(t, n.Lock(t.Context()))
	}
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	wr2 := rlocker(t.Context(), r2)
	require.Equal(t, []string{w.Key()}, wr2.waitIdle(t))

	sub := etcdlock.NewRWMutex(newSession(t, cli), name+"/sub")
	require.NoError(t, sub.TryLock(t.Context()), "a nested lock is not blocked by its parent")
	require.NoError(t, sub.Unlock(t.Context()))

	require.NoError(t, r.RUnlock(t.Context()))
	require.NoError(t, ww.result(t, 10*time.Second))
	require.NoError(t, w.Unlock(t.Context()))
	require.NoError(t, wr2.result(t, 10*time.Second))
	require.NoError(t, r2.RUnlock(t.Context()))
}

// TestRWMutexContention: readers and writers, each on its own client and
// session, loop: a writer inside is alone, and readers overlap.
func TestRWMutexContention(t *testing.T) {
	testRWContention(t, cluster, 6, 2, 10)
}

func testRWContention(t *testing.T, c *etcdtest.Cluster, readers, writers, rounds int) {
	name := lockName(t)
	// The bound on the first round's meeting: a failure if reached, never
	// a pass.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var rInside, wInside, maxReaders atomic.Int64
	// That readers share is made certain, not left to scheduling: in the
	// first round every reader waits inside until all readers are in, and
	// writers start only then. With no write key queued between them, all
	// read keys are at the head together.
	met := newMeeting(readers)
	var wg sync.WaitGroup
	errs := make(chan error, readers+writers)
	for i := range readers + writers {
		cli := c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(i % c.Size())}})
		m := etcdlock.NewRWMutex(newSession(t, cli), name)
		reader := i < readers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) {
				errs <- err
				cancel()
			}
			if !reader {
				if err := met.await(ctx); err != nil {
					fail(fmt.Errorf("the readers never all held together: %w", err))
					return
				}
			}
			for round := range rounds {
				var err error
				if reader {
					err = m.RDo(ctx, func(ctx context.Context) error {
						n := rInside.Add(1)
						defer rInside.Add(-1)
						if wInside.Load() != 0 {
							return fmt.Errorf("a reader is inside with a writer")
						}
						for {
							m := maxReaders.Load()
							if n <= m || maxReaders.CompareAndSwap(m, n) {
								break
							}
						}
						if round == 0 {
							if err := met.arrive(ctx); err != nil {
								return fmt.Errorf("waiting inside for the other readers: %w", err)
							}
						}
						time.Sleep(2 * time.Millisecond)
						return nil
					})
				} else {
					err = m.Do(ctx, func(context.Context) error {
						if n := wInside.Add(1); n != 1 || rInside.Load() != 0 {
							return fmt.Errorf("a writer is inside with others")
						}
						defer wInside.Add(-1)
						time.Sleep(time.Millisecond)
						return nil
					})
				}
				if err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.Equal(t, int64(readers), maxReaders.Load(), "all readers held at once")
}

func TestRWMutexThreeMembers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-member cluster")
	}
	c := etcdtest.Start(t, 3)
	t.Run("Contention", func(t *testing.T) { testRWContention(t, c, 4, 2, 5) })
	t.Run("FIFO", func(t *testing.T) { testRWFIFO(t, c, 100) })
}

// TestRWMutexMaxHoldKeepsMode: WithMaxHold re-binds the key to its own
// lease with a Put that keeps the mode: a read lock stays shared.
func TestRWMutexMaxHoldKeepsMode(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	r := etcdlock.NewRWMutex(newSession(t, cli), name, etcdlock.WithMaxHold(10*time.Second))
	require.NoError(t, r.RLock(t.Context()))
	resp, err := cli.Get(t.Context(), r.Key())
	require.NoError(t, err)
	require.Equal(t, "etcdlock/1 shared", string(resp.Kvs[0].Value))
	require.NotEqual(t, int64(0), resp.Kvs[0].Lease)
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, r2.TryRLock(t.Context()))
	require.NoError(t, r2.RUnlock(t.Context()))
	require.NoError(t, r.RUnlock(t.Context()))
}

// TestRWMutexLeftoverIsReplaced: a read key this session left behind is
// never turned into a write lock at its place (Invariant K): readers
// behind it may hold, and a writer would be inside with them.
func TestRWMutexLeftoverIsReplaced(t *testing.T) {
	cli := newClient(t)
	s := newSession(t, cli)
	name := lockName(t)
	m := etcdlock.NewMutex(s, name)
	rev := leftover(t, cli, s, m.Key(), "etcdlock/1 shared")
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, r2.RLock(t.Context()), "a reader behind a leftover read key holds")

	require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked)
	_, ms := modes(t, cli, name)
	require.Equal(t, etcdlock.KeyMode{Shared: true}, ms[0], "the leftover is untouched")

	w := startWaiter(t.Context(), m)
	require.Equal(t, r2.Key(), w.waitIdle(t))
	w.assertWaiting(t)
	r2Token := r2.Token()
	require.NoError(t, r2.RUnlock(t.Context()))
	require.NoError(t, w.result(t, 10*time.Second))
	require.Greater(t, m.Token(), r2Token)
	require.Greater(t, m.Token(), rev)
	require.NoError(t, m.Unlock(t.Context()))

	// TryLock, once the reader is gone, removes the leftover and takes a
	// new key.
	rev = leftover(t, cli, s, m.Key(), "etcdlock/1 shared")
	require.NoError(t, m.TryLock(t.Context()))
	require.Greater(t, m.Token(), rev)
	require.NoError(t, m.Unlock(t.Context()))
	require.Empty(t, keys(t, cli, name))
}

// TestRWMutexDowngrade: a writer becomes a reader at its place. The
// readers behind it, up to the next writer, are admitted at once; the
// writer behind them is not let in between (CURATOR-621), and the Token
// stays.
func TestRWMutexDowngrade(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	wcli := cluster.Client(t, clientv3.Config{DialOptions: rpcs.DialOptions()})
	cli := newClient(t)
	name := lockName(t)
	w := etcdlock.NewRWMutex(newSession(t, wcli), name, etcdlock.WithMaxHold(30*time.Second))
	require.ErrorIs(t, w.Downgrade(t.Context()), etcdlock.ErrLockReleased, "nothing held")
	require.NoError(t, w.Lock(t.Context()))
	token := w.Token()
	resp, err := cli.Get(t.Context(), w.Key())
	require.NoError(t, err)
	lease := resp.Kvs[0].Lease

	r1 := etcdlock.NewRWMutex(newSession(t, cli), name)
	wr1 := rlocker(t.Context(), r1)
	require.Equal(t, []string{w.Key()}, wr1.waitIdle(t))
	w2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	ww2 := wlocker(t.Context(), w2)
	require.Equal(t, []string{r1.Key()}, ww2.waitIdle(t))
	r3 := etcdlock.NewRWMutex(newSession(t, cli), name)
	wr3 := rlocker(t.Context(), r3)
	require.Equal(t, []string{w2.Key()}, wr3.waitIdle(t))

	before := rpcs.Total()
	require.NoError(t, w.Downgrade(t.Context()))
	require.EqualValues(t, 1, rpcs.Total()-before, "one RPC")
	require.NoError(t, wr1.result(t, 10*time.Second))
	ww2.assertWaiting(t)
	wr3.assertWaiting(t)
	require.Equal(t, []string{w.Key(), r1.Key()}, holding(t, cli, name))
	require.Equal(t, token, w.Token(), "the Token stays")
	resp, err = cli.Get(t.Context(), w.Key())
	require.NoError(t, err)
	require.Equal(t, token, resp.Kvs[0].CreateRevision, "the place stays")
	require.Equal(t, lease, resp.Kvs[0].Lease, "the max hold lease stays")
	require.Equal(t, "etcdlock/1 shared", string(resp.Kvs[0].Value))

	require.ErrorIs(t, w.Downgrade(t.Context()), etcdlock.ErrLockReleased, "already a read lock")
	require.ErrorIs(t, w.Lock(t.Context()), etcdlock.ErrUpgrade)
	require.ErrorIs(t, w.Unlock(t.Context()), etcdlock.ErrLockReleased)
	require.NoError(t, w.RUnlock(t.Context()))
	ww2.assertWaiting(t)
	require.NoError(t, r1.RUnlock(t.Context()))
	require.NoError(t, ww2.result(t, 10*time.Second))
	require.NoError(t, w2.Unlock(t.Context()))
	require.NoError(t, wr3.result(t, 10*time.Second))
	require.NoError(t, r3.RUnlock(t.Context()))
	require.Empty(t, keys(t, cli, name))
}
