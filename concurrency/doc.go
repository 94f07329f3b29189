// Package concurrency is etcd's client/v3/concurrency package, name for
// name and signature for signature (etcd v3.7.3), on etcdlock's queue:
// code written for etcd's package moves over by changing one import line,
//
//	"go.etcd.io/etcd/client/v3/concurrency" -> "github.com/etcdlock/etcdlock/concurrency"
//
// and keeps its keys and values: name/<lease ID in hex>, so processes on
// etcd's package, on this one, on etcdlock's own API and `etcdctl lock`
// queue together on one name during a rolling migration. etcd's own
// integration tests of the package run against it (the repository's
// testdata/etcdtests).
//
// Underneath is etcdlock's queue: first come, first served, each waiter
// woken only by the key just ahead of it; a TryLock on a held lock costs
// one read-only RPC and writes nothing; Unlock and Resign delete a key only
// while its create revision is the hold's, so a retry never deletes a
// newer hold's key (etcd issue 22082); a Lock or Campaign whose lease ends
// while it waits returns ErrSessionExpired at once, where etcd's waits and
// may return nil holding nothing (etcd issue 19597); Lock and Campaign ride
// out leader elections and broken watches; Observe rides out compactions.
//
// Where etcd's behaviour is not a bug, this package keeps it, even where
// etcdlock's own API differs: two Mutexes (or Elections) of one Session on
// one name share one hold, as they share one key in etcd (etcd issues
// 11360 and 12017 ask otherwise; etcdlock.Mutex values exclude each
// other), and a Session made WithLease on a lease that a Session of this
// process keeps alive shares it. The other differences: an orphaned
// Session takes no new locks (etcd's takes them on a lease no one renews);
// Unlock of a lock that was lost returns nil, as etcd's does, and
// Etcdlock's Err says what happened; a process that restarts WithLease and
// finds its old key takes it as a new hold (see WithLease); an Observe
// response's header carries only its revision. The repository's
// docs/migration.md says more.
//
// Session, Mutex and Election have an Etcdlock method: the etcdlock value
// underneath, for what etcd's API has no words for (fencing tokens, Done
// and Err of a hold, release requests). The STM is etcd's own.
package concurrency
