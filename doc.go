// Package etcdlock provides fair distributed locks on etcd v3: a Mutex, an
// RWMutex and a weighted Semaphore, all on one queue, and a leader
// Election on the same queue whose leader publishes a value (observed
// without a lease by ObserveLeader and CurrentLeader).
//
// A Session holds a lease that the process keeps alive. A lock taken
// through the session puts the key name/<lease ID in hex> bound to that
// lease (the layout of etcd's concurrency.Mutex and `etcdctl lock`, so the
// two interoperate on one name); the key's value says what it asks for:
// empty for exclusive (a Mutex, an RWMutex's write lock), a header for a
// read lock or for Semaphore permits (see ParseKeyMode).
//
// Fair means first come, first served: keys are admitted in the order they
// were created (their create revision), and the holders are always the
// oldest keys. A Mutex or a writer holds when nothing is ahead of it, a
// reader when only readers are, permits when the permits ahead plus its
// own fit the capacity. Each waiter watches only the keys whose deletion
// can let it in: for a Mutex the key just ahead, so a release wakes
// exactly one waiter.
//
// A lock ends when it is released or when its session's lease ends: Close
// revokes it, and a process that dies, pauses or loses etcd stops renewing
// it, so its locks pass to the next waiter TTL later. The session counts the
// lease's life from when each renewal was sent and ends itself (Done is
// closed) before etcd can expire the lease, so the holder is told before
// anyone else can acquire.
//
// A distributed lock alone is not mutual exclusion: a holder paused past its
// TTL can still run while another holds the lock. Make writes conditional:
// in etcd with Txn().If(m.IsOwner()), elsewhere with the fencing token
// m.Token(): a hold admitted after one that excludes it has a larger token.
//
// # Which primitive
//
//   - One holder at a time (a job, a migration, a file): Mutex. Lock waits
//     in line, TryLock does not wait, Do runs a function under the lock
//     with a context cancelled the moment the lock is lost.
//   - Many readers or one writer: RWMutex. A reader waits behind a writer
//     that waits, so writers do not starve; Downgrade turns the write lock
//     into a read lock without leaving the line.
//   - At most a number of units in use across processes (connections,
//     uploads, licences): Semaphore, with a capacity and a weight per
//     Acquire, admitted strictly in order.
//   - One primary that others can find, with a value such as its address:
//     Election (Campaign, Proclaim, Resign). To follow it without taking
//     part, and without a lease: ObserveLeader and CurrentLeader.
//   - Run a function only while this instance is the primary, and campaign
//     again after a loss: Lead. Its function's context carries the Term
//     that fences its writes (TermFromContext).
//   - Who holds a lock and who waits: InspectLock for one lock, ListLocks
//     for every lock under a prefix; they need no Session and write
//     nothing. WithIdentity records who a holder is.
//   - Metrics and logs: WithHooks (the module etcdlockprom turns them into
//     Prometheus metrics) and WithLogger.
//
// Every lock and candidacy goes through a Session: one lease, one hold per
// name at a time. Use a Session per concurrent holder of one name, and one
// Session for all the different names a process locks. WithTTL sets how
// long a process that dies keeps its locks, and its place in their queues:
// the repository's docs/operations.md says how to choose it.
package etcdlock
