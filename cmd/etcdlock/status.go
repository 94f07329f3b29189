package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const statusHelp = `Usage: etcdlock status [flags] NAME

Shows who holds the lock NAME and who waits for it, in queue order.

The queue is the keys NAME/<lease ID in hex> (direct children of NAME/ only:
NAME/sub/... belong to a nested lock), oldest create revision first. A
key's create revision is its fencing token. A Mutex, or an RWMutex writer,
holds alone: the oldest key holds. An RWMutex's readers hold together when
no writer is ahead of them, and a Semaphore's keys hold while their permits
fit its capacity; the MODE column then tells each key's kind: exclusive,
shared (a reader), or "n of capacity" (a Semaphore's permits). NAME may be
an election's (etcdlock elect, etcdctl elect): its leader holds, and the
value it proclaims is shown.

etcd keeps no timestamps, and a lease tells its TTL and what is left of it,
not when it began. etcdlock run records in its key when it joined the queue,
by its own clock: "held since" is that time when etcd's history shows it got
the lock the moment it joined, and else unknown but at most the time since
it joined (it waited for part of it, or the history is compacted). A holder
that recorded nothing: unknown.

With --watch, status keeps going and shows every change of the queue
until interrupted (SIGINT, SIGTERM or SIGHUP; it then exits 0). It does
not poll: it watches the keys NAME/ and reads the queue again when one
changes. On a terminal the view is redrawn in place. Otherwise (a pipe, a
file, or TERM=dumb) each state is a line, every revision that changed the
queue one, in order, none skipped:

  TIME  rev REVISION  STATE  (KEY joined|left|new value, ...)

STATE is "free" or "held by KEY (token N, ...), M waiting". TIME is when
etcdlock saw the change. A key that "left" unlocked, gave up waiting, or
went with its lease: etcd does not say which. With --json, each line is a
JSON object: status --json's fields, "time" and "changes". If the watch
breaks (no leader), status says so on stderr, once, resumes where it was,
and says when it watches again; if etcd has compacted the history it
needed, it says so and shows the queue as it is now.
` + livenessHelp + `

` + namesHelp + `

Exit codes: 0 shown (held or free), 2 usage, 3 cannot reach etcd, 1 other.
` + connHelp

// readQueue reads the queue of lock name (etcdlock.InspectLock), without
// the leases; serializable lets any member answer from its own, maybe
// stale, copy.
func readQueue(ctx context.Context, cli *clientv3.Client, name string, serializable bool) (*etcdlock.LockQueue, error) {
	opts := []etcdlock.InspectOption{etcdlock.WithoutLeases()}
	if serializable {
		opts = append(opts, etcdlock.Serializable())
	}
	return etcdlock.InspectLock(ctx, cli, name, opts...)
}

// position returns key's place in q: 0 for the oldest key, n for the n-th
// after it, -1 if key is not in q.
func position(q *etcdlock.LockQueue, key string) int {
	for i, k := range q.Keys {
		if k.Key == key {
			return i
		}
	}
	return -1
}

// holderRecord is what `etcdlock run` wrote into its key once it held the
// lock, before it recorded itself with etcdlock.WithIdentity (runRecord):
// status and ls still read it. etcd records no time of its own.
type holderRecord struct {
	Since   time.Time `json:"since"` // by the holder's clock
	Host    string    `json:"host,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Command string    `json:"command,omitempty"` // CMD's name, without arguments
}

// statusJSON is the output of status --json.
type statusJSON struct {
	Name       string        `json:"name"`
	NameBase64 string        `json:"name_base64,omitempty"` // when Name is not UTF-8 (base64IfInvalid)
	Revision   int64         `json:"revision"`              // etcd revision of the read
	Holder     *holderJSON   `json:"holder"`                // the oldest holder; null when the lock is free
	Holders    []*holderJSON `json:"holders"`               // every holder, queue order (Holders[0] is Holder); [] when free
	Waiters    []waiterJSON  `json:"waiters"`               // queue order; [] when none
	// Delays are the lock delays pending (etcdlock run --lock-delay):
	// holds that ended without a release, which keep the lock free for a
	// while. Absent when none.
	Delays []delayJSON `json:"lock_delays,omitempty"`
}

type delayJSON struct {
	Key       string  `json:"key"` // the key of the hold that ended
	KeyBase64 string  `json:"key_base64,omitempty"`
	Token     int64   `json:"token"` // its token
	Delay     float64 `json:"delay_seconds"`
	Started   bool    `json:"started"` // a waiter has begun it; else the next lock begins it
	// MinHold is the ended hold's minimum hold in seconds, when it had
	// one: a started record may then be the rest of a minimum hold that
	// the holder left to etcd as it exited.
	MinHold float64 `json:"min_hold_seconds,omitempty"`
	Left    *int64  `json:"left_seconds,omitempty"` // what is left of it, when started and read
}

// modeJSON is what one key of the queue asks for, from its value
// (etcdlock.ParseKeyMode).
type modeJSON struct {
	// "exclusive" (a Mutex, an RWMutex writer, etcd's Mutex, or a value
	// etcdlock does not know), "shared" (an RWMutex reader), or "permits"
	// (a Semaphore's).
	Mode     string `json:"mode"`
	Weight   int64  `json:"weight,omitempty"`   // permits taken, for "permits"
	Capacity int64  `json:"capacity,omitempty"` // the Semaphore's capacity as that client was configured, for "permits"
}

func newModeJSON(m etcdlock.KeyMode) modeJSON {
	switch {
	case m.Shared:
		return modeJSON{Mode: "shared"}
	case m.Weight > 0:
		return modeJSON{Mode: "permits", Weight: m.Weight, Capacity: m.Capacity}
	}
	return modeJSON{Mode: "exclusive"}
}

// String is the MODE column: "exclusive", "shared", or "3 of 10".
func (m modeJSON) String() string {
	return etcdlock.KeyMode{Shared: m.Mode == "shared", Weight: m.Weight, Capacity: m.Capacity}.String()
}

type holderJSON struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
	Lease     string `json:"lease"` // hex, as in the key
	Token     int64  `json:"token"` // create revision of the key
	modeJSON
	// The lease's granted TTL and what is left of it, in seconds; absent
	// if the lease could not be read.
	LeaseTTL     *int64 `json:"lease_ttl,omitempty"`
	LeaseTTLLeft *int64 `json:"lease_ttl_left,omitempty"`
	// When the holder got the lock by its own clock, and who it is, if it
	// recorded that (etcdlock run does); absent otherwise. etcdlock run
	// records when it joined the queue, QueuedAt; HeldSince is that time
	// when etcd's history shows it got the lock the moment it joined.
	HeldSince *time.Time `json:"held_since,omitempty"`
	whoJSON
	QueuedAt *time.Time `json:"queued_at,omitempty"`
	// The key's value when it is neither a mode nor a holder's record: an
	// election leader's proposal (etcdlock elect, etcdctl elect, etcd's
	// and this package's Election), or whatever else the holder put.
	Value *string `json:"value,omitempty"`
	// ReleaseRequested: the holder was asked to release (etcdlock
	// release) and has not yet.
	ReleaseRequested bool `json:"release_requested,omitempty"`
	// MinHold is the hold's minimum hold in seconds (etcdlock run
	// --min-hold): the key stays until then after the lock was taken,
	// even once its holder is done. Absent when none.
	MinHold float64 `json:"min_hold_seconds,omitempty"`

	leaseNote string // why LeaseTTL is absent, for the text output
}

type waiterJSON struct {
	Position  int    `json:"position"` // 1 is next in line
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
	Lease     string `json:"lease"`
	Token     int64  `json:"token"` // create revision: the token if it gets the lock
	modeJSON
	// WaitsFor is, for a MultiMutex's key first in line (etcdlock run
	// --also), the other name its set still waits for.
	WaitsFor       string `json:"waits_for,omitempty"`
	WaitsForBase64 string `json:"waits_for_base64,omitempty"`
	// MayHold, on the first in line when only a lock delay that nobody
	// has begun keeps it out, says that it holds if its lock takes no
	// lock delay (a Mutex without WithLockDelay, etcd's Mutex, etcdctl
	// lock ignore the delay): etcd keeps nothing that tells which. A
	// waiter that takes a delay begins it once first in line.
	MayHold bool `json:"may_hold,omitempty"`
	// Who the waiter is, as it recorded itself: etcdlock run's host,
	// pid and command, or a library lock's WithIdentity; absent if
	// nothing was recorded.
	whoJSON
	Identity identityJSON `json:"identity,omitempty"`

	who string // its one-line description (whoOf), for the text output
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	c, err := parseReadCmd("status", "lock NAME", statusHelp, args, stdout, stderr)
	if err != nil {
		return err
	}
	name := c.arg
	cli, err := c.conn.connect(context.Background(), name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()
	// readErr says why reading the lock failed.
	readErr := func(err error) error {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read lock %q: no answer from etcd within %v (--command-timeout)", name, c.conn.commandTimeout)
		}
		return fmt.Errorf("read lock %q: %w", name, c.conn.explain(err, "read the keys with prefix", name+"/", nil))
	}
	if c.watch {
		return watchStatus(cli, c, stdout, stderr, readErr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	st, err := readStatus(ctx, cli, name)
	if err != nil {
		return readErr(err)
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st, nil, time.Now())
	return nil
}

// readStatus reads the queue of name and the holders' leases
// (etcdlock.InspectLock). The holders are the longest prefix of the queue
// that the keys' grant rules admit (LockQueue.Holders).
func readStatus(ctx context.Context, cli *clientv3.Client, name string) (*statusJSON, error) {
	q, err := etcdlock.InspectLock(ctx, cli, name, etcdlock.HolderLeasesOnly())
	if err != nil {
		return nil, err
	}
	return newStatus(ctx, cli, q, readSelfRecord), nil
}

// newStatus tells queue q, with what its holders recorded about
// themselves as record reads it.
func newStatus(ctx context.Context, cli *clientv3.Client, q *etcdlock.LockQueue, record recordReader) *statusJSON {
	name := q.Name
	st := &statusJSON{Name: name, NameBase64: base64IfInvalid(name), Revision: q.Revision, Holders: []*holderJSON{}, Waiters: []waiterJSON{}}
	for i, k := range q.Waiters() {
		w := waiterJSON{Position: i + 1, Key: k.Key, KeyBase64: base64IfInvalid(k.Key), Lease: fmt.Sprintf("%x", int64(k.Lease)), Token: k.Token, modeJSON: newModeJSON(k.Mode), WaitsFor: k.WaitsFor, WaitsForBase64: base64IfInvalid(k.WaitsFor), who: whoOf(k)}
		if rec, ok := parseRunRecord(k.Identity); ok {
			w.whoJSON = rec.whoJSON
		} else {
			w.Identity = identityJSON(k.Identity)
		}
		st.Waiters = append(st.Waiters, w)
	}
	for _, k := range q.Holders() {
		h := &holderJSON{Key: k.Key, KeyBase64: base64IfInvalid(k.Key), Lease: fmt.Sprintf("%x", int64(k.Lease)), Token: k.Token, modeJSON: newModeJSON(k.Mode), ReleaseRequested: k.ReleaseRequested, MinHold: k.MinHold.Seconds()}
		switch {
		case k.Lease == clientv3.NoLease:
			h.leaseNote = "none: the key was not put by a lock client"
		case errors.Is(k.LeaseErr, rpctypes.ErrLeaseNotFound):
			h.leaseNote = "expired since the read"
		case k.LeaseErr != nil:
			h.leaseNote = "cannot be read: " + oneLine(k.LeaseErr.Error())
		default:
			h.LeaseTTL, h.LeaseTTLLeft = &k.GrantedTTL, &k.TTL
		}
		if rec, ok := record(ctx, cli, name, k); ok {
			h.whoJSON, h.QueuedAt, h.HeldSince = rec.whoJSON, rec.Queued, rec.HeldSince
		} else if len(k.Value) > 0 && k.Identity == "" && k.Mode.Exclusive() && !k.InSet {
			v := string(k.Value)
			h.Value = &v
		}
		st.Holders = append(st.Holders, h)
	}
	if len(st.Holders) > 0 {
		st.Holder = st.Holders[0]
	}
	for _, d := range q.Delays {
		dj := delayJSON{Key: d.Key, KeyBase64: base64IfInvalid(d.Key), Token: d.Token, Delay: d.Delay.Seconds(), Started: d.Started, MinHold: d.MinHold.Seconds()}
		if d.Left > 0 {
			left := int64(d.Left / time.Second)
			dj.Left = &left
		}
		st.Delays = append(st.Delays, dj)
	}
	if len(st.Holders) == 0 && len(st.Waiters) > 0 && st.Waiters[0].WaitsFor == "" && slices.ContainsFunc(st.Delays, func(d delayJSON) bool { return !d.Started }) {
		st.Waiters[0].MayHold = true
	}
	return st
}

// printDelays prints st's pending lock delays, a line each.
func printDelays(w io.Writer, st *statusJSON) {
	for _, d := range st.Delays {
		if d.MinHold > 0 {
			printMinHold(w, d)
			continue
		}
		switch {
		case d.Left != nil:
			fmt.Fprintf(w, "lock delay: %s ended without a release; the lock stays free %ds more (of %gs)\n", safeText(d.Key), *d.Left, d.Delay)
		case d.Started:
			fmt.Fprintf(w, "lock delay: %s ended without a release; its %gs delay is running\n", safeText(d.Key), d.Delay)
		default:
			fmt.Fprintf(w, "lock delay: %s ended without a release; its %gs delay begins with the next lock\n", safeText(d.Key), d.Delay)
		}
	}
}

// printMinHold prints a pending record of a hold with a minimum hold: it
// keeps the lock taken, whether its holder left the rest of its minimum
// hold to etcd as it exited or ended without a release; etcd keeps
// nothing that tells the two apart.
func printMinHold(w io.Writer, d delayJSON) {
	const what = "minimum hold: %s (minimum hold %gs) is gone, released before its minimum hold ended or ended without a release; "
	switch {
	case d.Left != nil:
		fmt.Fprintf(w, what+"nobody takes the lock for %ds more\n", safeText(d.Key), d.MinHold, *d.Left)
	case d.Started:
		fmt.Fprintf(w, what+"nobody takes the lock until its %gs lease ends\n", safeText(d.Key), d.MinHold, d.Delay)
	default:
		fmt.Fprintf(w, what+"the next lock waits %gs first\n", safeText(d.Key), d.MinHold, d.Delay)
	}
}

// printStatus prints st as a table. labels, when not nil, names keys (the
// demo's clients) in an extra column. A Mutex's queue shows as it always
// did; the MODE column and the permits line appear when some key is not
// exclusive.
func printStatus(w io.Writer, st *statusJSON, labels map[string]string, now time.Time) {
	defer printDelays(w, st)
	if st.Holder == nil && len(st.Waiters) == 0 {
		fmt.Fprintf(w, "lock %q is free (etcd revision %d)\n", st.Name, st.Revision)
		return
	}
	switch {
	case len(st.Holders) == 0 && st.Waiters[0].WaitsFor != "":
		fmt.Fprintf(w, "lock %q is held by nobody, %d waiting: first in line is a MultiMutex that still waits for %q (etcd revision %d)\n", st.Name, len(st.Waiters), st.Waiters[0].WaitsFor, st.Revision)
	case len(st.Holders) == 0 && st.Waiters[0].MayHold:
		fmt.Fprintf(w, "lock %q is held by nobody, %d waiting for a lock delay that has not begun, unless the first in line takes no lock delay and holds (a Mutex without WithLockDelay, etcd's Mutex, etcdctl lock) (etcd revision %d)\n", st.Name, len(st.Waiters), st.Revision)
	case len(st.Holders) == 0:
		fmt.Fprintf(w, "lock %q is held by nobody, %d waiting for a lock delay (etcd revision %d)\n", st.Name, len(st.Waiters), st.Revision)
	case len(st.Holders) == 1:
		fmt.Fprintf(w, "lock %q is held, %d waiting (etcd revision %d)\n", st.Name, len(st.Waiters), st.Revision)
	default:
		fmt.Fprintf(w, "lock %q is held by %d, %d waiting (etcd revision %d)\n", st.Name, len(st.Holders), len(st.Waiters), st.Revision)
	}
	modes := false // whether some key is not exclusive
	for _, h := range st.Holders {
		modes = modes || h.Mode != "exclusive"
	}
	for _, wt := range st.Waiters {
		modes = modes || wt.Mode != "exclusive"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(pos, key, lease string, token int64, m modeJSON) {
		fmt.Fprintf(tw, "%s\t", pos)
		if labels != nil {
			fmt.Fprintf(tw, "%s\t", labels[key])
		}
		fmt.Fprintf(tw, "%s\t%s\t%d", safeText(key), lease, token)
		if modes {
			fmt.Fprintf(tw, "\t%s", m)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "POSITION\t")
	if labels != nil {
		fmt.Fprint(tw, "CLIENT\t")
	}
	fmt.Fprint(tw, "KEY\tLEASE\tTOKEN")
	if modes {
		fmt.Fprint(tw, "\tMODE")
	}
	fmt.Fprintln(tw)
	for _, h := range st.Holders {
		row("holder", h.Key, h.Lease, h.Token, h.modeJSON)
	}
	for _, wt := range st.Waiters {
		row(strconv.Itoa(wt.Position), wt.Key, wt.Lease, wt.Token, wt.modeJSON)
	}
	tw.Flush()
	if labels == nil { // the demo's CLIENT column says who each is
		for _, wt := range st.Waiters {
			if wt.who != "" {
				fmt.Fprintf(w, "waiter %d: %s\n", wt.Position, wt.who)
			}
		}
	}
	printPermits(w, st)
	for _, h := range st.Holders {
		if h.ReleaseRequested {
			fmt.Fprintf(w, "release requested: %s was asked to release (etcdlock release) and has not yet\n", safeText(h.Key))
		}
	}
	if labels != nil || st.Holder == nil {
		return // the demo tells the rest itself; nobody holds
	}
	if len(st.Holders) > 1 {
		recorded := false
		for _, h := range st.Holders {
			fmt.Fprintf(w, "lease of %s: %s\n", safeText(h.Key), h.leaseText())
			recorded = recorded || h.HeldSince != nil || h.QueuedAt != nil
		}
		for _, h := range st.Holders {
			if h.HeldSince != nil || h.QueuedAt != nil {
				fmt.Fprintf(w, "%s %s\n", safeText(h.Key), h.sinceText(now))
			}
		}
		if !recorded {
			fmt.Fprintln(w, "held since: unknown (etcd keeps no timestamps and the holders recorded none); the TOKEN column is each key's create revision")
		}
		return
	}
	h := st.Holder
	if h.Value != nil {
		fmt.Fprintf(w, "value: %s (an election leader's proposal, or what the holder put)\n", strconv.Quote(*h.Value))
	}
	fmt.Fprintf(w, "holder's lease: %s\n", h.leaseText())
	if h.MinHold > 0 {
		fmt.Fprintf(w, "minimum hold: %gs: the lock stays taken until %gs after it was taken, even once its holder is done\n", h.MinHold, h.MinHold)
	}
	if h.HeldSince == nil && h.QueuedAt == nil {
		fmt.Fprintf(w, "held since: unknown (etcd keeps no timestamps and the holder recorded none); key created at revision %d\n", h.Token)
		return
	}
	fmt.Fprintln(w, h.sinceText(now))
}

// printPermits prints the permits the holders take, when they are a
// Semaphore's, and whether the clients agree on its capacity.
func printPermits(w io.Writer, st *statusJSON) {
	var held int64
	var caps []int64 // every capacity in the queue, sorted, once each
	for _, h := range st.Holders {
		held += h.Weight
	}
	add := func(m modeJSON) {
		if m.Capacity > 0 && !slices.Contains(caps, m.Capacity) {
			caps = append(caps, m.Capacity)
		}
	}
	for _, h := range st.Holders {
		add(h.modeJSON)
	}
	for _, wt := range st.Waiters {
		add(wt.modeJSON)
	}
	if held == 0 {
		return
	}
	slices.Sort(caps)
	fmt.Fprintf(w, "permits held: %d of %d\n", held, caps[0])
	if len(caps) > 1 {
		s := make([]string, len(caps))
		for i, c := range caps {
			s[i] = strconv.FormatInt(c, 10)
		}
		fmt.Fprintf(w, "capacities disagree (%s): each key is admitted within the smallest capacity among itself and the keys ahead of it\n", strings.Join(s, ", "))
	}
}

// leaseText tells the holder's lease: "TTL 15s, 12s left", or why not.
func (h *holderJSON) leaseText() string {
	if h.LeaseTTL == nil {
		return h.leaseNote
	}
	return fmt.Sprintf("TTL %ds, %ds left", *h.LeaseTTL, *h.LeaseTTLLeft)
}

// sinceText tells what the holder recorded: since when it holds (or, when
// it waited, when it joined the queue) and who it is, on two lines, its
// command and host as safeText shows them. HeldSince or QueuedAt must be
// set.
func (h *holderJSON) sinceText(now time.Time) string {
	who := "etcdlock run"
	if h.By != "" {
		who = safeText(h.By)
	}
	if h.Name != "" {
		who += " " + strconv.Quote(h.Name)
	}
	if h.Command != "" {
		who += " running " + safeText(h.Command)
	}
	if h.PID != 0 {
		who += fmt.Sprintf(" as pid %d", h.PID)
	}
	if h.Host != "" {
		who += " on " + safeText(h.Host)
	}
	const layout = "2006-01-02 15:04:05.000 MST"
	if h.HeldSince == nil {
		return fmt.Sprintf("held since: unknown, at most %s: the holder joined the queue at %s by its clock, and etcd's history does not show it got the lock then\nholder: %s",
			fmtDur(max(0, now.Sub(*h.QueuedAt))), h.QueuedAt.Local().Format(layout), who)
	}
	return fmt.Sprintf("held since: %s (%s ago), as recorded by the holder's clock\nholder: %s",
		h.HeldSince.Local().Format(layout), fmtDur(max(0, now.Sub(*h.HeldSince))), who)
}

// statusWatchJSON is a line of status --watch --json: the queue after a
// change, when etcdlock saw it, and what the change was (none on the
// first line, and after etcd compacted the history the watch needed).
type statusWatchJSON struct {
	Time    time.Time   `json:"time"`
	Changes []keyChange `json:"changes"`
	statusJSON
}

// watchStatus shows the queue of the lock, then every change of it until
// SIGINT, SIGTERM or SIGHUP: on a terminal the view is redrawn; else each
// state is a line (with --json, a JSON object), every revision that
// changed the queue one, in order. Each change costs one read of the
// queue (at the change's revision for the lines); nothing polls.
func watchStatus(cli *clientv3.Client, c *readCmd, stdout, stderr io.Writer, readErr func(error) error) error {
	ctx, stop := watchContext()
	defer stop()
	name := c.arg
	tty := !c.json && isTTY(stdout)
	records := selfRecords{}
	read := func(ctx context.Context, opts ...etcdlock.InspectOption) (*statusJSON, error) {
		rctx, cancel := context.WithTimeout(ctx, c.conn.commandTimeout)
		defer cancel()
		q, err := etcdlock.InspectLock(rctx, cli, name, opts...)
		if err != nil {
			return nil, readErr(err)
		}
		return newStatus(rctx, cli, q, records.read), nil
	}
	var shown int64 // the revision of the state shown last
	show := func(st *statusJSON, changes []keyChange) {
		shown = st.Revision
		switch {
		case tty:
			var b strings.Builder
			printStatus(&b, st, nil, time.Now())
			frame(stdout, "etcdlock status "+safeText(name)+" --watch", b.String())
		case c.json:
			if changes == nil {
				changes = []keyChange{}
			}
			json.NewEncoder(stdout).Encode(statusWatchJSON{Time: time.Now(), Changes: changes, statusJSON: *st})
		default:
			line := fmt.Sprintf("%s  rev %d  %s", time.Now().Format(stampLayout), st.Revision, statusLine(st))
			if len(changes) > 0 {
				line += "  " + changesText(changes)
			}
			fmt.Fprintln(stdout, line)
		}
	}
	var f *follower
	f = &follower{
		cli: cli, prefix: name + "/", what: fmt.Sprintf("lock %q", name), stderr: stderr,
		timeout: c.conn.commandTimeout, oneRevision: !tty,
		// resync shows the queue as it is now, with the holders' leases.
		resync: func(ctx context.Context) (int64, error) {
			st, err := read(ctx, etcdlock.HolderLeasesOnly())
			if err != nil {
				return 0, err
			}
			show(st, nil)
			return st.Revision, nil
		},
		change: func(ctx context.Context, rev int64, evs []*clientv3.Event) error {
			var changes []keyChange
			for _, ev := range evs {
				if lock, ok := etcdlock.LockOfKey(string(ev.Kv.Key)); ok && lock == name {
					changes = append(changes, newKeyChange(ev))
				}
			}
			if len(changes) == 0 || rev <= shown {
				return nil // a nested lock's key, or shown already
			}
			if tty {
				// The terminal shows the queue as it is now, with the
				// holders' leases: one read may cover several changes.
				_, err := f.resync(ctx)
				return err
			}
			st, err := read(ctx, etcdlock.AtRevision(rev))
			if err == nil {
				show(st, changes)
			}
			return err
		},
	}
	return f.run(ctx)
}

// statusLine tells st on one line: "free", or "held by KEY (token N, who),
// 2 waiting".
func statusLine(st *statusJSON) string {
	switch {
	case st.Holder == nil && len(st.Waiters) > 0 && st.Waiters[0].MayHold:
		return fmt.Sprintf("free, in a lock delay not begun, %d waiting, unless the first takes no delay and holds", len(st.Waiters))
	case st.Holder == nil && len(st.Delays) > 0:
		return fmt.Sprintf("free, in a lock delay, %d waiting", len(st.Waiters))
	case st.Holder == nil:
		return "free"
	}
	h := st.Holder
	about := fmt.Sprintf("token %d", h.Token)
	switch {
	case h.QueuedAt != nil || h.HeldSince != nil:
		about += ", " + h.who()
	case h.Value != nil:
		about += ", value " + strconv.Quote(*h.Value)
	}
	if h.Mode != "exclusive" {
		about += ", " + h.modeJSON.String()
	}
	s := fmt.Sprintf("held by %s (%s)", safeText(h.Key), about)
	if n := len(st.Holders) - 1; n > 0 {
		s += fmt.Sprintf(" and %d more", n)
	}
	return s + fmt.Sprintf(", %d waiting", len(st.Waiters))
}
