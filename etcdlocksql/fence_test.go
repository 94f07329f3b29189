package etcdlocksql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/etcdlocksql"
	"github.com/stretchr/testify/require"
)

// fenced returns the token recorded for resource, 0 if none.
func fenced(t *testing.T, db *sql.DB, resource string) int64 {
	t.Helper()
	var token int64
	err := db.QueryRowContext(t.Context(), "SELECT token FROM etcdlock_fence WHERE resource = $1", resource).Scan(&token)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return token
}

// createValues makes the table the tests write through Do: a row per
// resource, with the value and the token of its last write.
func createValues(t *testing.T, db *sql.DB) {
	t.Helper()
	_, err := db.ExecContext(t.Context(), "CREATE TABLE vals (resource TEXT PRIMARY KEY, val TEXT NOT NULL, token BIGINT NOT NULL)")
	require.NoError(t, err)
}

// put returns a Do function that writes val for resource with token.
func put(ctx context.Context, resource, val string, token int64) func(*sql.Tx) error {
	return func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO vals (resource, val, token) VALUES ($1, $2, $3)
			ON CONFLICT (resource) DO UPDATE SET val = excluded.val, token = excluded.token`, resource, val, token)
		return err
	}
}

// value returns resource's value in vals, "" if none.
func value(t *testing.T, db *sql.DB, resource string) string {
	t.Helper()
	var v string
	err := db.QueryRowContext(t.Context(), "SELECT val FROM vals WHERE resource = $1", resource).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return v
}

// TestDoRefusesLowerToken: a token passes while it is at least the highest
// that wrote (equal ones too: one holder writes several times), a lower
// one is refused without running fn, with a message that names the
// resource and both tokens, and each resource has its own fence.
func TestDoRefusesLowerToken(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		require.NoError(t, etcdlocksql.Do(ctx, db, "jobs/a", 5, put(ctx, "jobs/a", "first", 5)))
		require.Equal(t, int64(5), fenced(t, db, "jobs/a"))
		require.NoError(t, etcdlocksql.Do(ctx, db, "jobs/a", 5, put(ctx, "jobs/a", "again", 5)), "the same token writes again")
		require.Equal(t, "again", value(t, db, "jobs/a"))

		ran := false
		err := etcdlocksql.Do(ctx, db, "jobs/a", 4, func(tx *sql.Tx) error { ran = true; return nil })
		require.ErrorIs(t, err, etcdlocksql.ErrStaleToken)
		require.EqualError(t, err, `etcdlocksql: stale fencing token: resource "jobs/a", token 4: a holder with the newer token 5 has written`)
		require.False(t, ran, "fn ran after a refused fence")
		require.Equal(t, int64(5), fenced(t, db, "jobs/a"))
		require.Equal(t, "again", value(t, db, "jobs/a"))

		require.NoError(t, etcdlocksql.Do(ctx, db, "jobs/a", 9, put(ctx, "jobs/a", "newer", 9)))
		require.Equal(t, int64(9), fenced(t, db, "jobs/a"))
		require.ErrorIs(t, etcdlocksql.Do(ctx, db, "jobs/a", 5, put(ctx, "jobs/a", "late", 5)), etcdlocksql.ErrStaleToken)
		require.Equal(t, "newer", value(t, db, "jobs/a"))

		// Another resource: its own row, its own tokens. The row holds
		// exactly the arguments, in their places (SQLite binds $1 and $2
		// by position too).
		require.NoError(t, etcdlocksql.Do(ctx, db, "jobs/b", 1, put(ctx, "jobs/b", "b", 1)))
		var rows []string
		r, err := db.QueryContext(ctx, "SELECT resource, token FROM etcdlock_fence ORDER BY resource")
		require.NoError(t, err)
		defer r.Close()
		for r.Next() {
			var res string
			var tok int64
			require.NoError(t, r.Scan(&res, &tok))
			rows = append(rows, fmt.Sprintf("%s=%d", res, tok))
		}
		require.NoError(t, r.Err())
		require.Equal(t, []string{"jobs/a=9", "jobs/b=1"}, rows)
	})
}

// TestInvalidToken: no hold has a token below 1; such a token is refused
// before anything is written, by Do and by Fence.
func TestInvalidToken(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		for _, token := range []int64{0, -1} {
			err := etcdlocksql.Do(ctx, db, "r", token, func(*sql.Tx) error { t.Error("fn ran"); return nil })
			require.ErrorIs(t, err, etcdlocksql.ErrInvalidToken)
			require.EqualError(t, err, fmt.Sprintf(`etcdlocksql: invalid fencing token: %d for resource "r": a hold's token is at least 1`, token))

			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.ErrorIs(t, etcdlocksql.Fence(ctx, tx, "r", token), etcdlocksql.ErrInvalidToken)
			require.NoError(t, tx.Commit())
		}
		require.Equal(t, int64(0), fenced(t, db, "r"))
	})
}

// TestDoRollsBack: when fn fails, neither its writes nor the fence row
// change, so a lower token than the failed one still writes.
func TestDoRollsBack(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		require.NoError(t, etcdlocksql.Do(ctx, db, "r", 3, put(ctx, "r", "three", 3)))
		boom := errors.New("boom")
		err := etcdlocksql.Do(ctx, db, "r", 7, func(tx *sql.Tx) error {
			require.NoError(t, put(ctx, "r", "seven", 7)(tx))
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Equal(t, int64(3), fenced(t, db, "r"))
		require.Equal(t, "three", value(t, db, "r"))
		require.NoError(t, etcdlocksql.Do(ctx, db, "r", 5, put(ctx, "r", "five", 5)))
		require.Equal(t, "five", value(t, db, "r"))
	})
}

// TestFenceInOwnTransaction: Fence in a transaction of the caller's
// refuses a stale token the same way, and the caller's rollback undoes the
// writes made before it.
func TestFenceInOwnTransaction(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		createValues(t, db)
		require.NoError(t, etcdlocksql.Do(ctx, db, "r", 10, put(ctx, "r", "ten", 10)))

		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		err = etcdlocksql.Fence(ctx, tx, "r", 8)
		require.ErrorIs(t, err, etcdlocksql.ErrStaleToken)
		require.Contains(t, err.Error(), "newer token 10")
		require.NoError(t, tx.Rollback())

		tx, err = db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, etcdlocksql.Fence(ctx, tx, "r", 11))
		require.NoError(t, put(ctx, "r", "eleven", 11)(tx))
		require.NoError(t, tx.Commit())
		require.Equal(t, int64(11), fenced(t, db, "r"))
		require.Equal(t, "eleven", value(t, db, "r"))
	})
}

// TestSQLiteBusyTimeout: SQLite lets one transaction write at a time. A
// fence that finds another transaction writing fails at once with
// SQLITE_BUSY on a connection without a busy timeout, and waits for it on
// one with a timeout, then checks the token it committed.
func TestSQLiteBusyTimeout(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	withTimeout := openDB(t, "sqlite", sqliteDSN(dir))
	without := openDB(t, "sqlite", "file:"+dir+"/test.db?_pragma=journal_mode(WAL)")
	createValues(t, withTimeout)

	// The first holder's transaction fences and holds the write lock
	// until release is closed.
	inside, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- etcdlocksql.Do(ctx, withTimeout, "r", 5, func(tx *sql.Tx) error {
			close(inside)
			<-release
			return put(ctx, "r", "five", 5)(tx)
		})
	}()
	<-inside

	err := etcdlocksql.Do(ctx, without, "r", 6, put(ctx, "r", "six", 6))
	require.ErrorContains(t, err, "database is locked", "a connection without a busy timeout")
	require.NotErrorIs(t, err, etcdlocksql.ErrStaleToken)

	stale := make(chan error, 1)
	go func() { stale <- etcdlocksql.Do(ctx, withTimeout, "r", 4, put(ctx, "r", "four", 4)) }()
	select {
	case err := <-stale:
		t.Fatalf("the second fence did not wait for the first transaction: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-first)
	require.ErrorIs(t, <-stale, etcdlocksql.ErrStaleToken, "the waiting fence checks the token committed meanwhile")
	require.Equal(t, "five", value(t, withTimeout, "r"))
}
