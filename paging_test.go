package etcdlock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The tests of this file make a lock's queue span more than one page of
// a read, with keys of nested locks (name/sub/x, which share the prefix's
// range but are not in the queue), and inject another client's operation
// between the pages. Every page of one decision must be read at one
// revision, and the decision (a Try's guard, a hold's header) must be that
// revision's.

// unary matches the unary calls of a client: not its keepalive or watch
// streams' messages.
func unary(r etcdtest.RPC) bool { return !r.Stream }

// putNested puts n keys of a lock nested under name (name/sub/kNN), without
// a lease, and removes them when the test ends.
func putNested(t *testing.T, cli *clientv3.Client, name string, n int) {
	t.Helper()
	for i := range n {
		_, err := cli.Put(t.Context(), fmt.Sprintf("%s/sub/k%02d", name, i), "")
		require.NoError(t, err)
	}
	t.Cleanup(func() { cli.Delete(context.Background(), name+"/", clientv3.WithPrefix()) })
}

// A pagedCase is one primitive's Try and Lock, the size of the first page
// of its queue reads, and how to check that two holds exclude each other.
type pagedCase struct {
	name  string
	page  int // keys in the first page of its mode's reads
	mk    func(s *etcdlock.Session, name string) etcdlock.Hooked
	try   func(ctx context.Context, l etcdlock.Hooked) error
	lock  func(ctx context.Context, l etcdlock.Hooked) error
	owner func(l etcdlock.Hooked) clientv3.Cmp
	done  func(l etcdlock.Hooked) <-chan struct{}
	err   func(l etcdlock.Hooked) error
}

var pagedCases = []pagedCase{
	{
		name: "Mutex", page: 8,
		mk:    func(s *etcdlock.Session, name string) etcdlock.Hooked { return etcdlock.NewMutex(s, name) },
		try:   func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.Mutex).TryLock(ctx) },
		lock:  func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.Mutex).Lock(ctx) },
		owner: func(l etcdlock.Hooked) clientv3.Cmp { return l.(*etcdlock.Mutex).IsOwner() },
		done:  func(l etcdlock.Hooked) <-chan struct{} { return l.(*etcdlock.Mutex).Done() },
		err:   func(l etcdlock.Hooked) error { return l.(*etcdlock.Mutex).Err() },
	},
	{
		// A reader against a writer: the writer is the one that locks
		// between the pages.
		name: "RWMutex", page: 64,
		mk:    func(s *etcdlock.Session, name string) etcdlock.Hooked { return etcdlock.NewRWMutex(s, name) },
		try:   func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.RWMutex).TryRLock(ctx) },
		lock:  func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.RWMutex).RLock(ctx) },
		owner: func(l etcdlock.Hooked) clientv3.Cmp { return l.(*etcdlock.RWMutex).IsOwner() },
		done:  func(l etcdlock.Hooked) <-chan struct{} { return l.(*etcdlock.RWMutex).Done() },
		err:   func(l etcdlock.Hooked) error { return l.(*etcdlock.RWMutex).Err() },
	},
	{
		// One permit of one: any two holds exceed the capacity.
		name: "Semaphore", page: 64,
		mk:    func(s *etcdlock.Session, name string) etcdlock.Hooked { return etcdlock.NewSemaphore(s, name, 1) },
		try:   func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.Semaphore).TryAcquire(ctx, 1) },
		lock:  func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.Semaphore).Acquire(ctx, 1) },
		owner: func(l etcdlock.Hooked) clientv3.Cmp { return l.(*etcdlock.Semaphore).IsOwner() },
		done:  func(l etcdlock.Hooked) <-chan struct{} { return l.(*etcdlock.Semaphore).Done() },
		err:   func(l etcdlock.Hooked) error { return l.(*etcdlock.Semaphore).Err() },
	},
	{
		// A set over the lock and a lock nested in it: its two keys
		// share a create revision in the lock's range.
		name: "MultiMutex", page: 8,
		mk: func(s *etcdlock.Session, name string) etcdlock.Hooked {
			return etcdlock.NewMultiMutex(s, []string{name, name + "/m"})
		},
		try:   func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.MultiMutex).TryLock(ctx) },
		lock:  func(ctx context.Context, l etcdlock.Hooked) error { return l.(*etcdlock.MultiMutex).Lock(ctx) },
		owner: ownerOf,
		done:  func(l etcdlock.Hooked) <-chan struct{} { return l.(*etcdlock.MultiMutex).Done() },
		err:   func(l etcdlock.Hooked) error { return l.(*etcdlock.MultiMutex).Err() },
	},
}

// TestTryPagesAtOneRevision: a Try whose first page holds only keys of a
// nested lock reads a second page; another session takes the lock between
// the two. The Try must see it: before, the second page was read at a
// newer revision but bounded below the first page's keys, so the new key
// was in neither page, and the Try's guard compared against the second
// page's revision, which the new key did not exceed. TryLock returned nil
// while another Mutex held (both IsOwner held in one Txn); a TryRLock
// reader held with a writer; TryAcquire made 2 permits of 1.
func TestTryPagesAtOneRevision(t *testing.T) {
	t.Parallel()
	for _, c := range pagedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t)
			cli := newClient(t)
			putNested(t, cli, name, c.page+1)
			other := c.mk(newSession(t, cli), name)
			if c.name == "RWMutex" {
				other = etcdlock.NewMutex(newSession(t, cli), name) // a writer
			}

			var in etcdtest.Injector
			tcli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			l := c.mk(newSession(t, tcli), name)
			// The Try's second read is its second page.
			fired := in.At(etcdtest.Nth(2, unary), etcdtest.Action{Before: func(etcdtest.RPC) {
				var err error
				if m, ok := other.(*etcdlock.Mutex); ok {
					err = m.Lock(t.Context())
				} else {
					err = c.lock(t.Context(), other)
				}
				if err != nil {
					t.Errorf("the other session's lock: %v", err)
				}
			}})
			err := c.try(t.Context(), l)
			select {
			case <-fired:
			default:
				t.Fatalf("the Try made fewer than 2 reads (it returned %v): the queue did not span two pages", err)
			}
			require.ErrorIs(t, err, etcdlock.ErrLocked, "the Try was granted while another session held")

			// Against etcd: the two holds never both hold.
			resp, err := cli.Txn(t.Context()).If(c.owner(l), ownerOf(other)).Commit()
			require.NoError(t, err)
			require.False(t, resp.Succeeded, "both holds are current in etcd")
		})
	}
}

// TestTryRidesOutElectionInLaterPage: a Try whose queue spans two pages
// rides out an election met by its second page, as it does one met by its
// first (TestTryRidesOutElection). etcd's client already sends a read
// again after an error with code Unavailable ("no leader", "leader
// changed"), up to 100 times; raft's "proposal dropped", which etcd sends
// with code Unknown, is sent again by the Try alone. Before, the second
// page's error was returned as it was: a Try of a free lock failed.
func TestTryRidesOutElectionInLaterPage(t *testing.T) {
	t.Parallel()
	for _, c := range pagedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t)
			cli := newClient(t)
			putNested(t, cli, name, c.page+1)

			var in etcdtest.Injector
			tcli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			l := c.mk(newSession(t, tcli), name)
			// The Try's second read is its second page. etcd's client
			// sends it again after "no leader"; "proposal dropped" then
			// fails it, and the Try reads the first page again (its
			// fourth read) and the second, which fails again. (An action
			// armed after another counts the RPCs that one did not take.)
			dropped := status.Error(codes.Unknown, "raft proposal dropped")
			failed := []<-chan struct{}{
				in.At(etcdtest.Nth(2, unary), etcdtest.Action{Fail: rpctypes.ErrGRPCNoLeader}),
				in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: dropped}),
				in.At(etcdtest.Nth(2, unary), etcdtest.Action{Fail: dropped}),
			}
			require.NoError(t, c.try(t.Context(), l))
			for i, f := range failed {
				select {
				case <-f:
				default:
					t.Fatalf("injected failure %d never met: the queue did not span two pages", i+1)
				}
			}
			resp, err := cli.Txn(t.Context()).If(c.owner(l)).Commit()
			require.NoError(t, err)
			require.True(t, resp.Succeeded, "the Try holds in etcd")
		})
	}
}

// ownerOf is IsOwner of any primitive; of a MultiMutex, of its first
// name.
func ownerOf(l etcdlock.Hooked) clientv3.Cmp {
	if m, ok := l.(*etcdlock.MultiMutex); ok {
		k := m.Keys()[0]
		return m.IsOwner(k[:strings.LastIndex(k, "/")])
	}
	return l.(interface{ IsOwner() clientv3.Cmp }).IsOwner()
}

// TestHoldHeaderFromOwnRead: a hold admitted after a second page must take
// its header (the revision its Done watches from) from a read that saw its
// own key. The key is deleted between the two pages. Before, the header
// was the second page's, read after the deletion: Lock returned nil with
// no key in etcd, Done never closed and Err stayed nil. Now the pages are
// read at the revision of the write that placed the key: the hold was
// admitted then, and Done reports its loss at once.
func TestHoldHeaderFromOwnRead(t *testing.T) {
	t.Parallel()
	for _, c := range pagedCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			name := lockName(t)
			cli := newClient(t)
			// The write that places the key reads the page with it:
			// page-1 nested keys fill it, and one more makes a second.
			putNested(t, cli, name, c.page)

			var in etcdtest.Injector
			tcli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			s := newSession(t, tcli)
			l := c.mk(s, name)
			key := fmt.Sprintf("%s/%x", name, int64(s.Lease()))
			fired := in.At(etcdtest.Nth(2, unary), etcdtest.Action{Before: func(etcdtest.RPC) {
				if _, err := cli.Delete(t.Context(), key); err != nil {
					t.Errorf("delete %s: %v", key, err)
				}
			}})
			err := c.lock(t.Context(), l)
			select {
			case <-fired:
			default:
				t.Fatalf("Lock made fewer than 2 reads (it returned %v): the queue did not span two pages", err)
			}
			if err != nil {
				// Also correct: the loss seen before Lock returned.
				require.ErrorIs(t, err, etcdlock.ErrLockLost)
				return
			}
			select {
			case <-c.done(l):
			case <-time.After(10 * time.Second):
				t.Fatal("Done still open 10s after the hold's key was deleted")
			}
			require.ErrorIs(t, c.err(l), etcdlock.ErrLockLost)
		})
	}
}

// putTied puts keys in one Txn: they share one create revision. They have
// no lease; they are removed when the test ends.
func putTied(t *testing.T, cli *clientv3.Client, keys ...string) {
	t.Helper()
	var ops []clientv3.Op
	for _, k := range keys {
		ops = append(ops, clientv3.OpPut(k, ""))
	}
	_, err := cli.Txn(t.Context()).Then(ops...).Commit()
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, k := range keys {
			cli.Delete(context.Background(), k)
		}
	})
}

// tiedGroup returns n keys of a lock nested under name and one key of the
// lock itself, which sorts after them.
func tiedGroup(name string, n int) []string {
	var ks []string
	for i := range n {
		ks = append(ks, fmt.Sprintf("%s/sub/k%02d", name, i))
	}
	return append(ks, name+"/zzz")
}

// TestPageBoundaryTies (issue 17, item 7): keys that one Txn created share
// a create revision, and etcd orders equal revisions as it likes: a page
// can end in the middle of them. The next page must read the rest of that
// revision, neither skipping a key (before, it started below the
// revision: a key of the lock there was never seen) nor counting one
// twice. Each case puts a key of the lock beyond the first page, in a
// group of keys of a nested lock created in the same Txn.
func TestPageBoundaryTies(t *testing.T) {
	t.Parallel()
	t.Run("TryLock", func(t *testing.T) {
		t.Parallel()
		name := lockName(t)
		cli := newClient(t)
		putTied(t, cli, tiedGroup(name, 10)...)
		m := etcdlock.NewMutex(newSession(t, cli), name)
		require.ErrorIs(t, m.TryLock(t.Context()), etcdlock.ErrLocked, "granted while %s/zzz holds", name)
	})
	t.Run("Lock", func(t *testing.T) {
		t.Parallel()
		name := lockName(t)
		cli := newClient(t)
		putTied(t, cli, tiedGroup(name, 10)...)
		m := etcdlock.NewMutex(newSession(t, cli), name)
		w := startWaiter(t.Context(), m)
		require.Equal(t, name+"/zzz", w.waitIdle(t), "the waiter does not wait for the key ahead")
		_, err := cli.Delete(t.Context(), name+"/zzz")
		require.NoError(t, err)
		require.NoError(t, w.result(t, 10*time.Second))
		require.NoError(t, m.Unlock(t.Context()))
	})
	t.Run("CurrentLeader", func(t *testing.T) {
		t.Parallel()
		name := lockName(t)
		cli := newClient(t)
		putTied(t, cli, tiedGroup(name, 9)...)
		l, err := etcdlock.CurrentLeader(t.Context(), cli, name)
		require.NoError(t, err)
		require.Equal(t, name+"/zzz", l.Key)
	})
}

// TestInspectPageBoundaryTies: InspectLock's pages split a group of keys
// created by one Txn: each key is listed once.
func TestInspectPageBoundaryTies(t *testing.T) {
	// Not parallel: it changes the package's page size.
	defer etcdlock.SetInspectPage(4)()
	name := lockName(t)
	cli := newClient(t)
	var group []string
	for _, c := range "abcdef" {
		group = append(group, fmt.Sprintf("%s/%c", name, c))
	}
	putTied(t, cli, name+"/first")
	putTied(t, cli, group...)
	putTied(t, cli, name+"/last")
	q, err := etcdlock.InspectLock(t.Context(), cli, name, etcdlock.WithoutLeases())
	require.NoError(t, err)
	var got []string
	for _, k := range q.Keys {
		got = append(got, k.Key)
	}
	require.Len(t, got, 8, "%v", got)
	require.Equal(t, name+"/first", got[0])
	require.ElementsMatch(t, group, got[1:7])
	require.Equal(t, name+"/last", got[7])
}
