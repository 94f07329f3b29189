package etcdlocksql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlocksql"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Write under a lock so that the database refuses a holder that lost it:
// every write goes through Do with the hold's token, and a write with an
// older token than one that already wrote is refused.
func ExampleDo() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// SQLite, with a busy timeout: writers wait for each other.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := etcdlocksql.CreateTable(ctx, db); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE report (id INTEGER PRIMARY KEY, body TEXT)"); err != nil {
		log.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cluster.Endpoints()})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	s, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	// write stores the report with the token of the hold it is made under.
	write := func(token int64, body string) error {
		return etcdlocksql.Do(ctx, db, "reports/daily", token, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO report (id, body) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET body = excluded.body", body)
			return err
		})
	}

	first := etcdlock.NewMutex(s, "reports/daily")
	if err := first.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	old := first.Token()
	fmt.Println("first holder writes:", write(old, "draft"))
	if err := first.Unlock(ctx); err != nil {
		log.Fatal(err)
	}

	next := etcdlock.NewMutex(s, "reports/daily")
	if err := next.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	defer next.Unlock(ctx)
	fmt.Println("next holder writes:", write(next.Token(), "final"))

	// A write of the first hold that arrives late, as it would after a
	// pause past the lease's TTL, is refused.
	err = write(old, "draft, late")
	fmt.Println("late write refused:", errors.Is(err, etcdlocksql.ErrStaleToken))
	var body string
	if err := db.QueryRowContext(ctx, "SELECT body FROM report WHERE id = 1").Scan(&body); err != nil {
		log.Fatal(err)
	}
	fmt.Println("report:", body)
	// Output:
	// first holder writes: <nil>
	// next holder writes: <nil>
	// late write refused: true
	// report: final
}
