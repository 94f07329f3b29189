package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Seams between features: the max hold with the lock
// delay, release requests, readers and permits, Downgrade and Hooks; the
// lock delay with a Semaphore's holders and RequestRelease.

// seamMaxHold is the max hold of these tests: 2s, a lease TTL above the
// test cluster's minimum.
const seamMaxHold = 2 * time.Second

// holdEnds returns Hooks that send each HoldDone on the channel returned.
func holdEnds() (etcdlock.Hooks, chan etcdlock.HoldDoneInfo) {
	ch := make(chan etcdlock.HoldDoneInfo, 8)
	return etcdlock.Hooks{HoldDone: func(i etcdlock.HoldDoneInfo) { ch <- i }}, ch
}

// nextEnd waits up to 30s for the next HoldDone on ch.
func nextEnd(t *testing.T, ch <-chan etcdlock.HoldDoneInfo) etcdlock.HoldDoneInfo {
	t.Helper()
	select {
	case i := <-ch:
		return i
	case <-time.After(30 * time.Second):
		t.Fatal("no HoldDone within 30s")
	}
	return etcdlock.HoldDoneInfo{}
}

// TestSeamMaxHoldLockDelay: a hold that the max hold ends has ended
// without Unlock: its key goes with the max hold's lease, its record
// stays pending (it is bound to no lease), and the next waiter waits the
// delay from then; the holder is told first, with the max hold as the
// cause; readers of the queue say nobody holds while the delay lasts;
// and the holder's late Unlock reports the loss and leaves the delay.
func TestSeamMaxHoldLockDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	hooks, ends := holdEnds()
	m := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithHooks(hooks)), name,
		etcdlock.WithMaxHold(seamMaxHold), etcdlock.WithLockDelay(testDelay))
	require.NoError(t, m.Lock(t.Context()))
	token := m.Token()
	require.Equal(t, []string{m.Key()}, recordKeys(delayRecords(t, cli, name)))
	gone := watchDeletion(t, cli, m.Key())

	w := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithLockDelay(time.Second))
	wq := startWaiter(t.Context(), w)
	require.Equal(t, m.Key(), wq.waitIdle(t))

	done := m.Done()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Done did not close at the max hold")
	}
	require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
	end := nextEnd(t, ends)
	require.Equal(t, etcdlock.LostMaxHold, end.End, "%v", end.Err)

	deleted := gone(30 * time.Second)
	rec := delayRecords(t, cli, name)[m.Key()]
	require.NotNil(t, rec, "the record stays once the max hold's lease took the key")
	require.Equal(t, token, rec.token)
	require.Equal(t, etcdlock.LockDelayPrefix+m.Key(), wq.waitIdle(t), "the waiter waits the delay")

	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Empty(t, q.Holders(), "nobody holds while the delay lasts")
	require.Len(t, q.Delays, 1)
	require.Equal(t, token, q.Delays[0].Token)
	require.ErrorIs(t, etcdlock.RequestRelease(t.Context(), cli, name), etcdlock.ErrNotHeld)

	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.NotNil(t, delayRecords(t, cli, name)[m.Key()], "a late Unlock of a lost hold leaves the delay")
	require.NoError(t, wq.result(t, 30*time.Second))
	require.GreaterOrEqual(t, time.Since(deleted), testDelay, "admitted before the delay was over")
	require.NoError(t, w.Unlock(t.Context()))
	require.Empty(t, delayRecords(t, cli, name))
}

// TestSeamMaxHoldUnwatchedThenClose: a hold whose max hold passed
// with nobody watching it (Err reports the max hold) is reported to
// Hooks, at the latest at the session's end, as lost by its max hold,
// not as closed with the session: it had ended before Close, and its key
// was gone.
func TestSeamMaxHoldUnwatchedThenClose(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	hooks, ends := holdEnds()
	s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithHooks(hooks))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	m := etcdlock.NewMutex(s, name, etcdlock.WithMaxHold(seamMaxHold))
	require.NoError(t, m.Lock(t.Context()))
	watchDeletion(t, cli, m.Key())(30 * time.Second)
	lost := m.Err()
	require.ErrorIs(t, lost, etcdlock.ErrLockLost, "the max hold has passed")
	require.NotErrorIs(t, lost, etcdlock.ErrSessionExpired, "the session lives: %v", lost)

	require.NoError(t, s.Close())
	end := nextEnd(t, ends)
	require.Equal(t, etcdlock.LostMaxHold, end.End, "%v", end.Err)
	require.NotErrorIs(t, m.Err(), etcdlock.ErrSessionExpired, "Err still says the max hold: %v", m.Err())
}

// TestSeamDowngradePastMaxHold: Downgrade of a write lock whose max
// hold has passed returns an error matching ErrLockLost ("if the hold
// had ended"), as Unlock and an Election's Proclaim do: whether or not
// Done watched the hold. It must not turn the key shared and return nil
// once Err says the hold is lost.
func TestSeamDowngradePastMaxHold(t *testing.T) {
	t.Parallel()
	for _, watched := range []bool{false, true} {
		t.Run(map[bool]string{false: "Unwatched", true: "Watched"}[watched], func(t *testing.T) {
			t.Parallel()
			cli := newClient(t)
			name := lockName(t)
			// A TTL whose margin (TTL/50) leaves the key in place a
			// good while after Err says the max hold passed.
			s := newSession(t, cli, etcdlock.WithTTL(30*time.Second))
			m := etcdlock.NewRWMutex(s, name, etcdlock.WithMaxHold(seamMaxHold))
			require.NoError(t, m.Lock(t.Context()))
			if watched {
				select {
				case <-m.Done():
				case <-time.After(30 * time.Second):
					t.Fatal("Done did not close at the max hold")
				}
			} else {
				require.Eventually(t, func() bool { return m.Err() != nil }, 30*time.Second, 10*time.Millisecond)
			}
			require.ErrorIs(t, m.Err(), etcdlock.ErrLockLost)
			err := m.Downgrade(t.Context())
			require.ErrorIs(t, err, etcdlock.ErrLockLost, "Downgrade of a hold that ended: %v", err)
			require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
		})
	}
}

// TestSeamMaxHoldReaderAndPermits: a reader's and a Semaphore's hold
// with a max hold keep their mode when the key moves onto the max hold's
// lease (the writer or the larger request behind still waits), are told
// lost at the max hold, and the waiter behind is admitted once etcd ends
// the lease.
func TestSeamMaxHoldReaderAndPermits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		hold func(s *etcdlock.Session, name string) interface {
			Key() string
			Done() <-chan struct{}
			Err() error
		}
		wait func(s *etcdlock.Session, name string) func(context.Context) error
		want string
	}{
		{"Reader",
			func(s *etcdlock.Session, name string) interface {
				Key() string
				Done() <-chan struct{}
				Err() error
			} {
				r := etcdlock.NewRWMutex(s, name, etcdlock.WithMaxHold(seamMaxHold), etcdlock.WithIdentity("r"))
				require.NoError(t, r.RLock(t.Context()))
				return r
			},
			func(s *etcdlock.Session, name string) func(context.Context) error {
				return etcdlock.NewRWMutex(s, name).Lock
			},
			"etcdlock/1 shared\nr"},
		{"Permits",
			func(s *etcdlock.Session, name string) interface {
				Key() string
				Done() <-chan struct{}
				Err() error
			} {
				sem := etcdlock.NewSemaphore(s, name, 3, etcdlock.WithMaxHold(seamMaxHold))
				require.NoError(t, sem.Acquire(t.Context(), 2))
				return sem
			},
			func(s *etcdlock.Session, name string) func(context.Context) error {
				sem := etcdlock.NewSemaphore(s, name, 3)
				return func(ctx context.Context) error { return sem.Acquire(ctx, 2) }
			},
			"etcdlock/1 permits 2 of 3"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cli := newClient(t)
			name := lockName(t)
			s := newSession(t, cli)
			h := c.hold(s, name)
			resp, err := cli.Get(t.Context(), h.Key())
			require.NoError(t, err)
			require.Equal(t, c.want, string(resp.Kvs[0].Value), "the mode stays on the max hold's lease")
			require.NotEqual(t, int64(s.Lease()), resp.Kvs[0].Lease, "bound to a lease of its own")

			lock := c.wait(newSession(t, cli), name)
			done := make(chan error, 1)
			go func() { done <- lock(t.Context()) }()
			select {
			case err := <-done:
				t.Fatalf("admitted beside the max hold's holder: %v", err)
			case <-h.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("Done did not close at the max hold")
			}
			require.ErrorIs(t, h.Err(), etcdlock.ErrLockLost)
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Fatal("the waiter was not admitted after the max hold")
			}
		})
	}
}

// TestSeamMaxHoldCancelOnRequest: a request reaches a hold whose key
// moved onto its max hold's lease (the request is bound to that lease),
// Do's fn is cancelled with ErrReleaseRequested, not a loss, and the
// release is clean: no loss reported, the request goes with the hold.
func TestSeamMaxHoldCancelOnRequest(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	hooks, ends := holdEnds()
	m := etcdlock.NewMutex(newSession(t, cli, etcdlock.WithHooks(hooks)), name,
		etcdlock.WithMaxHold(time.Minute), etcdlock.WithCancelOnRequest())
	in, checked := make(chan struct{}), make(chan struct{})
	var cause error
	errc := make(chan error, 1)
	go func() {
		errc <- m.Do(t.Context(), func(ctx context.Context) error {
			close(in)
			<-ctx.Done()
			cause = context.Cause(ctx)
			// The hold, and the request with it, last until the test has
			// read the request: fn's return releases them.
			<-checked
			return nil
		})
	}()
	<-in
	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, q.Holders(), 1)
	maxLease := q.Holders()[0].Lease
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	resp, err := cli.Get(t.Context(), etcdlock.ReleaseRequestPrefix+m.Key())
	close(checked)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, int64(maxLease), resp.Kvs[0].Lease, "the request is bound to the hold key's lease")
	select {
	case err := <-errc:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("fn was not cancelled by the request")
	}
	require.ErrorIs(t, cause, etcdlock.ErrReleaseRequested)
	end := nextEnd(t, ends)
	require.Equal(t, etcdlock.Released, end.End, "%v", end.Err)
	require.Empty(t, keys(t, cli, name))
	require.Empty(t, requestKeys(t, cli, name), "the request went with the max hold's lease")
}

// TestSeamTryLockMaxHoldDelay: a TryLock with a max hold and a delay
// writes its record in its put, and the max hold moves the key, not the
// record; once the max hold ends the hold, the next TryLock returns
// ErrLocked and starts the delay, and succeeds once it is over.
func TestSeamTryLockMaxHoldDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	m := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithMaxHold(seamMaxHold), etcdlock.WithLockDelay(testDelay))
	require.NoError(t, m.TryLock(t.Context()))
	rec := delayRecords(t, cli, name)[m.Key()]
	require.NotNil(t, rec)
	require.Equal(t, m.Token(), rec.token)
	require.Zero(t, rec.lease, "the record is bound to no lease")
	watchDeletion(t, cli, m.Key())(30 * time.Second)

	w := etcdlock.NewMutex(newSession(t, cli), name, etcdlock.WithLockDelay(testDelay))
	started := time.Now()
	require.ErrorIs(t, w.TryLock(t.Context()), etcdlock.ErrLocked)
	rec = delayRecords(t, cli, name)[m.Key()]
	require.NotNil(t, rec)
	require.NotZero(t, rec.lease, "the Try started the delay")
	watchDeletion(t, cli, etcdlock.LockDelayPrefix+m.Key())(30 * time.Second)
	require.GreaterOrEqual(t, time.Since(started), testDelay)
	require.NoError(t, w.TryLock(t.Context()))
	require.ErrorIs(t, m.Unlock(t.Context()), etcdlock.ErrLockLost)
	require.NoError(t, w.Unlock(t.Context()))
}

// TestSeamSemaphoreDelayWhoHolds: a Semaphore's permit whose session
// ended leaves a delay; the permits still held hold (they wrote their
// records), the permit that arrives after waits the delay although it
// fits, and every reader says so: InspectLock, ListLocks, and
// RequestRelease, whose request reaches the holder only, never the hold
// admitted after the delay.
func TestSeamSemaphoreDelayWhoHolds(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	s1, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s1.Close() })
	p1 := etcdlock.NewSemaphore(s1, name, 3, etcdlock.WithLockDelay(longDelay))
	require.NoError(t, p1.Acquire(t.Context(), 1))
	p2 := etcdlock.NewSemaphore(newSession(t, cli), name, 3, etcdlock.WithLockDelay(longDelay))
	require.NoError(t, p2.Acquire(t.Context(), 1))
	require.Len(t, delayRecords(t, cli, name), 2)
	require.NoError(t, s1.Close())

	p3 := etcdlock.NewSemaphore(newSession(t, cli), name, 3, etcdlock.WithLockDelay(longDelay))
	idle := make(chan []string, 8)
	etcdlock.SetTestHookWaitKeys(p3, func(keys []string) {
		select {
		case idle <- keys:
		default:
		}
	})
	done := make(chan error, 1)
	go func() { done <- p3.Acquire(t.Context(), 1) }()
	select {
	case keys := <-idle:
		require.Equal(t, []string{etcdlock.LockDelayPrefix + p1.Key()}, keys, "it waits the delay")
	case err := <-done:
		t.Fatalf("admitted during the delay: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the permit did not wait")
	}

	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, q.Holders(), 1)
	require.Equal(t, p2.Key(), q.Holders()[0].Key)
	require.Len(t, q.Waiters(), 1)
	require.Equal(t, p3.Key(), q.Waiters()[0].Key)
	require.Len(t, q.Delays, 1)
	l, err := etcdlock.ListLocks(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, l.Locks, 1)
	require.Len(t, l.Locks[0].Holders, 1)
	require.Equal(t, p2.Key(), l.Locks[0].Holders[0].Key)

	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	requested(t, p2.ReleaseRequested(), "p2")
	_, err = cli.Revoke(t.Context(), clientv3.LeaseID(delayRecords(t, cli, name)[p1.Key()].lease)) // end the hour now
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("not admitted after the delay")
	}
	notRequested(t, p3.ReleaseRequested(), "p3, admitted after the request")
	require.NoError(t, p2.Release(t.Context()))
	require.NoError(t, p3.Release(t.Context()))
}

// TestSeamDowngradeLockDelay: readers admitted by a Downgrade write
// their records; when the downgraded hold then ends without Unlock, its
// delay is pending, the readers admitted with it still hold (and are
// shown holding), and a reader arriving after waits the delay.
func TestSeamDowngradeLockDelay(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	w := etcdlock.NewRWMutex(s, name, etcdlock.WithLockDelay(longDelay))
	require.NoError(t, w.Lock(t.Context()))
	r1 := etcdlock.NewRWMutex(newSession(t, cli), name, etcdlock.WithLockDelay(longDelay))
	wr1 := rlocker(t.Context(), r1)
	require.Equal(t, []string{w.Key()}, wr1.waitIdle(t))
	require.NoError(t, w.Downgrade(t.Context()))
	require.NoError(t, wr1.result(t, 10*time.Second))
	require.ElementsMatch(t, []string{w.Key(), r1.Key()}, recordKeys(delayRecords(t, cli, name)), "the admitted reader wrote its record")
	require.NoError(t, s.Close())

	q, err := etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, q.Delays, 1)
	require.Equal(t, w.Key(), q.Delays[0].Key)
	require.Len(t, q.Holders(), 1)
	require.Equal(t, r1.Key(), q.Holders()[0].Key, "the reader admitted with the downgraded hold holds")

	r2 := etcdlock.NewRWMutex(newSession(t, cli), name, etcdlock.WithLockDelay(longDelay))
	wr2 := rlocker(t.Context(), r2)
	require.Equal(t, []string{etcdlock.LockDelayPrefix + w.Key()}, wr2.waitIdle(t), "a later reader waits the delay")
	q, err = etcdlock.InspectLock(t.Context(), cli, name)
	require.NoError(t, err)
	require.Len(t, q.Holders(), 1)
	require.Equal(t, r1.Key(), q.Holders()[0].Key)
	require.Len(t, q.Waiters(), 1)
	_, err = cli.Revoke(t.Context(), clientv3.LeaseID(delayRecords(t, cli, name)[w.Key()].lease)) // end the hour now
	require.NoError(t, err)
	require.NoError(t, wr2.result(t, 30*time.Second))
	require.NoError(t, r1.RUnlock(t.Context()))
	require.NoError(t, r2.RUnlock(t.Context()))
}

// TestSeamMinHoldHooks: an Unlock that the minimum hold holds back
// reports nothing yet (the key stays, and the lock is taken); HoldDone
// comes once, when the session's release deletes the key, as Released,
// with Held at least the minimum hold; Done closes then; Close reports
// nothing more.
func TestSeamMinHoldHooks(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := delayName(t)
	hooks, ends := holdEnds()
	s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithHooks(hooks))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	m := etcdlock.NewMutex(s, name, etcdlock.WithMinHold(testMinHold))
	require.NoError(t, m.Lock(t.Context()))
	key := m.Key()
	done := m.Done()
	require.NoError(t, m.Unlock(t.Context()))
	select {
	case i := <-ends:
		t.Fatalf("HoldDone while the minimum hold keeps the key: %+v", i)
	default:
	}
	require.Equal(t, []string{key}, keys(t, cli, name), "held back")
	end := nextEnd(t, ends)
	require.Equal(t, etcdlock.Released, end.End, "%v", end.Err)
	require.GreaterOrEqual(t, end.Held, testMinHold)
	require.Empty(t, keys(t, cli, name), "reported once the key is gone")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Done did not close with the release")
	}
	require.NoError(t, s.Close())
	select {
	case i := <-ends:
		t.Fatalf("a second HoldDone: %+v", i)
	default:
	}
}

// TestSeamMultiNestedRequest: a MultiMutex over a name and a name nested
// in it, beside a nested lock's holder older than the set: readers of
// each name follow the set round its names and pass the nested lock's
// key by, so the set holds both names, and a request for the nested
// name reaches the set, not the waiter behind it, nor the hold that
// waiter takes next.
func TestSeamMultiNestedRequest(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	sub := name + "/sub"
	deeper := etcdlock.NewMutex(newSession(t, cli), sub+"/deeper")
	require.NoError(t, deeper.Lock(t.Context())) // older than the set, in a nested lock of sub

	set := etcdlock.NewMultiMutex(newSession(t, cli), []string{name, sub}, etcdlock.WithCancelOnRequest())
	require.NoError(t, set.Lock(t.Context()))
	for _, n := range []string{name, sub} {
		q, err := etcdlock.InspectLock(t.Context(), cli, n)
		require.NoError(t, err)
		require.Len(t, q.Holders(), 1, "%s: %+v", n, q.Keys)
		require.True(t, q.Holders()[0].InSet)
		require.Empty(t, q.Holders()[0].WaitsFor)
	}
	w := etcdlock.NewMutex(newSession(t, cli), sub)
	wq := startWaiter(t.Context(), w)
	wq.waitIdle(t)

	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, sub))
	requested(t, set.ReleaseRequested(), "the set")
	q, err := etcdlock.InspectLock(t.Context(), cli, sub)
	require.NoError(t, err)
	require.True(t, q.Holders()[0].ReleaseRequested)
	require.Empty(t, requestKeys(t, cli, sub+"/deeper"), "the nested lock's holder was not asked")
	require.NoError(t, set.Unlock(t.Context()))
	require.NoError(t, wq.result(t, 10*time.Second))
	notRequested(t, w.ReleaseRequested(), "the hold after the set's")
	require.NoError(t, w.Unlock(t.Context()))
	require.NoError(t, deeper.Unlock(t.Context()))
}
