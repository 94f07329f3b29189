// Package etcdlocksql makes a SQL database refuse the writes of a lock
// holder that is no longer the holder: a write commits only if the
// holder's fencing token is at least the highest token any holder has
// written with for that resource, checked in the transaction of the write.
//
// A distributed lock alone is not mutual exclusion. A holder that pauses
// (a GC pause, a stopped VM, a slow disk) or is cut off past its lease's
// TTL loses the lock without knowing it, the next holder takes it, and the
// first one's writes, issued before it could notice, still land. Chubby
// calls the fix a sequencer, Kleppmann a fencing token: every hold carries
// a number that grows from one holder to the next (etcdlock's
// Mutex.Token, the create revision of the holder's key; the etcdlock
// command gives it to CMD as ETCDLOCK_TOKEN), and the storage remembers
// the highest it has seen and refuses anything lower. This package is that
// check for PostgreSQL and SQLite, in database/sql terms; it imports no
// driver.
//
// # The fence table
//
// A table, etcdlock_fence (see Schema and CreateTable), keeps a row per
// resource: the highest token that wrote to it. A resource is any name the
// holders agree on, usually the lock's name. Fence runs one statement,
//
//	INSERT INTO etcdlock_fence (resource, token) VALUES ($1, $2)
//	ON CONFLICT (resource) DO UPDATE SET token = excluded.token
//	WHERE etcdlock_fence.token <= excluded.token
//
// and reports ErrStaleToken when it changed no row: a holder with a higher
// token wrote first. The token only moves up, so a holder that wrote goes
// on writing with the same token (equal tokens pass), and every write of an
// older holder after that is refused. Do wraps it: it begins a
// transaction, fences, runs the caller's writes, and commits; anything
// that fails rolls the whole transaction back, the fence row included.
//
// Fence a resource with the tokens of an exclusive lock (a Mutex, a
// MultiMutex for each of its names, an Election, a Lead term, an
// RWMutex's writers): holders that hold at once, such as a Semaphore's
// or an RWMutex's readers, have tokens of their own, and each write of
// the newest would refuse those of the others.
//
// The guarantee covers the writes made in a fenced transaction, and only
// against other fenced transactions of the same resource: a write that
// does not fence, or fences another resource name, is not ordered by it.
// Fence first: the fence row's lock then orders whole transactions, and a
// transaction that would be refused has not yet touched anything else.
//
// # Isolation
//
// On PostgreSQL, READ COMMITTED (the default, and what Do asks for by
// passing no options) is enough. INSERT ... ON CONFLICT DO UPDATE locks the
// resource's row and evaluates its WHERE against the newest committed
// version of the row; a transaction that finds the row locked by another
// fence waits for that transaction to end and then checks the version it
// committed. So two fenced transactions of one resource never run side by
// side: the second fences only after the first committed (or rolled back),
// and if the first had a higher token the second is refused. Each fenced
// transaction thus commits entirely before the next fence of its resource
// passes, in non-decreasing token order. Under REPEATABLE READ or
// SERIALIZABLE the order holds too, but a fence that waited on a newer
// holder's transaction fails with a serialization error (SQLSTATE 40001)
// instead of ErrStaleToken; retried, it gets ErrStaleToken.
//
// On SQLite, a transaction that writes holds the database's write lock
// until it ends, so fenced transactions (and all other writes) run one at
// a time. database/sql's BEGIN is SQLite's default, DEFERRED, which takes
// no lock; the fence, a write, is the transaction's first statement and
// takes the write lock at once, so no transaction ever holds a read
// snapshot that it must upgrade (the upgrade SQLite refuses with
// SQLITE_BUSY without waiting). A connection that finds the write lock
// taken fails at once with SQLITE_BUSY ("database is locked") unless it
// has a busy timeout: open the database with one (modernc.org/sqlite:
// "file:app.db?_pragma=busy_timeout(10000)"), so that a writer waits for
// the one ahead instead of failing. WAL mode is not needed, but lets
// readers run beside the writer.
//
// # With the etcdlock command
//
// etcdlock run gives CMD its token in ETCDLOCK_TOKEN; a psql script can
// fence and write in one transaction with it (see docs/design.md,
// "Fencing at the storage").
package etcdlocksql
