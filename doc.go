// Package etcdlock provides fair distributed mutexes on etcd v3.
//
// A Session holds a lease that the process keeps alive. A Mutex taken
// through the session puts the key name/<lease ID in hex> bound to that
// lease (the layout of etcd's concurrency.Mutex and `etcdctl lock`, so the
// two interoperate on one name).
//
// Fair means first come, first served: the key with the oldest create
// revision holds the lock, and the others get it in the order their keys
// were created. Each waiter watches only the key just ahead of it, so a
// release wakes exactly one waiter.
//
// A lock ends when it is unlocked or when its session's lease ends: Close
// revokes it, and a process that dies, pauses or loses etcd stops renewing
// it, so its locks pass to the next waiter TTL later. The session counts the
// lease's life from when each renewal was sent and ends itself (Done is
// closed) before etcd can expire the lease, so the holder is told before
// anyone else can acquire.
//
// A distributed lock alone is not mutual exclusion: a holder paused past its
// TTL can still run while another holds the lock. Make writes conditional:
// in etcd with Txn().If(m.IsOwner()), elsewhere with the fencing token
// m.Token(), which strictly increases from one holder to the next.
package etcdlock
