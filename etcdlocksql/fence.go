package etcdlocksql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Table is the fence table's name.
const Table = "etcdlock_fence"

// Schema is the fence table's definition, valid on PostgreSQL and SQLite,
// for schema migration tools; CreateTable runs it.
const Schema = `CREATE TABLE IF NOT EXISTS etcdlock_fence (
	resource TEXT PRIMARY KEY,
	token BIGINT NOT NULL
)`

// fenceStmt advances a resource's token, or changes nothing when the row
// holds a higher one. $1 and $2 are PostgreSQL's placeholders; SQLite
// reads them as the parameters named "$1" and "$2", numbered in the order
// they first appear, which database/sql's arguments bind by position.
const fenceStmt = `INSERT INTO etcdlock_fence (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token
WHERE etcdlock_fence.token <= excluded.token`

// currentStmt reads a resource's token, for the message of a refusal.
const currentStmt = `SELECT token FROM etcdlock_fence WHERE resource = $1`

// Sentinel errors. Match them with errors.Is: they are wrapped with the
// resource and the tokens.
var (
	// ErrStaleToken is returned by Fence and Do when a holder with a
	// higher token has written to the resource: the caller no longer
	// holds the lock, and its transaction is (Do) or must be rolled back.
	ErrStaleToken = errors.New("etcdlocksql: stale fencing token")
	// ErrInvalidToken is returned for a token below 1, which no hold has:
	// etcd's revisions start at 1.
	ErrInvalidToken = errors.New("etcdlocksql: invalid fencing token")
)

func invalidToken(resource string, token int64) error {
	return fmt.Errorf("%w: %d for resource %q: a hold's token is at least 1", ErrInvalidToken, token, resource)
}

// CreateTable creates the fence table if it does not exist.
func CreateTable(ctx context.Context, db *sql.DB) error {
	if _, err := db.ExecContext(ctx, Schema); err != nil {
		return fmt.Errorf("etcdlocksql: creating table %s: %w", Table, err)
	}
	return nil
}

// Fence records in tx that token has written to resource, or returns an
// error wrapping ErrStaleToken if a higher token has (tx must then be
// rolled back). A token equal to the recorded one passes: the same holder
// writes several times. Call it first in tx, before the writes it guards:
// until tx ends, it holds the resource's fence row, and a fence of the same
// resource in another transaction waits for it (see the package comment
// for the isolation level). A token below 1 returns ErrInvalidToken. On
// failure the fence row is unchanged.
func Fence(ctx context.Context, tx *sql.Tx, resource string, token int64) error {
	if token < 1 {
		return invalidToken(resource, token)
	}
	res, err := tx.ExecContext(ctx, fenceStmt, resource, token)
	if err != nil {
		return fmt.Errorf("etcdlocksql: fencing resource %q with token %d: %w", resource, token, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("etcdlocksql: fencing resource %q with token %d: %w", resource, token, err)
	}
	if n > 0 {
		return nil
	}
	// Refused. Name the token that wrote, when it can be read: the row
	// exists (an insert would have counted) and only grows.
	var current int64
	if err := tx.QueryRowContext(ctx, currentStmt, resource).Scan(&current); err != nil {
		return fmt.Errorf("%w: resource %q, token %d: a holder with a newer token has written", ErrStaleToken, resource, token)
	}
	return fmt.Errorf("%w: resource %q, token %d: a holder with the newer token %d has written", ErrStaleToken, resource, token, current)
}

// Do runs fn in a transaction of db that Fence guards: it begins the
// transaction (with the database's default isolation level), fences
// resource with token, runs fn, and commits. If the fence, fn or the
// commit fails, Do rolls the transaction back and returns the error, and
// neither the fence row nor fn's writes change; a stale token returns an
// error wrapping ErrStaleToken without running fn. fn must use tx for the
// writes to be guarded, and must not commit or roll it back.
func Do(ctx context.Context, db *sql.DB, resource string, token int64, fn func(tx *sql.Tx) error) error {
	if token < 1 { // before a transaction is begun for nothing
		return invalidToken(resource, token)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("etcdlocksql: beginning a transaction: %w", err)
	}
	if err := Fence(ctx, tx, resource, token); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("etcdlocksql: committing resource %q with token %d: %w", resource, token, err)
	}
	return nil
}
