// Package etcdlockotel turns the events of etcdlock's Hooks into
// OpenTelemetry metrics and spans. It is a module of its own, so that the
// etcdlock library asks its users for no OpenTelemetry packages.
//
//	t, err := etcdlockotel.New(etcdlockotel.Options{}) // the global MeterProvider and TracerProvider
//	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(t.Hooks()))
//
// One Telemetry may serve any number of sessions. Its instrumentation
// scope is the module's path, github.com/etcdlock/etcdlock/etcdlockotel.
//
// # Metrics
//
// The metrics of the Prometheus adapter (module
// github.com/etcdlock/etcdlock/etcdlockprom), with its names, meanings,
// descriptions and label names as attributes: kind (mutex, rwmutex_read,
// rwmutex_write, semaphore, election, multimutex, shard) and, with
// Options.LockNames, name:
//
//	etcdlock_acquire_duration_seconds{kind,outcome}   histogram, s: time from the start of an acquisition to its outcome (acquired, busy, canceled, session_ended, error)
//	etcdlock_waiters{kind}                            up-down counter, {acquisition}: acquisitions under way in this process
//	etcdlock_holders{kind}                            up-down counter, {hold}: holds of this process; for kind="election", the elections it leads
//	etcdlock_hold_duration_seconds{kind,end}          histogram, s: how long holds lasted, by how they ended (released, lease_ended, key_deleted, max_hold, session_closed, unknown)
//	etcdlock_lease_renewal_duration_seconds           histogram, s: round trip of the renewals that succeeded
//	etcdlock_lease_renewal_failures_total             counter, {renewal}: renewals that failed
//	etcdlock_sessions_ended_total{cause}              counter, {session}: sessions ended, by cause (closed, context_ended, client_closed, not_renewed, lease_gone)
//	etcdlock_locks_lost_total{kind,cause}             counter, {hold}: holds lost, by cause (lease_ended, key_deleted, max_hold, session_closed, unknown)
//	etcdlock_oldest_hold_age_seconds{kind}            gauge, s: age of the oldest hold of this process not yet ended (0: none)
//
// The names are in Prometheus's style, not OpenTelemetry's dotted one
// (etcdlock.acquire.duration), so that OpenTelemetry's Prometheus exporter
// (go.opentelemetry.io/otel/exporters/prometheus) writes them as the
// Prometheus adapter does, whatever its translation strategy. With
// suffixes (its default) it appends a unit's Prometheus name only when it
// is not already a word of the metric's name (s is "seconds"; a unit in
// braces, such as {hold}, is an annotation and adds nothing), and
// "_total" to a counter after dropping any "total" word, so that these
// names come out unchanged; without suffixes it leaves them as they are.
// It adds the labels otel_scope_name and otel_scope_version to each series
// (its option WithoutScopeInfo leaves them out). In one Prometheus
// registry with the Prometheus adapter's metrics, the names collide: use
// one adapter per registry.
//
// Waiters and holders are asynchronous up-down counters, which the
// Prometheus exporter writes as gauges: they are counts that add up across
// kinds and names, what OpenTelemetry's conventions make an up-down
// counter (http.server.active_requests is one), and two Telemetry on one
// MeterProvider then add up rather than hide each other. Without
// LockNames they have a series for each kind from the start, at zero;
// with it, a name's series goes once no waiter (holder) of it is left in
// this process. The counters are asynchronous too, fed from counts kept
// here, so that etcdlock_lease_renewal_failures_total,
// etcdlock_sessions_ended_total (for each cause) and, without LockNames,
// etcdlock_locks_lost_total (for each kind and cause) have a series from
// the start, at zero, as in the Prometheus adapter. The age of the oldest
// hold is an asynchronous gauge, computed at each collection. A histogram has no series
// before its first recording (OpenTelemetry has no way to make one):
// etcdlock_lease_renewal_duration_seconds, which the Prometheus adapter
// shows from the start, appears with the first renewal.
//
// The histograms' bucket boundaries are the Prometheus adapter's defaults,
// given as advice: 1ms, 2ms, 4ms ... about 35 minutes for acquisitions and
// holds, 5ms to 10s for renewals. A View of the MeterProvider sets others.
// Elections won are the acquisitions of kind election with outcome
// acquired; lost, the holds of kind election whose end is not released.
//
// # Spans
//
// Each acquisition (Lock, RLock, Acquire, Campaign, their Try forms, and
// those of Do and Lead) is a span named etcdlock.acquire, of kind
// internal, whose parent is the span in the call's ctx. It starts when the
// call began and ends at its outcome; its attributes are etcdlock.kind,
// etcdlock.name (with LockNames), etcdlock.outcome, etcdlock.wait (false
// for a Try form), etcdlock.waited (seconds) and, when acquired,
// etcdlock.token, the hold's fencing token. The span is made when the
// acquisition is over, its start set back: a hook cannot give the call a
// context with the span in it, so spans made during the acquisition (the
// etcd client's, if it is instrumented) are its siblings, not its
// children.
//
// Each hold acquired is a span named etcdlock.hold, a sibling of its
// acquisition's (same parent), from the acquisition to the hold's end,
// with etcdlock.kind, etcdlock.name (with LockNames) and etcdlock.token,
// and at its end etcdlock.end (how it ended) and etcdlock.held (seconds).
// A parent may end long before the hold does.
//
// A span's status is Error, with error.type the outcome or end, for an
// acquisition that failed (outcome error or session_ended) and for a hold
// lost (any end but released and session_closed). The others are not
// errors: busy is a Try form's answer; canceled, the caller's own ctx
// ending, is the caller's to judge; session_closed, the program closing
// the session, the library logs at Info rather than Warn.
// The error's text quotes the lock's key, and so its name: with
// LockNames it is the status's description and an exception event;
// without, the description names only the outcome or end.
//
// A hold's span ends at the Hooks.HoldDone of the same key and token:
// when it is released, when the library learns it is lost, or at the
// latest when its session ends (see Hooks.HoldDone), so a session closed
// with locks held leaves no span open and no holder counted. A span that
// is not recording (not sampled, or no SDK) is not kept.
//
// Lock names are left out by default: a program that names a lock per job
// or per user would make a series per name, without bound, and put what
// it named them after into every backend. With them, the up-down
// counters' series of a name go once no waiter (holder) of it is left,
// but the histograms keep a set of series for each name ever used.
package etcdlockotel
