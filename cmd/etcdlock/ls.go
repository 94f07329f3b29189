package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const lsHelp = `Usage: etcdlock ls [flags] PREFIX

Lists every lock whose name starts with PREFIX, a line each: its name, its
holder, how long it has held the lock, and how many wait. A key NAME/x (x
without "/") belongs to the lock NAME, so a nested lock NAME/sub is listed
apart from NAME. The locks are read at one etcd revision, page by page.

HOLDER is who the holder says it is (etcdlock run, and programs that use
etcdlock.WithIdentity, record it in the key's value) or, when it recorded
nothing (etcdctl lock, etcd's concurrency.Mutex), its key. A lock held by
several keys (an RWMutex's readers, a Semaphore's permits) shows the oldest
and how many more.

etcd keeps no timestamps. HELD FOR is known only for a holder that recorded
when it joined the queue (etcdlock run does, by its own clock): if etcd's
history shows it got the lock the moment it joined, HELD FOR is the time
since; if it waited (or that history is compacted), HELD FOR is "<=" the
time since it joined. "?" when nothing was recorded.

Exit codes: 0 listed (also when there is no lock), 2 usage, 3 cannot reach
etcd, 1 other.
` + connHelp

// lsJSON is the output of ls --json.
type lsJSON struct {
	Prefix   string       `json:"prefix"`
	Revision int64        `json:"revision"` // etcd revision of the read
	Locks    []lsLockJSON `json:"locks"`    // by name; [] when none
}

type lsLockJSON struct {
	Name    string         `json:"name"`
	Holders []lsHolderJSON `json:"holders"` // oldest first
	Waiters int            `json:"waiters"`
}

type lsHolderJSON struct {
	Key   string `json:"key"`
	Lease string `json:"lease"` // hex, as in the key
	Token int64  `json:"token"` // create revision of the key
	Mode  string `json:"mode"`  // "exclusive", "shared", or a Semaphore's "2 of 5"
	// What the holder recorded with etcdlock.WithIdentity; absent if
	// nothing.
	Identity string `json:"identity,omitempty"`
	// From etcdlock run's record: who it is, and when it joined the queue
	// by its own clock. HeldSince is set when it got the lock the moment
	// it joined (etcd's history shows so): then it is QueuedAt.
	Host      string     `json:"host,omitempty"`
	PID       int        `json:"pid,omitempty"`
	Command   string     `json:"command,omitempty"`
	QueuedAt  *time.Time `json:"queued_at,omitempty"`
	HeldSince *time.Time `json:"held_since,omitempty"`
}

func cmdLs(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ls")
	var conn connFlags
	conn.register(fs)
	jsonOut := fs.Bool("json", false, "print JSON")
	pos, rest, _, err := parseArgs(fs, args, 1, lsHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("ls", "missing PREFIX")
	case pos[0] == "":
		return usageErr("ls", "empty PREFIX")
	}
	if len(rest) > 0 {
		return usageErr("ls", "unexpected argument %q after PREFIX", rest[0])
	}
	if err := setupConn(fs, &conn, "ls"); err != nil {
		return err
	}
	if err := conn.askPassword("ls", os.Stdin, stderr); err != nil {
		return err
	}
	prefix := pos[0]
	cli, err := conn.connect(context.Background(), prefix)
	if err != nil {
		return err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	ls, err := readLs(ctx, cli, prefix)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("list locks under %q: no answer from etcd within %v (--command-timeout)", prefix, conn.commandTimeout)
	}
	if err != nil {
		return fmt.Errorf("list locks under %q: %w", prefix, conn.explain(err, "read the keys with prefix", prefix))
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ls)
	}
	printLs(stdout, ls, time.Now())
	return nil
}

// readLs lists the locks under prefix, and for each holder that recorded
// when it queued, whether it got the lock at once.
func readLs(ctx context.Context, cli *clientv3.Client, prefix string) (*lsJSON, error) {
	l, err := etcdlock.ListLocks(ctx, cli, prefix)
	if err != nil {
		return nil, err
	}
	out := &lsJSON{Prefix: prefix, Revision: l.Revision, Locks: []lsLockJSON{}}
	for _, lk := range l.Locks {
		j := lsLockJSON{Name: lk.Name, Waiters: lk.Waiters}
		for _, h := range lk.Holders {
			hj := lsHolderJSON{Key: h.Key, Lease: fmt.Sprintf("%x", int64(h.Lease)), Token: h.Token, Mode: h.Mode.String(), Identity: h.Identity}
			if rec, ok := readSelfRecord(ctx, cli, lk.Name, h); ok {
				hj.Host, hj.PID, hj.Command, hj.QueuedAt, hj.HeldSince = rec.Host, rec.PID, rec.Command, rec.Queued, rec.HeldSince
			}
			j.Holders = append(j.Holders, hj)
		}
		out.Locks = append(out.Locks, j)
	}
	return out, nil
}

// printLs prints ls as a table, a lock a line.
func printLs(w io.Writer, ls *lsJSON, now time.Time) {
	if len(ls.Locks) == 0 {
		fmt.Fprintf(w, "no locks under %q (etcd revision %d)\n", ls.Prefix, ls.Revision)
		return
	}
	fmt.Fprintf(w, "%d locks under %q (etcd revision %d)\n", len(ls.Locks), ls.Prefix, ls.Revision)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tHOLDER\tHELD FOR\tWAITERS")
	for _, lk := range ls.Locks {
		h := lk.Holders[0]
		holder := h.holderText()
		if n := len(lk.Holders) - 1; n > 0 {
			holder += fmt.Sprintf(" (+%d more)", n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", lk.Name, holder, h.heldFor(now), lk.Waiters)
	}
	tw.Flush()
}

// holderText names a holder: run's record, another identity on one line,
// or the key.
func (h lsHolderJSON) holderText() string {
	switch {
	case h.QueuedAt != nil || h.HeldSince != nil:
		return runRecord{Host: h.Host, PID: h.PID, Command: h.Command}.who()
	case h.Identity != "":
		return strings.Join(strings.Fields(h.Identity), " ")
	}
	return h.Key
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
