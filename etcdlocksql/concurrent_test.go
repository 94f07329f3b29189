package etcdlocksql_test

import (
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/etcdlocksql"
	"github.com/stretchr/testify/require"
)

// TestConcurrentWritersNeverGoBack: writers with the tokens 1 to n,
// racing in waves, write one row side by side, each through Do: it reads the
// row's token, pauses a little, writes its own, and appends (previous
// token, its token) to a log, all in its transaction. Whatever the
// interleaving, the committed writes form one chain: sorted by token, each
// read the token of the one before it (no write was lost, none ran beside
// another), the log's order is the tokens' order (none with a lower token
// committed after a higher one), the row ends with the highest committed
// token, which is the fence's, and every refused writer was below a
// committed one. On PostgreSQL this runs at READ COMMITTED, the default.
func TestConcurrentWritersNeverGoBack(t *testing.T) {
	const n, wave = 64, 8
	forEachDatabase(t, func(t *testing.T, db *sql.DB) {
		ctx := t.Context()
		db.SetMaxOpenConns(n)
		for _, ddl := range []string{
			"CREATE TABLE counter (id INTEGER PRIMARY KEY, token BIGINT NOT NULL)",
			"INSERT INTO counter (id, token) VALUES (1, 0)",
			// seq is the commit order: each writer takes the next number
			// in its transaction, which is valid only if they run one at
			// a time (a duplicate would fail on the primary key).
			"CREATE TABLE log (seq BIGINT PRIMARY KEY, prev BIGINT NOT NULL, token BIGINT NOT NULL)",
		} {
			_, err := db.ExecContext(ctx, ddl)
			require.NoError(t, err)
		}
		// PostgreSQL's default isolation level, which Do leaves alone, is
		// the one the package comment says is enough.
		var level string
		if db.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&level) == nil {
			require.Equal(t, "read committed", level)
		}

		// In waves: the tokens 1 to 8 race each other, started at once
		// in a shuffled order, then 9 to 16 once those have ended, and
		// so on. All 64 at once, the highest token would win early and
		// refuse nearly everyone; writers started a millisecond apart
		// did, on a busy machine, which runs them in bursts. In waves,
		// the first writer of each wave to commit is above every earlier
		// wave's, so at least 8 commit however the machine schedules
		// them, and within a wave the ones below a committed token are
		// refused.
		write := func(token int64) error {
			return etcdlocksql.Do(ctx, db, "counter", token, func(tx *sql.Tx) error {
				var prev int64
				if err := tx.QueryRowContext(ctx, "SELECT token FROM counter WHERE id = 1").Scan(&prev); err != nil {
					return err
				}
				time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond)
				if _, err := tx.ExecContext(ctx, "UPDATE counter SET token = $1 WHERE id = 1", token); err != nil {
					return err
				}
				_, err := tx.ExecContext(ctx, "INSERT INTO log (seq, prev, token) SELECT COALESCE(MAX(seq), 0) + 1, $1, $2 FROM log", prev, token)
				return err
			})
		}
		tokens := make([]int64, n)
		for i := range tokens {
			tokens[i] = int64(i + 1)
		}
		errs := make([]error, n)
		for b := 0; b < n; b += wave {
			run := tokens[b:min(b+wave, n)]
			rand.Shuffle(len(run), func(i, j int) { run[i], run[j] = run[j], run[i] })
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i, token := range run {
				wg.Go(func() {
					<-start
					errs[b+i] = write(token)
				})
			}
			close(start)
			wg.Wait()
		}

		var committed, refused []int64
		for i, err := range errs {
			switch {
			case err == nil:
				committed = append(committed, tokens[i])
			case errors.Is(err, etcdlocksql.ErrStaleToken):
				refused = append(refused, tokens[i])
			default:
				t.Fatalf("token %d: %v", tokens[i], err)
			}
		}
		t.Logf("%d committed, %d refused", len(committed), len(refused))
		require.NotEmpty(t, refused, "no writer was refused: the test did not contend")
		require.Greater(t, len(committed), 2, "too few writers committed for a chain")
		slices.Sort(committed)

		type entry struct{ prev, token int64 }
		var log []entry
		rows, err := db.QueryContext(ctx, "SELECT prev, token FROM log ORDER BY seq")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var e entry
			require.NoError(t, rows.Scan(&e.prev, &e.token))
			log = append(log, e)
		}
		require.NoError(t, rows.Err())

		var want []entry
		prev := int64(0)
		for _, c := range committed {
			want = append(want, entry{prev, c})
			prev = c
		}
		require.Equal(t, want, log, "the committed writes, in commit order")

		highest := committed[len(committed)-1]
		var row int64
		require.NoError(t, db.QueryRowContext(ctx, "SELECT token FROM counter WHERE id = 1").Scan(&row))
		require.Equal(t, highest, row)
		require.Equal(t, highest, fenced(t, db, "counter"))
		for _, r := range refused {
			require.Less(t, r, highest, "token %d was refused, but no higher token committed", r)
		}
	})
}
