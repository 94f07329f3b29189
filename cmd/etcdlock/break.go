package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The break command: an operator ends a hold, or a waiter's place, from
// outside (etcdlock.Evict), or revokes a holder's lease.

const breakHelp = `Usage: etcdlock break [flags] NAME [KEY]

Ends the hold of the lock NAME from outside, for an operator: a holder
that is wedged, or a dead host's lease that has not run out yet. It
deletes the holder's key, guarded by the key's fencing token (a later
hold's key is never deleted), and the next in line is admitted as after a
release, unless the hold left a lock delay or a minimum hold (--lock-delay,
--min-hold), which keeps the lock free as after a crash.

It prints the holder's fencing token: writes fenced with it (FencedWrite,
etcdlocksql, a store that checks ETCDLOCK_TOKEN) are refused once a later
holder has written with its own. Nothing stops the holder's process:
'etcdlock run' stops CMD when it sees its key gone (it exits 6), a program
of the library sees its hold lost, and a process cut off from etcd learns
it only when it hears from etcd again. Fence what a lock protects before
relying on break.

It asks before it breaks anything, on the terminal; without a terminal
it is refused unless --yes is given.

With KEY it ends that key's place instead of the holder's: one of
several holders (readers, permits), or a waiter ('etcdlock status NAME'
lists the keys), whose Lock then fails ('etcdlock run' joins the queue
again, at its end).

  --revoke    revoke the key's lease instead of deleting the key: every key
              of that session goes, those of its other locks too, and its
              session ends (as destroying a Consul session)
  --yes       break without asking

Exits 0 once etcd has deleted the key (or revoked the lease), 4 when
nothing holds NAME, or KEY is not in its queue, and 2 when not confirmed.
Deleting needs write permission on the keys with prefix NAME/ ('etcdlock
grants NAME' prints the lines); revoking, on every key bound to the lease.
` + connHelp + "\n" + exitCodesHelp

// breakTarget is the key break ends, as status read it.
type breakTarget struct {
	key, lease string
	token      int64
	holder     bool
	what       string // "the hold of KEY" or "the place of waiter 2, KEY"
	who        string // who it recorded it is, "" if nothing
}

func cmdBreak(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("break")
	var conn connFlags
	conn.register(fs)
	revoke := fs.Bool("revoke", false, "revoke the key's lease (every key of its session) instead of deleting the key")
	yes := fs.Bool("yes", false, "break without asking")
	pos, rest, _, err := parseArgs(fs, args, 2, breakHelp, stdout)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("break", "missing lock NAME")
	}
	name := pos[0]
	if err := nameErr("break", "lock NAME", name); err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErr("break", "unexpected argument %q after KEY", rest[0])
	}
	key := ""
	if len(pos) == 2 {
		key = pos[1]
	}
	cli, err := openConn(fs, &conn, "break", name+"/", stderr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	st, err := readStatus(ctx, cli, name)
	if err != nil {
		return timedOut(fmt.Errorf("read lock %q: %w", name, conn.explain(err, "read the keys with prefix", name+"/", nil)), "read lock "+strconv.Quote(name), &conn)
	}
	t, err := chooseTarget(st, key)
	if err != nil {
		return err
	}
	cancel() // the question may take the operator longer than the timeout

	if !*yes {
		if err := confirmBreak(t, *revoke, stderr); err != nil {
			return err
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	if *revoke {
		return revokeHolder(ctx, cli, &conn, name, t, stdout)
	}
	switch err := etcdlock.Evict(ctx, cli, name, t.key, t.token); {
	case errors.Is(err, etcdlock.ErrNotInQueue):
		return failf(exitHeld, "%s is not in the queue of lock %q any more (it left, or its lease ran out): nothing broken", t.key, name)
	case err != nil:
		return timedOut(fmt.Errorf("break lock %q: %w", name, conn.explain(err, "delete key", t.key, nil)), "break lock "+strconv.Quote(name), &conn)
	}
	fmt.Fprintf(stdout, "broke %s of lock %q: deleted it\n", t.what, name)
	printFenceNote(stdout, t)
	return nil
}

// chooseTarget returns the key of st that break ends: key's, or the one
// holder's.
func chooseTarget(st *statusJSON, key string) (breakTarget, error) {
	if key != "" {
		for _, h := range st.Holders {
			if h.Key == key {
				return holderTarget(h), nil
			}
		}
		for _, w := range st.Waiters {
			if w.Key == key {
				return breakTarget{key: w.Key, lease: w.Lease, token: w.Token, what: fmt.Sprintf("the place of waiter %d, %s", w.Position, safeText(w.Key)), who: w.who}, nil
			}
		}
		return breakTarget{}, failf(exitHeld, "key %s is not in the queue of lock %q ('etcdlock status %s' lists its keys): nothing broken", safeText(key), st.Name, shellQuote(st.Name))
	}
	switch len(st.Holders) {
	case 0:
		return breakTarget{}, failf(exitHeld, "lock %q is not held by anyone: nothing to break (with KEY, break ends a waiter's place)", st.Name)
	case 1:
		return holderTarget(st.Holders[0]), nil
	}
	keys := make([]string, len(st.Holders))
	for i, h := range st.Holders {
		keys[i] = safeText(h.Key)
	}
	return breakTarget{}, failf(exitUsage, "lock %q has %d holders (%s): choose one: 'etcdlock break %s KEY'", st.Name, len(st.Holders), strings.Join(keys, ", "), shellQuote(st.Name))
}

// holderTarget is the breakTarget of holder h.
func holderTarget(h *holderJSON) breakTarget {
	t := breakTarget{key: h.Key, lease: h.Lease, token: h.Token, holder: true, what: "the hold of " + safeText(h.Key)}
	if h.HeldSince != nil || h.QueuedAt != nil {
		t.who = strings.ReplaceAll(h.sinceText(time.Now()), "\n", "; ")
	} else if h.Value != nil {
		t.who = "value " + strconv.Quote(*h.Value)
	}
	return t
}

// confirmBreak asks on the terminal whether to break t, and returns nil
// only for a yes. Without a terminal it is refused: a script says --yes.
func confirmBreak(t breakTarget, revoke bool, stderr io.Writer) error {
	if !isTerminalDevice(os.Stdin) {
		return failf(exitUsage, "not confirmed: standard input is not a terminal to ask on; give --yes to break %s", t.what)
	}
	fmt.Fprintf(stderr, "%s (lease %s, token %d)\n", capitalize(t.what), t.lease, t.token)
	if t.who != "" {
		fmt.Fprintf(stderr, "%s\n", t.who)
	}
	if revoke {
		fmt.Fprintf(stderr, "Revoking lease %s ends its session: every key bound to it goes, those of its other locks too.\n", t.lease)
	}
	fmt.Fprint(stderr, "Break it? [y/N] ")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(stderr)
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return failf(exitUsage, "not confirmed: nothing broken")
}

// revokeHolder revokes t's lease, and says so.
func revokeHolder(ctx context.Context, cli *clientv3.Client, conn *connFlags, name string, t breakTarget, stdout io.Writer) error {
	id, err := strconv.ParseInt(t.lease, 16, 64)
	if err != nil || id == 0 {
		return failf(exitFailure, "%s is bound to no lease (%q): break it without --revoke", t.key, t.lease)
	}
	switch _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return failf(exitHeld, "lease %s of %s has already ended: nothing broken", t.lease, t.key)
	case err != nil:
		return timedOut(fmt.Errorf("revoke lease %s of lock %q: %w", t.lease, name, conn.explain(err, "revoke the lease of key", t.key, nil)), "revoke lease "+t.lease, conn)
	}
	fmt.Fprintf(stdout, "broke %s of lock %q: revoked its lease %s, and with it every key of that session\n", t.what, name, t.lease)
	printFenceNote(stdout, t)
	return nil
}

// printFenceNote says what the broken hold's token means to fences.
func printFenceNote(w io.Writer, t breakTarget) {
	if !t.holder {
		return
	}
	fmt.Fprintf(w, "its fencing token was %d: writes fenced with it (FencedWrite, etcdlocksql, ETCDLOCK_TOKEN) are refused once a later holder has written with its own\n", t.token)
}

// timedOut is err, or, when the command's timeout ended the call, what
// says so.
func timedOut(err error, what string, conn *connFlags) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: no answer from etcd within %v (--command-timeout)", what, conn.commandTimeout)
	}
	return err
}

// capitalize returns s with its first letter upper case.
func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
