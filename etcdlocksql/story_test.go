package etcdlocksql_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlocksql"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPausedHolderIsFenced is the story fencing exists for, on a real
// etcd. Holder A locks and writes. Then A is paused: the test cuts A's
// connection to etcd (a proxy drops all its traffic), so A's keepalives
// stop reaching etcd, as they would while A's process is stopped, and
// etcd expires A's lease after its TTL. B, queued behind A, gets the lock
// with a higher token and writes. Then A resumes and sends the write it
// was about to send when it paused: a paused process does not look at its
// lock again before the write it was in the middle of, so A writes without
// checking Done or IsOwner. The database refuses it, and keeps B's value.
func TestPausedHolderIsFenced(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		name := "fence/" + t.Name()

		px := etcdtest.NewProxy(t, cluster.Endpoint(0))
		acli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
		// Cut off, A's session could not revoke its lease: Orphan, not Close.
		as, err := etcdlock.NewSession(ctx, acli, etcdlock.WithTTL(2*time.Second))
		require.NoError(t, err)
		t.Cleanup(as.Orphan)
		a := etcdlock.NewMutex(as, name)
		require.NoError(t, a.Lock(ctx))
		tokenA := a.Token()
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A", tokenA)))

		bs, err := etcdlock.NewSession(ctx, cluster.Client(t))
		require.NoError(t, err)
		t.Cleanup(func() { bs.Close() })
		b := etcdlock.NewMutex(bs, name)
		locked := make(chan error, 1)
		go func() { locked <- b.Lock(ctx) }()
		select {
		case err := <-locked:
			t.Fatalf("B locked while A held the lock: %v", err)
		case <-time.After(300 * time.Millisecond):
		}

		px.Cut() // A pauses
		paused := time.Now()
		select {
		case err := <-locked:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("B did not get the lock 30s after A's keepalives stopped (TTL 2s)")
		}
		t.Logf("B locked %v after A paused", time.Since(paused).Round(time.Millisecond))
		tokenB := b.Token()
		require.Greater(t, tokenB, tokenA)
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenB, put(ctx, name, "B", tokenB)))

		// A resumes: its late write is refused, through Do and through
		// Fence in a transaction of its own.
		err = etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A, late", tokenA))
		require.ErrorIs(t, err, etcdlocksql.ErrStaleToken)
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.ErrorIs(t, etcdlocksql.Fence(ctx, tx, name, tokenA), etcdlocksql.ErrStaleToken)
		require.NoError(t, tx.Rollback())
		require.Equal(t, "B", value(t, db, name))
		require.Equal(t, tokenB, fenced(t, db, name))

		// B goes on writing with its token.
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenB, put(ctx, name, "B again", tokenB)))
		require.Equal(t, "B again", value(t, db, name))
		require.NoError(t, b.Unlock(context.WithoutCancel(ctx)))
	})
}

// TestResumedHolderIsFenced: a process that restarts and adopts its
// predecessor's lease (WithLease) holds the lock again, but as a new hold
// with a larger token (issue 38). The predecessor's late write, with the
// old token, is refused once the new hold has written. Before, the new
// hold took over the old key and its token, and equal tokens pass.
func TestResumedHolderIsFenced(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		name := "fence/" + t.Name()
		cli := cluster.Client(t)

		old, err := etcdlock.NewSession(ctx, cli)
		require.NoError(t, err)
		a := etcdlock.NewMutex(old, name)
		require.NoError(t, a.Lock(ctx))
		tokenA := a.Token()
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A", tokenA)))
		old.Orphan() // the process dies; its successor adopts the lease

		s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithLease(old.Lease()))
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		b := etcdlock.NewMutex(s, name)
		require.NoError(t, b.Lock(ctx))
		require.Greater(t, b.Token(), tokenA)
		require.NoError(t, etcdlocksql.Do(ctx, db, name, b.Token(), put(ctx, name, "B", b.Token())))

		err = etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A late", tokenA))
		require.ErrorIs(t, err, etcdlocksql.ErrStaleToken)
		require.Equal(t, "B", value(t, db, name))
	})
}

// TestEvictedHolderIsFenced (issue 40): an operator breaks a wedged
// holder's hold (etcdlock.Evict, as 'etcdlock break' does); the next in
// line holds and writes; the evicted holder, which nobody stopped, writes
// late with its old token, and the database refuses it.
func TestEvictedHolderIsFenced(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		name := "fence/" + t.Name()
		cli := cluster.Client(t)
		as, err := etcdlock.NewSession(ctx, cli)
		require.NoError(t, err)
		t.Cleanup(func() { as.Close() })
		a := etcdlock.NewMutex(as, name)
		require.NoError(t, a.Lock(ctx))
		tokenA := a.Token()
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A", tokenA)))

		bs, err := etcdlock.NewSession(ctx, cli)
		require.NoError(t, err)
		t.Cleanup(func() { bs.Close() })
		b := etcdlock.NewMutex(bs, name)
		locked := make(chan error, 1)
		go func() { locked <- b.Lock(ctx) }()

		q, err := etcdlock.InspectLock(ctx, cli, name)
		require.NoError(t, err)
		require.Equal(t, tokenA, q.Holders()[0].Token)
		require.NoError(t, etcdlock.Evict(ctx, cli, name, q.Holders()[0].Key, tokenA))
		select {
		case err := <-locked:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("B did not get the lock 30s after A's hold was evicted")
		}
		tokenB := b.Token()
		require.Greater(t, tokenB, tokenA)
		require.NoError(t, etcdlocksql.Do(ctx, db, name, tokenB, put(ctx, name, "B", tokenB)))

		// A, wedged until now, sends the write it was in the middle of.
		err = etcdlocksql.Do(ctx, db, name, tokenA, put(ctx, name, "A, late", tokenA))
		require.ErrorIs(t, err, etcdlocksql.ErrStaleToken)
		require.Equal(t, "B", value(t, db, name))
		require.NoError(t, b.Unlock(ctx))
	})
}
