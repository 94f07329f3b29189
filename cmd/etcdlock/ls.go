package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const lsHelp = `Usage: etcdlock ls [flags] PREFIX

Lists every lock whose name starts with PREFIX ("" for every lock in
etcd), a line each: its name, its holder, how long it has held the lock,
and how many wait. A key NAME/x (x
without "/") belongs to the lock NAME, so a nested lock NAME/sub is listed
apart from NAME. The locks are read at one etcd revision, page by page.

HOLDER is who the holder says it is (etcdlock run, and programs that use
etcdlock.WithIdentity, record it in the key's value), an election
leader's value (etcdlock elect, etcdctl elect) quoted, as value "VALUE",
or, when it recorded nothing (etcdctl lock, etcd's concurrency.Mutex),
its key. A lock held by
several keys (an RWMutex's readers, a Semaphore's permits) shows the oldest
and how many more.

etcd keeps no timestamps. HELD FOR is known only for a holder that recorded
when it joined the queue (etcdlock run does, by its own clock): if etcd's
history shows it got the lock the moment it joined, HELD FOR is the time
since; if it waited (or that history is compacted), HELD FOR is "<=" the
time since it joined. "?" when nothing was recorded.

With --watch, ls keeps going and shows every change until interrupted
(SIGINT, SIGTERM or SIGHUP; it then exits 0). It does not poll: it watches
the keys under PREFIX and reads a lock again when one of its keys changes.
On a terminal the list is redrawn in place. Otherwise (a pipe, a file, or
TERM=dumb) it starts with a line per lock, then a line for each lock a
change touches, in revision order, none skipped:

  TIME  rev REVISION  NAME  STATE  (KEY joined|left|new value, ...)

STATE is "free", "held by HOLDER for HELD FOR, M waiting", or "held by
nobody, M waiting for a lock delay" (WithLockDelay). TIME is when
etcdlock saw the change. With --json each line is a JSON object: first
the state, ls --json's object with "time" (its "locks" may be []); then,
for each lock a change touches, a lock of its "locks" with "time",
"revision" and "changes". A broken watch resumes where it was, and etcd
not answering is said on stderr, as with status --watch; if etcd has
compacted the history it needed, the state is shown again, as at the
start.

In JSON, "identity" is a JSON object when the holder recorded one
(etcdlock run does), else a string.

` + namesHelp + `

Exit codes: 0 listed (also when there is no lock), 2 usage, 3 cannot reach
etcd, 1 other.
` + connHelp

// lsJSON is the output of ls --json.
type lsJSON struct {
	Prefix   string       `json:"prefix"`
	Revision int64        `json:"revision"` // etcd revision of the read
	Locks    []lsLockJSON `json:"locks"`    // by name; [] when none
}

// lsLockJSON is a lock of ls --json. Each ...Base64 field, here and in
// the JSON of status and of the watches, holds the exact bytes of the
// name or key beside it (base64IfInvalid): present only when they are
// not valid UTF-8, which JSON cannot carry.
type lsLockJSON struct {
	Name       string         `json:"name"`
	NameBase64 string         `json:"name_base64,omitempty"`
	Holders    []lsHolderJSON `json:"holders"` // oldest first
	Waiters    int            `json:"waiters"`
	// WaitsFor is set when nobody holds because the first in line is a
	// MultiMutex (etcdlock run --also) that still waits for that name.
	WaitsFor       string `json:"waits_for,omitempty"`
	WaitsForBase64 string `json:"waits_for_base64,omitempty"`
}

type lsHolderJSON struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"`
	Lease     string `json:"lease"` // hex, as in the key
	Token     int64  `json:"token"` // create revision of the key
	Mode      string `json:"mode"`  // "exclusive", "shared", or a Semaphore's "2 of 5"
	// What the holder recorded with etcdlock.WithIdentity, as a JSON
	// object when it is one (etcdlock run's record is), else a string;
	// absent if nothing.
	Identity identityJSON `json:"identity,omitempty"`
	// The key's value when it is neither a mode nor a holder's record:
	// an election leader's proposal, or whatever else the holder put.
	Value *string `json:"value,omitempty"`
	// From etcdlock run's record: who it is, and when it joined the queue
	// by its own clock. HeldSince is set when it got the lock the moment
	// it joined (etcd's history shows so): then it is QueuedAt.
	whoJSON
	QueuedAt  *time.Time `json:"queued_at,omitempty"`
	HeldSince *time.Time `json:"held_since,omitempty"`
}

func cmdLs(args []string, stdout, stderr io.Writer) error {
	c, err := parseReadCmd("ls", "PREFIX", lsHelp, args, stdout, stderr)
	if err != nil {
		return err
	}
	prefix := c.arg
	cli, err := c.conn.connect(context.Background(), prefix)
	if err != nil {
		return err
	}
	defer cli.Close()
	// readErr says why listing the locks failed.
	readErr := func(err error) error {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("list locks%s: no answer from etcd within %v (--command-timeout)", under(prefix), c.conn.commandTimeout)
		}
		return fmt.Errorf("list locks%s: %w", under(prefix), c.conn.explain(err, "read the keys with prefix", prefix, nil))
	}
	if c.watch {
		return watchLs(cli, c, stdout, stderr, readErr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), c.conn.commandTimeout)
	defer cancel()
	ls, err := readLs(ctx, cli, prefix, readSelfRecord)
	if err != nil {
		return readErr(err)
	}
	if c.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ls)
	}
	printLs(stdout, ls, time.Now())
	return nil
}

// readLs lists the locks under prefix, and for each holder that recorded
// when it queued, whether it got the lock at once.
func readLs(ctx context.Context, cli *clientv3.Client, prefix string, record recordReader) (*lsJSON, error) {
	l, err := etcdlock.ListLocks(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	out := &lsJSON{Prefix: prefix, Revision: l.Revision, Locks: []lsLockJSON{}}
	for _, lk := range l.Locks {
		out.Locks = append(out.Locks, newLsLock(ctx, cli, lk.Name, lk.Holders, lk.Waiters, lk.WaitsFor, record))
	}
	return out, nil
}

// newLsLock tells lock name, with what its holders recorded about
// themselves as record reads it.
func newLsLock(ctx context.Context, cli *clientv3.Client, name string, holders []etcdlock.QueueKey, waiters int, waitsFor string, record recordReader) lsLockJSON {
	j := lsLockJSON{Name: name, NameBase64: base64IfInvalid(name), Holders: []lsHolderJSON{}, Waiters: waiters, WaitsFor: waitsFor, WaitsForBase64: base64IfInvalid(waitsFor)}
	for _, h := range holders {
		hj := lsHolderJSON{Key: h.Key, KeyBase64: base64IfInvalid(h.Key), Lease: fmt.Sprintf("%x", int64(h.Lease)), Token: h.Token, Mode: h.Mode.String(), Identity: identityJSON(h.Identity)}
		if rec, ok := record(ctx, cli, name, h); ok {
			hj.whoJSON, hj.QueuedAt, hj.HeldSince = rec.whoJSON, rec.Queued, rec.HeldSince
		} else if len(h.Value) > 0 && h.Identity == "" && h.Mode.Exclusive() && !h.InSet {
			v := string(h.Value)
			hj.Value = &v
		}
		j.Holders = append(j.Holders, hj)
	}
	return j
}

// printLs prints ls as a table, a lock a line.
func printLs(w io.Writer, ls *lsJSON, now time.Time) {
	switch len(ls.Locks) {
	case 0:
		fmt.Fprintf(w, "no locks%s (etcd revision %d)\n", under(ls.Prefix), ls.Revision)
		return
	case 1:
		fmt.Fprintf(w, "1 lock%s (etcd revision %d)\n", under(ls.Prefix), ls.Revision)
	default:
		fmt.Fprintf(w, "%d locks%s (etcd revision %d)\n", len(ls.Locks), under(ls.Prefix), ls.Revision)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOLDER\tHELD FOR\tWAITERS")
	for _, lk := range ls.Locks {
		if len(lk.Holders) == 0 {
			// Keys, but none holds: the first in line is a set that
			// waits for another name, or a lock delay keeps it free.
			why := "a lock delay"
			if lk.WaitsFor != "" {
				why = "a MultiMutex waits for " + strconv.Quote(lk.WaitsFor)
			}
			fmt.Fprintf(tw, "%s\tnobody (%s)\t-\t%d\n", safeText(lk.Name), why, lk.Waiters)
			continue
		}
		h := lk.Holders[0]
		holder := h.holderText()
		if n := len(lk.Holders) - 1; n > 0 {
			holder += fmt.Sprintf(" (+%d more)", n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", safeText(lk.Name), holder, h.heldFor(now), lk.Waiters)
	}
	tw.Flush()
}

// under is " under "PREFIX"" for messages about the locks under prefix,
// and "" for every lock.
func under(prefix string) string {
	if prefix == "" {
		return ""
	}
	return fmt.Sprintf(" under %q", prefix)
}

// holderText names a holder: run's record, another identity, an election
// leader's value (quoted), or the key; each as safeText shows it.
func (h lsHolderJSON) holderText() string {
	switch {
	case h.QueuedAt != nil || h.HeldSince != nil:
		return h.who()
	case h.Identity != "":
		return safeText(string(h.Identity))
	case h.Value != nil:
		return "value " + strconv.Quote(*h.Value)
	}
	return safeText(h.Key)
}

// identityJSON is a holder's identity in JSON: a JSON object as it is,
// when it is one, so that scripts read its fields directly; else a
// string.
type identityJSON string

func (id identityJSON) MarshalJSON() ([]byte, error) {
	if s := strings.TrimSpace(string(id)); strings.HasPrefix(s, "{") && json.Valid([]byte(s)) {
		return []byte(s), nil // json.Marshal compacts it to one line
	}
	return json.Marshal(string(id))
}

func (id *identityJSON) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*id = identityJSON(s)
		return nil
	}
	if !json.Valid(b) {
		return errors.New("identity is neither a string nor JSON")
	}
	*id = identityJSON(b)
	return nil
}

// heldFor is the HELD FOR column: the time since the hold began, "<=" the
// time since the holder queued when it may have waited, "?" when unknown.
func (h lsHolderJSON) heldFor(now time.Time) string {
	switch {
	case h.HeldSince != nil:
		return fmtDur(max(0, now.Sub(*h.HeldSince)))
	case h.QueuedAt != nil:
		return "<=" + fmtDur(max(0, now.Sub(*h.QueuedAt)))
	}
	return "?"
}

// lsStateJSON is the first line of ls --watch --json, and the line after
// etcd compacted the history the watch needed: every lock, as ls --json
// shows them, and when etcdlock read them.
type lsStateJSON struct {
	Time time.Time `json:"time"`
	lsJSON
}

// lsWatchJSON is a line of ls --watch --json after the first: a lock after
// a change, when etcdlock saw it, and what the change was. A lock that
// became free has no holders and no waiters.
type lsWatchJSON struct {
	Time     time.Time   `json:"time"`
	Revision int64       `json:"revision"`
	Changes  []keyChange `json:"changes"`
	lsLockJSON
}

// watchLs lists the locks under the prefix, then every change of them
// until SIGINT, SIGTERM or SIGHUP: on a terminal the list is redrawn; else
// each lock that changed is a line (with --json, a JSON object), in the
// order of the revisions that changed them. Each change costs one read
// (for the lines, of the lock that changed at the change's revision);
// nothing polls.
func watchLs(cli *clientv3.Client, c *readCmd, stdout, stderr io.Writer, readErr func(error) error) error {
	ctx, stop := watchContext()
	defer stop()
	prefix := c.arg
	tty := !c.json && isTTY(stdout)
	records := selfRecords{}
	var shown int64 // the revision of the state shown last
	line := func(rev int64, lk lsLockJSON, changes []keyChange) {
		now := time.Now()
		if c.json {
			if changes == nil {
				changes = []keyChange{}
			}
			json.NewEncoder(stdout).Encode(lsWatchJSON{Time: now, Revision: rev, Changes: changes, lsLockJSON: lk})
			return
		}
		state := "free"
		switch {
		case len(lk.Holders) == 0 && lk.WaitsFor != "":
			state = fmt.Sprintf("held by nobody, %d waiting: first in line is a MultiMutex that still waits for %q", lk.Waiters, lk.WaitsFor)
		case len(lk.Holders) == 0 && lk.Waiters > 0:
			state = fmt.Sprintf("held by nobody, %d waiting for a lock delay", lk.Waiters)
		}
		if len(lk.Holders) > 0 {
			h := lk.Holders[0]
			state = "held by " + h.holderText()
			if n := len(lk.Holders) - 1; n > 0 {
				state += fmt.Sprintf(" and %d more", n)
			}
			state += fmt.Sprintf(" for %s, %d waiting", h.heldFor(now), lk.Waiters)
		}
		s := fmt.Sprintf("%s  rev %d  %s  %s", now.Format(stampLayout), rev, safeText(lk.Name), state)
		if len(changes) > 0 {
			s += "  " + changesText(changes)
		}
		fmt.Fprintln(stdout, s)
	}
	var f *follower
	f = &follower{
		cli: cli, prefix: prefix, what: "locks" + under(prefix), stderr: stderr,
		timeout: c.conn.commandTimeout, oneRevision: !tty,
		// resync shows every lock as it is now: redrawn on a terminal,
		// else a line each.
		resync: func(ctx context.Context) (int64, error) {
			rctx, cancel := context.WithTimeout(ctx, c.conn.commandTimeout)
			defer cancel()
			ls, err := readLs(rctx, cli, prefix, records.read)
			if err != nil {
				return 0, readErr(err)
			}
			shown = ls.Revision
			switch {
			case tty:
				var b strings.Builder
				printLs(&b, ls, time.Now())
				frame(stdout, "etcdlock ls "+safeText(prefix)+" --watch", b.String())
				return ls.Revision, nil
			case c.json:
				json.NewEncoder(stdout).Encode(lsStateJSON{Time: time.Now(), lsJSON: *ls})
				return ls.Revision, nil
			case len(ls.Locks) == 0:
				fmt.Fprintf(stdout, "%s  rev %d  no locks%s\n", time.Now().Format(stampLayout), ls.Revision, under(prefix))
			}
			for _, lk := range ls.Locks {
				line(ls.Revision, lk, nil)
			}
			return ls.Revision, nil
		},
		change: func(ctx context.Context, rev int64, evs []*clientv3.Event) error {
			if rev <= shown {
				return nil
			}
			if tty {
				// The terminal shows the list as it is now: one read
				// may cover several changes.
				_, err := f.resync(ctx)
				return err
			}
			var names []string // the locks that changed, in the order of their first event
			changes := map[string][]keyChange{}
			for _, ev := range evs {
				name, ok := etcdlock.LockOfKey(string(ev.Kv.Key))
				if !ok || !strings.HasPrefix(name, prefix) {
					continue // not a lock ListLocks lists
				}
				if changes[name] == nil {
					names = append(names, name)
				}
				changes[name] = append(changes[name], newKeyChange(ev))
			}
			for _, name := range names {
				rctx, cancel := context.WithTimeout(ctx, c.conn.commandTimeout)
				q, err := etcdlock.InspectLock(rctx, cli, name, etcdlock.AtRevision(rev))
				if err != nil {
					cancel()
					return readErr(err)
				}
				waitsFor := ""
				if w := q.Waiters(); len(q.Holders()) == 0 && len(w) > 0 {
					waitsFor = w[0].WaitsFor
				}
				lk := newLsLock(rctx, cli, name, q.Holders(), len(q.Waiters()), waitsFor, records.read)
				cancel()
				line(rev, lk, changes[name])
			}
			shown = rev
			return nil
		},
	}
	return f.run(ctx)
}
