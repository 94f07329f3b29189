package etcdlocksql_test

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/etcdlock/etcdlock/etcdlocksql"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	_ "modernc.org/sqlite" // the "sqlite" driver
)

// The PostgreSQL server of the tests, started by TestMain from Debian's
// postgresql package (or the binaries in $ETCDLOCK_TEST_POSTGRES_BIN) in a
// temporary directory, on a free loopback port, with its unix socket in
// that directory too. PostgreSQL refuses to run as root, so a test binary
// running as root (CI does) runs initdb and postgres as the user nobody,
// owner of the directory. Without binaries the PostgreSQL tests skip,
// unless $ETCDLOCK_TEST_REQUIRE_POSTGRES is set (CI sets it): then the test
// binary fails.
const (
	postgresBinEnv     = "ETCDLOCK_TEST_POSTGRES_BIN"
	requirePostgresEnv = "ETCDLOCK_TEST_REQUIRE_POSTGRES"
)

var (
	// cluster is a one-member etcd started by TestMain.
	cluster *etcdtest.Cluster
	// postgres is the PostgreSQL server started by TestMain, nil if none
	// is installed; noPostgres then says why.
	postgres   *pgServer
	noPostgres string
	// pgAdmin is postgres's own database, where each test creates its own.
	pgAdmin *sql.DB
)

func TestMain(m *testing.M) {
	// database/sql's goroutines, like every session's, must have ended
	// with their handles (RunMain checks).
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return runWithPostgres(m)
	}))
}

// runWithPostgres starts PostgreSQL, if installed, runs the tests, and
// stops it.
func runWithPostgres(m *testing.M) int {
	var err error
	postgres, noPostgres, err = startPostgres()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdlocksql: starting PostgreSQL:", err)
		return 1
	}
	if postgres == nil {
		if os.Getenv(requirePostgresEnv) != "" {
			fmt.Fprintf(os.Stderr, "etcdlocksql: %s is set, but %s\n", requirePostgresEnv, noPostgres)
			return 1
		}
		return m.Run()
	}
	defer postgres.stop()
	if pgAdmin, err = sql.Open("pgx", postgres.dsn("postgres")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pgAdmin.Close()
	return m.Run()
}

// A database is one of the databases the tests run against.
type database struct {
	name string
	// open returns a handle of a new, empty database with the fence
	// table, closed at the end of the test.
	open func(t *testing.T) *sql.DB
}

var databases = []database{
	{"postgres", openPostgres},
	{"sqlite", openSQLite},
	{"sqlite-rollback-journal", openSQLiteJournal},
}

// forEachDatabase runs f as a subtest on each database.
func forEachDatabase(t *testing.T, f func(t *testing.T, db *sql.DB)) {
	t.Helper()
	for _, d := range databases {
		t.Run(d.name, func(t *testing.T) { f(t, d.open(t)) })
	}
}

var pgDatabases atomic.Int64

// openPostgres creates a database on the test server for t.
func openPostgres(t *testing.T) *sql.DB {
	t.Helper()
	if postgres == nil {
		t.Skip(noPostgres)
	}
	name := fmt.Sprintf("test%d", pgDatabases.Add(1))
	_, err := pgAdmin.ExecContext(t.Context(), "CREATE DATABASE "+name)
	if err != nil {
		t.Fatalf("creating database %s: %v", name, err)
	}
	return openDB(t, "pgx", postgres.dsn(name))
}

// sqliteDSN returns the data source name of an SQLite file in dir, with a
// busy timeout so that writers wait for each other instead of failing.
func sqliteDSN(dir string) string {
	return "file:" + filepath.Join(dir, "test.db") + "?_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)"
}

// openSQLite creates an SQLite file for t: a file, not :memory:, so that
// the handle's connections share it.
func openSQLite(t *testing.T) *sql.DB {
	t.Helper()
	return openDB(t, "sqlite", sqliteDSN(t.TempDir()))
}

// openSQLiteJournal is openSQLite in SQLite's default journal mode, a
// rollback journal: WAL lets readers run beside the writer, but fencing
// does not need it.
func openSQLiteJournal(t *testing.T) *sql.DB {
	t.Helper()
	return openDB(t, "sqlite", "file:"+filepath.Join(t.TempDir(), "test.db")+"?_pragma=busy_timeout(20000)")
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := etcdlocksql.CreateTable(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db
}
