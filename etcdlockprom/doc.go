// Package etcdlockprom turns the events of etcdlock's Hooks into Prometheus
// metrics. It is a module of its own, so that the etcdlock library asks
// its users for no Prometheus client.
//
//	m := etcdlockprom.New(etcdlockprom.Options{})
//	prometheus.MustRegister(m)
//	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(m.Hooks()))
//
// One Metrics may serve any number of sessions. The metrics, all in base
// units, with the labels kind (mutex, rwmutex_read, rwmutex_write,
// semaphore, election, multimutex, shard) and, with Options.LockNames, name:
//
//	etcdlock_acquire_duration_seconds{kind,outcome}   histogram: time from the start of an acquisition to its outcome (acquired, busy, canceled, session_ended, error)
//	etcdlock_waiters{kind}                            gauge: acquisitions under way in this process
//	etcdlock_holders{kind}                            gauge: holds of this process; for kind="election", the elections it leads
//	etcdlock_hold_duration_seconds{kind,end}          histogram: how long holds lasted, by how they ended (released, lease_ended, key_deleted, max_hold, session_closed, unknown)
//	etcdlock_lease_renewal_duration_seconds           histogram: round trip of the renewals that succeeded
//	etcdlock_lease_renewal_failures_total             counter: renewals that failed
//	etcdlock_sessions_ended_total{cause}              counter: sessions ended, by cause (closed, context_ended, client_closed, not_renewed, lease_gone)
//	etcdlock_locks_lost_total{kind,cause}             counter: holds lost, by cause (lease_ended, key_deleted, max_hold, session_closed, unknown)
//	etcdlock_oldest_hold_age_seconds{kind}            gauge: age of the oldest hold of this process not yet ended (0: none), computed when scraped
//
// The gauges (without LockNames), etcdlock_sessions_ended_total and
// etcdlock_locks_lost_total have a series for each kind and cause from
// the start, at zero: an alert on a loss fires on the first one. A hold
// that never ends (a stuck holder) shows in
// etcdlock_oldest_hold_age_seconds while it lasts, where the histograms
// see it only once it ends.
//
// Elections won are etcdlock_acquire_duration_seconds_count{kind="election",outcome="acquired"};
// lost, etcdlock_hold_duration_seconds_count{kind="election",end!="released"}.
//
// Lock names are left out by default: a program that names a lock per job
// or per user would make a series per name, without bound. With them, the
// gauges' series of a name are deleted once no waiter (holder) of it is
// left in this process, but the histograms keep a set of series for each
// name ever used: deleting those would drop observations not yet scraped.
package etcdlockprom
