package etcdlocksql_test

import (
	"bytes"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock/etcdlocksql"
	"github.com/stretchr/testify/require"
)

// psqlCommand is the command of docs/design.md's psql pattern: what
// etcdlock run runs as CMD, in the directory of report.sql.
const psqlCommand = `psql -X -q -1 -v ON_ERROR_STOP=1 -v token="$ETCDLOCK_TOKEN" -f report.sql`

// TestDocsPsqlPattern runs the shell pattern of docs/design.md ("Fencing
// at the storage") as etcdlock run would run it, with ETCDLOCK_TOKEN set:
// the script fences and writes in one transaction, and a stale token
// makes psql fail without writing. The page must show the command and
// the script as they are here.
func TestDocsPsqlPattern(t *testing.T) {
	page, err := os.ReadFile("../docs/design.md")
	require.NoError(t, err)
	script, err := os.ReadFile("testdata/report.sql")
	require.NoError(t, err)
	require.Contains(t, string(page), "etcdlock run reports -- sh -c '"+psqlCommand+"'", "docs/design.md: the psql pattern's command")
	require.Contains(t, string(page), "```sql\n"+string(script)+"```\n", "docs/design.md: the psql pattern's script, testdata/report.sql")

	db := openPostgres(t)
	ctx := t.Context()
	_, err = db.ExecContext(ctx, "CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT NOT NULL, token BIGINT NOT NULL)")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, "INSERT INTO report VALUES (1, 'none', 0)")
	require.NoError(t, err)
	var dbname string
	require.NoError(t, db.QueryRowContext(ctx, "SELECT current_database()").Scan(&dbname))

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "report.sql"), script, 0o644))
	runCMD := func(token int64) (string, error) {
		cmd := exec.CommandContext(ctx, "sh", "-c", psqlCommand)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(),
			"PATH="+postgres.bin+string(os.PathListSeparator)+os.Getenv("PATH"),
			"PGHOST=127.0.0.1", "PGPORT="+strconv.Itoa(postgres.port), "PGUSER=postgres", "PGDATABASE="+dbname,
			"ETCDLOCK_TOKEN="+strconv.FormatInt(token, 10))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	report := func() (string, int64) {
		t.Helper()
		var body string
		var token int64
		require.NoError(t, db.QueryRowContext(ctx, "SELECT body, token FROM report WHERE id = 1").Scan(&body, &token))
		return body, token
	}

	out, err := runCMD(5)
	require.NoError(t, err, "%s", out)
	require.Empty(t, out)
	body, token := report()
	require.Equal(t, "from psql", body)
	require.Equal(t, int64(5), token)
	require.Equal(t, int64(5), fenced(t, db, "reports"))

	// A newer holder writes from Go; the script with the old token fails
	// and writes nothing.
	require.NoError(t, etcdlocksql.Do(ctx, db, "reports", 7, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE report SET body = 'from Go', token = 7 WHERE id = 1")
		return err
	}))
	out, err = runCMD(5)
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "psql with a stale token: %v\n%s", err, out)
	require.Equal(t, 3, exit.ExitCode(), "psql: an error in the script, with ON_ERROR_STOP")
	require.True(t, strings.Contains(out, "no rows returned for \\gset"), "%s", out)
	body, token = report()
	require.Equal(t, "from Go", body)
	require.Equal(t, int64(7), token)
	require.Equal(t, int64(7), fenced(t, db, "reports"))
}
