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

	clientv3 "go.etcd.io/etcd/client/v3"
)

const statusHelp = `Usage: etcdlock status [flags] NAME

Shows who holds the lock NAME and who waits for it, in queue order.

The queue is the keys NAME/<lease ID in hex> (direct children of NAME/ only:
NAME/sub/... belong to a nested lock), oldest create revision first. The
oldest holds the lock; its create revision is its fencing token.

etcd keeps no timestamps, and a lease tells its TTL and what is left of it,
not when it began: "held since" is shown only when the holder recorded it
(etcdlock run writes the time, by its own clock, into its key once it holds
the lock); otherwise it is unknown.

Exit codes: 0 shown (held or free), 2 usage, 3 cannot reach etcd, 1 other.
` + connHelp

// queueEntry is one key of a lock's queue.
type queueEntry struct {
	Key   string
	Lease clientv3.LeaseID
	Rev   int64  // create revision: the token, if it holds
	Value []byte // what the holder recorded, if anything
}

// lockQueue is a lock's queue as read at one revision.
type lockQueue struct {
	Revision int64        // etcd revision of the read
	Entries  []queueEntry // oldest first: Entries[0] holds the lock
}

// isChild reports whether key is a waiter's key of the lock whose prefix
// is pfx: a direct child, as in the library.
func isChild(pfx, key string) bool {
	rest, ok := strings.CutPrefix(key, pfx)
	return ok && rest != "" && !strings.Contains(rest, "/")
}

// readQueue reads the queue of lock name. keysOnly leaves out the values;
// serializable lets any member answer from its own, maybe stale, copy.
func readQueue(ctx context.Context, cli *clientv3.Client, name string, keysOnly, serializable bool) (*lockQueue, error) {
	pfx := name + "/"
	opts := []clientv3.OpOption{
		clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend),
	}
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	resp, err := cli.Get(ctx, pfx, opts...)
	if err != nil {
		return nil, err
	}
	q := &lockQueue{Revision: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		if isChild(pfx, string(kv.Key)) {
			q.Entries = append(q.Entries, queueEntry{
				Key:   string(kv.Key),
				Lease: clientv3.LeaseID(kv.Lease),
				Rev:   kv.CreateRevision,
				Value: kv.Value,
			})
		}
	}
	return q, nil
}

// position returns key's place in q: 0 for the holder, n for the n-th
// waiter, -1 if key is not in q.
func (q *lockQueue) position(key string) int {
	for i, e := range q.Entries {
		if e.Key == key {
			return i
		}
	}
	return -1
}

// holderRecord is what `etcdlock run` writes into its key once it holds
// the lock, for status to show. etcd records no time of its own.
type holderRecord struct {
	Since   time.Time `json:"since"` // by the holder's clock
	Host    string    `json:"host,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Command string    `json:"command,omitempty"` // CMD's name, without arguments
}

// statusJSON is the output of status --json.
type statusJSON struct {
	Name     string       `json:"name"`
	Revision int64        `json:"revision"` // etcd revision of the read
	Holder   *holderJSON  `json:"holder"`   // null when the lock is free
	Waiters  []waiterJSON `json:"waiters"`  // queue order; [] when none
}

type holderJSON struct {
	Key   string `json:"key"`
	Lease string `json:"lease"` // hex, as in the key
	Token int64  `json:"token"` // create revision of the key
	// The lease's granted TTL and what is left of it, in seconds; absent
	// if the lease could not be read.
	LeaseTTL     *int64 `json:"lease_ttl,omitempty"`
	LeaseTTLLeft *int64 `json:"lease_ttl_left,omitempty"`
	// When the holder got the lock by its own clock, and who it is, if it
	// recorded that (etcdlock run does); absent otherwise.
	HeldSince *time.Time `json:"held_since,omitempty"`
	Host      string     `json:"host,omitempty"`
	PID       int        `json:"pid,omitempty"`
	Command   string     `json:"command,omitempty"`

	leaseNote string // why LeaseTTL is absent, for the text output
}

type waiterJSON struct {
	Position int    `json:"position"` // 1 is next in line
	Key      string `json:"key"`
	Lease    string `json:"lease"`
	Token    int64  `json:"token"` // create revision: the token if it gets the lock
}

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("status")
	var conn connFlags
	conn.register(fs)
	jsonOut := fs.Bool("json", false, "print JSON")
	pos, rest, _, err := parseArgs(fs, args, 1, statusHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("status", "missing lock NAME")
	case pos[0] == "":
		return usageErr("status", "empty lock NAME")
	}
	if len(rest) > 0 {
		return usageErr("status", "unexpected argument %q after NAME", rest[0])
	}
	if err := setupConn(fs, &conn, "status"); err != nil {
		return err
	}
	if err := conn.askPassword("status", os.Stdin, stderr); err != nil {
		return err
	}
	name := pos[0]

	cli, err := conn.connect(context.Background(), name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	st, err := readStatus(ctx, cli, name)
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("read lock %q: no answer from etcd within %v (--command-timeout)", name, conn.commandTimeout)
	}
	if err != nil {
		return fmt.Errorf("read lock %q: %w", name, conn.explain(err, "read the keys with prefix", name+"/"))
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st, nil, time.Now())
	return nil
}

// readStatus reads the queue of name and the holder's lease.
func readStatus(ctx context.Context, cli *clientv3.Client, name string) (*statusJSON, error) {
	q, err := readQueue(ctx, cli, name, false, false)
	if err != nil {
		return nil, err
	}
	st := &statusJSON{Name: name, Revision: q.Revision, Waiters: []waiterJSON{}}
	for i, e := range q.Entries {
		if i > 0 {
			st.Waiters = append(st.Waiters, waiterJSON{Position: i, Key: e.Key, Lease: fmt.Sprintf("%x", int64(e.Lease)), Token: e.Rev})
			continue
		}
		h := &holderJSON{Key: e.Key, Lease: fmt.Sprintf("%x", int64(e.Lease)), Token: e.Rev}
		if e.Lease == clientv3.NoLease {
			h.leaseNote = "none: the key was not put by a lock client"
		} else if resp, err := cli.TimeToLive(ctx, e.Lease); err != nil {
			h.leaseNote = "cannot be read: " + oneLine(err.Error())
		} else if resp.TTL < 0 {
			h.leaseNote = "expired since the read"
		} else {
			h.LeaseTTL, h.LeaseTTLLeft = &resp.GrantedTTL, &resp.TTL
		}
		var rec holderRecord
		if len(e.Value) > 0 && json.Unmarshal(e.Value, &rec) == nil && !rec.Since.IsZero() {
			h.HeldSince = &rec.Since
			h.Host, h.PID, h.Command = rec.Host, rec.PID, rec.Command
		}
		st.Holder = h
	}
	return st, nil
}

// printStatus prints st as a table. labels, when not nil, names keys (the
// demo's clients) in an extra column.
func printStatus(w io.Writer, st *statusJSON, labels map[string]string, now time.Time) {
	if st.Holder == nil {
		fmt.Fprintf(w, "lock %q is free (etcd revision %d)\n", st.Name, st.Revision)
		return
	}
	fmt.Fprintf(w, "lock %q is held, %d waiting (etcd revision %d)\n", st.Name, len(st.Waiters), st.Revision)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	label := func(key string) string {
		if labels == nil {
			return ""
		}
		return labels[key] + "\t"
	}
	header := "POSITION\tKEY\tLEASE\tTOKEN\n"
	if labels != nil {
		header = "POSITION\tCLIENT\tKEY\tLEASE\tTOKEN\n"
	}
	fmt.Fprint(tw, header)
	h := st.Holder
	fmt.Fprintf(tw, "holder\t%s%s\t%s\t%d\n", label(h.Key), h.Key, h.Lease, h.Token)
	for _, wt := range st.Waiters {
		fmt.Fprintf(tw, "%d\t%s%s\t%s\t%d\n", wt.Position, label(wt.Key), wt.Key, wt.Lease, wt.Token)
	}
	tw.Flush()
	if labels != nil {
		return // the demo tells the rest itself
	}
	if h.LeaseTTL != nil {
		fmt.Fprintf(w, "holder's lease: TTL %ds, %ds left\n", *h.LeaseTTL, *h.LeaseTTLLeft)
	} else {
		fmt.Fprintf(w, "holder's lease: %s\n", h.leaseNote)
	}
	if h.HeldSince == nil {
		fmt.Fprintf(w, "held since: unknown (etcd keeps no timestamps and the holder recorded none); key created at revision %d\n", h.Token)
		return
	}
	who := ""
	if h.Command != "" {
		who += fmt.Sprintf(" running %s", h.Command)
	}
	if h.PID != 0 {
		who += fmt.Sprintf(" as pid %d", h.PID)
	}
	if h.Host != "" {
		who += " on " + h.Host
	}
	fmt.Fprintf(w, "held since: %s (%s ago), as recorded by the holder's clock\nholder: etcdlock run%s\n",
		h.HeldSince.Local().Format("2006-01-02 15:04:05.000 MST"), fmtDur(max(0, now.Sub(*h.HeldSince))), who)
}
