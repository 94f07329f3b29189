package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// requested waits up to 10s for ch to close.
func requested(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: ReleaseRequested not closed 10s after the request", what)
	}
}

// notRequested asserts ch stays open for a moment: a request that is not
// addressed to its hold must not close it. (It cannot fail when it
// should not; a wrong close on a slow machine may be missed.)
func notRequested(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: ReleaseRequested closed, but no request was addressed to it", what)
	case <-time.After(300 * time.Millisecond):
	}
}

// requestKeys returns the request keys of the lock name in etcd.
func requestKeys(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	resp, err := cli.Get(t.Context(), etcdlock.ReleaseRequestPrefix+name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var ks []string
	for _, kv := range resp.Kvs {
		ks = append(ks, string(kv.Key))
	}
	return ks
}

// TestRequestReleaseMutex: a request reaches the holder, once however
// often it is made, and never its waiter, nor a later hold of the same
// session on the same key. The request key is outside the lock's queue,
// bound to the holder's lease.
func TestRequestReleaseMutex(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	require.ErrorIs(t, etcdlock.RequestRelease(t.Context(), cli, name), etcdlock.ErrNotHeld)

	hs := newSession(t, cli)
	h := etcdlock.NewMutex(hs, name)
	require.Nil(t, h.ReleaseRequested(), "no hold yet: a channel that never closes")
	require.NoError(t, h.Lock(t.Context()))
	asked := h.ReleaseRequested()
	w := etcdlock.NewMutex(newSession(t, cli), name)
	q := startWaiter(t.Context(), w)
	q.waitIdle(t)

	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name), "asking twice")
	requested(t, asked, "holder")
	require.Equal(t, []string{etcdlock.ReleaseRequestPrefix + h.Key()}, requestKeys(t, cli, name), "one request")
	require.Equal(t, []string{h.Key(), w.Key()}, keys(t, cli, name), "the request is not in the queue")
	resp, err := cli.Get(t.Context(), etcdlock.ReleaseRequestPrefix+h.Key())
	require.NoError(t, err)
	require.Equal(t, int64(hs.Lease()), resp.Kvs[0].Lease, "the request goes with the holder's lease")
	require.Equal(t, fmt.Sprint(h.Token()), string(resp.Kvs[0].Value))

	lq, err := etcdlock.InspectLock(t.Context(), cli, name, etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.True(t, lq.Keys[0].ReleaseRequested, "InspectLock shows the pending request")
	require.False(t, lq.Keys[1].ReleaseRequested)

	// The request asks; it releases nothing.
	q.assertWaiting(t)
	require.NoError(t, h.Unlock(t.Context()))
	require.NoError(t, q.result(t, 10*time.Second))
	notRequested(t, w.ReleaseRequested(), "the next holder")
	require.Equal(t, asked, h.ReleaseRequested(), "the last hold's channel")

	// A later hold of the same session on the same key: the old request
	// key is still there, and names the old token.
	require.NoError(t, w.Unlock(t.Context()))
	require.NoError(t, h.Lock(t.Context()))
	again := h.ReleaseRequested()
	require.NotEqual(t, asked, again)
	_, err = cli.Put(t.Context(), etcdlock.ReleaseRequestPrefix+h.Key(), string(resp.Kvs[0].Value), clientv3.WithLease(hs.Lease()))
	require.NoError(t, err)
	notRequested(t, again, "a later hold, with the old request written again")
	lq, err = etcdlock.InspectLock(t.Context(), cli, name, etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.False(t, lq.Keys[0].ReleaseRequested, "an old request is not pending")
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	requested(t, again, "the later hold, asked")
	require.NoError(t, h.Unlock(t.Context()))

	// The request goes with the session.
	require.NoError(t, hs.Close())
	require.Empty(t, requestKeys(t, cli, name))
}

// TestRequestReleaseEveryHolder: a request reaches every hold current when
// it is made (the readers of an RWMutex, the holders of permits, a
// MultiMutex holding the name, an election's leader), and no waiter.
func TestRequestReleaseEveryHolder(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	t.Run("RWMutex", func(t *testing.T) {
		name := lockName(t)
		r1, r2 := etcdlock.NewRWMutex(newSession(t, cli), name), etcdlock.NewRWMutex(newSession(t, cli), name)
		require.NoError(t, r1.RLock(t.Context()))
		require.NoError(t, r2.RLock(t.Context()))
		wr := etcdlock.NewRWMutex(newSession(t, cli), name)
		q := startQ(t.Context(), wr, wr.Lock)
		q.waitIdle(t)
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
		requested(t, r1.ReleaseRequested(), "reader 1")
		requested(t, r2.ReleaseRequested(), "reader 2")
		require.NoError(t, r1.RUnlock(t.Context()))
		require.NoError(t, r2.RUnlock(t.Context()))
		require.NoError(t, q.result(t, 10*time.Second))
		notRequested(t, wr.ReleaseRequested(), "the writer, waiting then")
		require.NoError(t, wr.Unlock(t.Context()))
	})
	t.Run("Semaphore", func(t *testing.T) {
		name := lockName(t)
		a, b := etcdlock.NewSemaphore(newSession(t, cli), name, 3), etcdlock.NewSemaphore(newSession(t, cli), name, 3)
		require.NoError(t, a.Acquire(t.Context(), 1))
		require.NoError(t, b.Acquire(t.Context(), 2))
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
		requested(t, a.ReleaseRequested(), "1 permit")
		requested(t, b.ReleaseRequested(), "2 permits")
		require.NoError(t, a.Release(t.Context()))
		require.NoError(t, b.Release(t.Context()))
	})
	t.Run("MultiMutex", func(t *testing.T) {
		names := multiNames(t, 2)
		m := etcdlock.NewMultiMutex(newSession(t, cli), names)
		require.NoError(t, m.Lock(t.Context()))
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, names[1]))
		requested(t, m.ReleaseRequested(), "a set, asked under its second name")
		require.NoError(t, m.Unlock(t.Context()))
	})
	t.Run("Election", func(t *testing.T) {
		name := lockName(t)
		e := etcdlock.NewElection(newSession(t, cli), name)
		require.NoError(t, e.Campaign(t.Context(), "a"))
		asked := e.ReleaseRequested()
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
		requested(t, asked, "leader")
		require.NoError(t, e.Resign(t.Context()))
	})
	t.Run("EtcdMutex", func(t *testing.T) {
		// Asking etcd's Mutex writes a request it never reads, which
		// goes with its lease; its queue is not touched.
		name := lockName(t)
		es, err := concurrency.NewSession(cli)
		require.NoError(t, err)
		theirs := concurrency.NewMutex(es, name)
		require.NoError(t, theirs.Lock(t.Context()))
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
		require.Equal(t, []string{theirs.Key()}, keys(t, cli, name))
		require.NoError(t, theirs.Unlock(t.Context()))
		require.NoError(t, es.Close())
		require.Empty(t, requestKeys(t, cli, name))
	})
}

// TestRequestReleaseDo: Do cancels fn for a request only when made
// WithCancelOnRequest, with ErrReleaseRequested as the cause; without it,
// fn sees the request and decides.
func TestRequestReleaseDo(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	s := newSession(t, cli)

	m := etcdlock.NewMutex(s, name, etcdlock.WithCancelOnRequest())
	err := m.Do(t.Context(), func(ctx context.Context) error {
		if err := etcdlock.RequestRelease(ctx, cli, name); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			return errors.New("fn's ctx not cancelled 10s after the request")
		}
		require.ErrorIs(t, context.Cause(ctx), etcdlock.ErrReleaseRequested)
		return ctx.Err()
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Empty(t, keys(t, cli, name), "Do released the lock")

	plain := etcdlock.NewMutex(s, name)
	err = plain.Do(t.Context(), func(ctx context.Context) error {
		if err := etcdlock.RequestRelease(ctx, cli, name); err != nil {
			return err
		}
		requested(t, plain.ReleaseRequested(), "Do's hold")
		require.NoError(t, ctx.Err(), "fn's ctx cancelled without WithCancelOnRequest")
		return nil
	})
	require.NoError(t, err)
}

// TestRequestReleaseNames: the library's own prefix is no lock's name.
func TestRequestReleaseNames(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	s := newSession(t, cli)
	for _, name := range []string{"", "__etcdlock", "__etcdlock/release/x"} {
		require.ErrorIs(t, etcdlock.RequestRelease(t.Context(), cli, name), etcdlock.ErrInvalidName, "%q", name)
	}
	require.ErrorIs(t, etcdlock.NewMutex(s, "__etcdlock/x").Lock(t.Context()), etcdlock.ErrInvalidName)
	require.ErrorIs(t, etcdlock.NewElection(s, "__etcdlock/x").Campaign(t.Context(), "v"), etcdlock.ErrInvalidName)
}

// TestLeadYieldRace: with YieldOnRequest, one rule says how a term ends
// (issue 30: the docs of Lead and YieldOnRequest disagreed, and a request
// that came as fn returned nil ran fn again). A request that cancels fn's
// ctx before fn returns ends the term, whatever fn returns: Lead
// campaigns again and runs fn again. A request that comes once fn has
// returned nil cancels nothing: Lead returns nil, having run fn once.
func TestLeadYieldRace(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	opts := []etcdlock.LeadOption{etcdlock.YieldOnRequest(), etcdlock.WithSessionOptions(etcdlock.WithTTL(5 * time.Second))}

	t.Run("RequestBeforeReturn", func(t *testing.T) {
		name := lockName(t)
		runs := 0
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		err := etcdlock.Lead(ctx, cli, name, "v", func(fctx context.Context) error {
			runs++
			if runs == 1 {
				require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
				<-fctx.Done() // cancelled before fn returns
				require.ErrorIs(t, context.Cause(fctx), etcdlock.ErrReleaseRequested)
				return nil
			}
			cancel() // run again: enough
			return nil
		}, opts...)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, 2, runs)
	})

	t.Run("RequestAfterReturn", func(t *testing.T) {
		name := lockName(t)
		runs := 0
		hook := etcdlock.WithTestHookReturned(func(fctx context.Context, e *etcdlock.Election) {
			// fn has returned nil: a request comes now, before Lead
			// stops watching for one. It must cancel nothing.
			require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
			select {
			case <-e.ReleaseRequested():
			case <-time.After(30 * time.Second):
				t.Fatal("the request was never seen")
			}
			select {
			case <-fctx.Done():
			case <-time.After(time.Second): // a cancel would come within a moment
			}
		})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		err := etcdlock.Lead(ctx, cli, name, "v", func(context.Context) error {
			if runs++; runs > 1 {
				cancel() // run again: the request was taken for the term's
			}
			return nil
		}, append(opts, hook)...)
		require.NoError(t, err, "fn's nil stands")
		require.Equal(t, 1, runs, "fn ran again for a request after it returned")
	})
}

// TestLeadYieldOnRequest: three Lead loops made YieldOnRequest. Each
// request moves the leadership once, to the next in line: fn's ctx ends
// with ErrReleaseRequested, the next candidate's fn starts, and the one
// that yielded rejoins at the back, so the leadership goes round. A Lead
// without the option sees the request in its Term and goes on leading.
func TestLeadYieldOnRequest(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	type start struct {
		id    int
		token int64
	}
	starts := make(chan start, 16)
	causes := make(chan error, 16)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	defer func() {
		cancel()
		wg.Wait()
	}()
	lead := func(id int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			etcdlock.Lead(ctx, newClient(t), name, fmt.Sprint(id), func(ctx context.Context) error {
				term, _ := etcdlock.TermFromContext(ctx)
				starts <- start{id, term.Token}
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return nil
			}, etcdlock.YieldOnRequest(), etcdlock.WithSessionOptions(etcdlock.WithTTL(5*time.Second)))
		}()
	}
	next := func() start {
		t.Helper()
		select {
		case s := <-starts:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no leader 10s after the request")
		}
		return start{}
	}
	lead(0)
	require.Equal(t, 0, next().id)
	lead(1)
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	lead(2)
	require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 3 }, 10*time.Second, 5*time.Millisecond)

	last := int64(0)
	for i, want := range []int{1, 2, 0, 1} {
		require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name), "request %d", i)
		s := next()
		require.Equal(t, want, s.id, "request %d moved the leadership to the next in line", i)
		require.Greater(t, s.token, last)
		last = s.token
		require.ErrorIs(t, <-causes, etcdlock.ErrReleaseRequested)
		select {
		case s := <-starts:
			t.Fatalf("request %d moved the leadership twice: %d leads too", i, s.id)
		default:
		}
		// The one that yielded is back in line.
		require.Eventually(t, func() bool { return len(keys(t, cli, name)) == 3 }, 10*time.Second, 5*time.Millisecond)
	}

	// Without the option, the request reaches fn through its Term, and
	// ending the term is fn's choice.
	other := lockName(t) + "-plain"
	got := make(chan error, 1)
	go func() {
		got <- etcdlock.Lead(t.Context(), cli, other, "p", func(ctx context.Context) error {
			term, _ := etcdlock.TermFromContext(ctx)
			if err := etcdlock.RequestRelease(ctx, cli, other); err != nil {
				return err
			}
			select {
			case <-term.ReleaseRequested():
			case <-time.After(10 * time.Second):
				return errors.New("Term.ReleaseRequested not closed 10s after the request")
			}
			return ctx.Err() // still leading: nil, and Lead resigns and returns
		})
	}()
	require.NoError(t, <-got)
	require.Nil(t, etcdlock.Term{}.ReleaseRequested())
}

// TestRequestReleaseSchedules injects faults at the RPCs of RequestRelease:
// the read of the queue, then the guarded write. The invariant, checked
// against etcd: the request reaches the holds current when it is
// recorded, and no other.
func TestRequestReleaseSchedules(t *testing.T) {
	t.Parallel()
	cli := newClient(t)

	// The holder releases, and its waiter takes over, between the read
	// and the write: the write's guard fails, and the request goes to
	// the new holder.
	t.Run("HandoverBetween", func(t *testing.T) {
		name := lockName(t)
		h := etcdlock.NewMutex(newSession(t, cli), name)
		require.NoError(t, h.Lock(t.Context()))
		old := h.ReleaseRequested()
		w := etcdlock.NewMutex(newSession(t, cli), name)
		q := startWaiter(t.Context(), w)
		q.waitIdle(t)

		var in etcdtest.Injector
		asker := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
		fired := in.At(etcdtest.Nth(2, unary), etcdtest.Action{Before: func(etcdtest.RPC) {
			if err := h.Unlock(t.Context()); err != nil {
				t.Errorf("holder's Unlock: %v", err)
			}
			if err := q.result(t, 10*time.Second); err != nil {
				t.Errorf("waiter's Lock: %v", err)
			}
		}})
		require.NoError(t, etcdlock.RequestRelease(t.Context(), asker, name))
		<-fired
		requested(t, w.ReleaseRequested(), "the holder when the request was recorded")
		notRequested(t, old, "the holder when the queue was read, released before the write")
		require.Equal(t, []string{etcdlock.ReleaseRequestPrefix + w.Key()}, requestKeys(t, cli, name))
		require.NoError(t, w.Unlock(t.Context()))
	})

	// The write's answer is lost after etcd applied it, or the write
	// fails before: either way it is sent again, and is one request.
	for _, c := range []struct {
		name string
		act  etcdtest.Action
	}{
		{"AnswerLost", etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
			if err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "test: the answer was lost")
		}}},
		{"Failed", etcdtest.Action{Fail: status.Error(codes.Unknown, "raft proposal dropped")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := lockName(t)
			h := etcdlock.NewMutex(newSession(t, cli), name)
			require.NoError(t, h.Lock(t.Context()))
			var in etcdtest.Injector
			asker := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			fired := in.At(etcdtest.Nth(2, unary), c.act)
			require.NoError(t, etcdlock.RequestRelease(t.Context(), asker, name))
			<-fired
			requested(t, h.ReleaseRequested(), "holder")
			require.Equal(t, []string{etcdlock.ReleaseRequestPrefix + h.Key()}, requestKeys(t, cli, name))
			require.NoError(t, h.Unlock(t.Context()))
		})
	}
}

// TestReleaseRequestedCompaction: a holder that asks ReleaseRequested
// long after its hold began, with the history since compacted, still
// sees a request, and does not take an old one for it. Not parallel: it
// compacts the shared etcd, which tests of replayed history
// (TestStaleWatchNoFalseLoss) must not meet.
func TestReleaseRequestedCompaction(t *testing.T) {
	cli := newClient(t)
	name := lockName(t)
	s := newSession(t, cli)
	h := etcdlock.NewMutex(s, name)
	require.NoError(t, h.Lock(t.Context()))
	// An old request, for an earlier token of the same key.
	_, err := cli.Put(t.Context(), etcdlock.ReleaseRequestPrefix+h.Key(), fmt.Sprint(h.Token()-1), clientv3.WithLease(s.Lease()))
	require.NoError(t, err)
	resp, err := cli.Get(t.Context(), "\x00")
	require.NoError(t, err)
	_, err = cli.Compact(t.Context(), resp.Header.Revision)
	require.NoError(t, err)
	asked := h.ReleaseRequested()
	notRequested(t, asked, "a request for another token")
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	requested(t, asked, "holder, after a compaction")
	require.NoError(t, h.Unlock(t.Context()))
}

// TestReleaseRequestedWatchSchedules: a holder asks ReleaseRequested after
// the request was made, so only the read that follows its watch's
// creation can see it, and that read fails: the holder watches and reads
// again, and sees the request.
func TestReleaseRequestedWatchSchedules(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	var in etcdtest.Injector
	hcli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	h := etcdlock.NewMutex(newSession(t, hcli), name)
	require.NoError(t, h.Lock(t.Context()))
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	fired := in.At(etcdtest.Nth(1, unary), etcdtest.Action{Fail: status.Error(codes.Unknown, "raft proposal dropped")})
	asked := h.ReleaseRequested()
	select {
	case <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("the holder's read after its watch was never sent")
	}
	requested(t, asked, "holder whose first read failed")
	require.NoError(t, h.Unlock(t.Context()))
}

// TestRequestReleaseReaderJoins: a reader is admitted among the holding
// readers between RequestRelease's read of the queue and its write: the
// request reaches it too, as a hold current when the request was recorded
// (the write is guarded by the queue's prefix when holders share the
// lock, and the queue is read again).
func TestRequestReleaseReaderJoins(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	r1 := etcdlock.NewRWMutex(newSession(t, cli), name)
	require.NoError(t, r1.RLock(t.Context()))
	r2 := etcdlock.NewRWMutex(newSession(t, cli), name)
	var in etcdtest.Injector
	asker := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	fired := in.At(etcdtest.Nth(2, unary), etcdtest.Action{Before: func(etcdtest.RPC) {
		if err := r2.RLock(t.Context()); err != nil {
			t.Errorf("second reader: %v", err)
		}
	}})
	require.NoError(t, etcdlock.RequestRelease(t.Context(), asker, name))
	<-fired
	requested(t, r1.ReleaseRequested(), "the reader holding when the queue was read")
	requested(t, r2.ReleaseRequested(), "the reader admitted before the request was recorded")
	require.NoError(t, r1.RUnlock(t.Context()))
	require.NoError(t, r2.RUnlock(t.Context()))
}

// TestRequestReleaseWaitingSet: a MultiMutex at the head of a name's
// queue that still waits for its other names holds nothing: InspectLock
// and ListLocks show its key first in line, waiting for the name that
// keeps it out, and a request on the name is for nobody (ErrNotHeld), so
// it never reaches the hold the set begins later. (Before issue 30 the
// readers showed the set holding the name, and the request reached it.)
func TestRequestReleaseWaitingSet(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	names := multiNames(t, 2)
	b := etcdlock.NewMutex(newSession(t, cli), names[1])
	require.NoError(t, b.Lock(t.Context()))
	m := etcdlock.NewMultiMutex(newSession(t, cli), names)
	q := startMulti(t.Context(), m)
	q.waitIdle(t)
	lq, err := etcdlock.InspectLock(t.Context(), cli, names[0], etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.Empty(t, lq.Holders(), "the waiting set holds nothing")
	require.Len(t, lq.Waiters(), 1)
	require.Equal(t, m.Keys()[0], lq.Waiters()[0].Key)
	require.True(t, lq.Waiters()[0].InSet)
	require.Equal(t, names[1], lq.Waiters()[0].WaitsFor)
	l, err := etcdlock.ListLocks(t.Context(), cli, names[0])
	require.NoError(t, err)
	require.Equal(t, names[0], l.Locks[0].Name)
	require.Empty(t, l.Locks[0].Holders)
	require.Equal(t, 1, l.Locks[0].Waiters)
	err = etcdlock.RequestRelease(t.Context(), cli, names[0])
	require.ErrorIs(t, err, etcdlock.ErrNotHeld)
	require.ErrorContains(t, err, "still waits for "+names[1])

	require.NoError(t, b.Unlock(t.Context()))
	require.NoError(t, q.result(t, 10*time.Second))
	lq, err = etcdlock.InspectLock(t.Context(), cli, names[0], etcdlock.WithoutLeases())
	require.NoError(t, err)
	require.Equal(t, m.Keys()[0], lq.Holders()[0].Key, "the set holds every name")
	require.Empty(t, lq.Holders()[0].WaitsFor)
	resp, err := cli.Get(t.Context(), etcdlock.ReleaseRequestPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	for _, kv := range resp.Kvs {
		require.NotContains(t, string(kv.Key), m.Keys()[0], "a request for nobody was written")
	}
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, names[0]))
	requested(t, m.ReleaseRequested(), "the set, asked once it holds")
	require.NoError(t, m.Unlock(t.Context()))
}

// TestReleaseRequestedWithoutPermission: a holder whose user may not read
// the request keys watches for a request once: etcd refuses the watch,
// and ReleaseRequested never closes, rather than the watch being made
// again and again for as long as the hold lasts. (etcdlock run watches
// every hold's requests, to say that it ignores one.)
func TestReleaseRequestedWithoutPermission(t *testing.T) {
	t.Parallel()
	name := "authrequests"
	c := authCluster(t, name)
	var in etcdtest.Injector
	var creates atomic.Int64
	in.Trace(func(r etcdtest.RPC) {
		if w, ok := r.Req.(*pb.WatchRequest); ok && w.GetCreateRequest() != nil &&
			strings.HasPrefix(string(w.GetCreateRequest().Key), etcdlock.ReleaseRequestPrefix) {
			creates.Add(1)
		}
	})
	alice := c.Client(t, clientv3.Config{Username: "alice", Password: "alice-pw", DialOptions: in.DialOptions()})
	m := etcdlock.NewMutex(newSession(t, alice), name)
	require.NoError(t, m.Lock(t.Context()))
	asked := m.ReleaseRequested()
	require.Eventually(t, func() bool { return creates.Load() >= 1 }, 10*time.Second, 10*time.Millisecond)
	// Made again, the watch would come back within its backoff (50ms,
	// doubling to a second): three seconds see several.
	time.Sleep(3 * time.Second)
	require.EqualValues(t, 1, creates.Load(), "the refused watch was made again")
	select {
	case <-asked:
		t.Fatal("ReleaseRequested closed with no request")
	default:
	}
	require.NoError(t, m.Unlock(t.Context()))
}

// TestRequestReleasePermission: a request by a user who may read the lock
// but not write its request keys is refused, and the error names the
// request keys' range, the one etcd refused (a probe finds it: issue 40),
// and the grants command (issue 31: it was etcd's bare error).
func TestRequestReleasePermission(t *testing.T) {
	t.Parallel()
	name := "authask"
	c := authCluster(t, name)
	alice := c.Client(t, clientv3.Config{Username: "alice", Password: "alice-pw"})
	m := etcdlock.NewMutex(newSession(t, alice), name)
	require.NoError(t, m.Lock(t.Context()))
	err := etcdlock.RequestRelease(t.Context(), alice, name)
	require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
	require.ErrorContains(t, err, `a release request on authask writes the keys with prefix "__etcdlock/release/authask/", which etcd refuses its user`)
	require.ErrorContains(t, err, "'etcdlock grants --requests NAME...' prints the etcdctl lines")
	require.NoError(t, m.Unlock(t.Context()))
}
