// Package etcdlockgocron runs the jobs of gocron v2 schedulers
// (github.com/go-co-op/gocron/v2) on several replicas at once without
// running a tick twice: a Locker makes each tick of a job run on one
// replica, an Elector makes one replica, the leader, run them all. It is
// a module of its own, so that the etcdlock library asks its users for
// no gocron.
//
// # Locker: each tick once
//
//	locker, err := etcdlockgocron.NewLocker(cli, 30*time.Second) // jobs every minute
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
// Every replica fires every tick, by its own clock; each asks the Locker
// for the job's lock, an etcdlock Mutex named after the job, with
// TryLock. The first to ask takes it and runs the tick; the others are
// refused (etcdlock.ErrLocked), and gocron skips the tick there. The lock
// stays taken for a minimum hold d after it was taken
// (etcdlock.WithMinHold), even when the run ends sooner, even when the
// replica crashes: a replica whose clock is behind, which fires the same
// tick later, still finds it taken. d is timed by the holder's monotonic
// clock, or by an etcd lease after a crash: no two machines' clocks are
// ever compared.
//
// So each tick runs exactly once when, with s the worst spread between
// the moments the replicas' attempts at one tick reach etcd (their
// clocks' skew, gocron's firing delay, etcd's latency), s < d (the last
// attempt still finds the lock taken) and d + s < the job's interval
// (the lock is free again when the next tick's first attempt comes).
// Half the interval tolerates a spread of up to half the interval: a
// job every minute, d = 30s, replicas whose clocks agree within a few
// seconds. With a spread over d a tick may run twice; with d over the
// interval less the spread, ticks are skipped. A run longer than d holds
// the lock until it ends: the ticks that fire meanwhile are skipped on
// every replica, so runs of a job never overlap.
//
// A replica that dies during a run (or is cut off, or closes its Locker
// without gocron's Unlock) leaves the lock to its lease: it passes on
// when the lease ends, at most the TTL later. If it died within d of
// taking the lock, the next attempt after that, whenever it comes, is
// refused and starts the rest of the minimum hold anew on an etcd lease,
// since etcd cannot tell how long ago the run began: the next tick after
// such an end may run nowhere. A run that outlives d drops that record
// then, so a replica that dies later costs no tick: keep d near the
// spread rather than the interval when runs are long.
//
// Lock never waits for the lock, and waits for etcd at most d: a tick
// whose attempt etcd has not answered by then is skipped, as a lock taken
// later might be taken after the hold of the replica that ran it had
// passed. (A write etcd applied but answered late holds the lock until
// its answer comes: the replica's session then removes its key.)
//
// Each lock records which replica took it and when, by its clock
// (WithIdentity; by default "HOST:PID"): `etcdlock status` and `etcdlock
// ls` show it. A skipped tick's error says which replica holds, or that
// the minimum hold of a run whose replica stopped keeps the tick out.
//
// # Elector: one leader runs everything
//
//	elector, err := etcdlockgocron.NewElector(cli, "billing/scheduler", hostname)
//	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
//
// Every replica campaigns in an etcdlock election (etcdlock.Lead); gocron
// asks IsLeader before each run, and it answers from the replica's own
// state, with no RPC. Only the leader runs ticks. Its leadership ends
// there before any other replica can win, and when it dies or is cut off
// the next in line wins once its lease runs out: within the session's
// TTL (etcdlock.WithTTL through WithSessionOptions; default 15s). Close
// resigns, and the next replica wins at once.
//
// Clocks matter only as the leadership moves: the last ticks the old
// leader ran, by its clock, a successor whose clock is behind fires
// again, by its own. So a replica that wins runs no tick for a takeover
// delay (WithTakeoverDelay, default 1s), which must be at least the
// worst skew between the replicas' clocks; then no tick runs twice. The
// ticks of the gap between two leaders, and of the delay, run nowhere:
// choose the TTL against the interval.
//
// # What neither does
//
// A lock or a leadership is not mutual exclusion by itself: a replica
// paused longer than its TTL (a stopped VM, a long GC) may still run a
// tick while another runs the next, and gocron does not tell a job that
// its lock was lost. A job that writes somewhere fences its writes: with
// an Elector, with Term's token or IsOwner (see etcdlock.Term). Both make
// their own etcdlock Sessions and a new one when one ends (a replica cut
// off longer than the TTL takes part again once etcd is back), and end
// them with Close, after the scheduler's Shutdown.
package etcdlockgocron
