package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
)

const electHelp = `Usage: etcdlock elect [flags] NAME [VALUE] -- CMD [ARGS...]
       etcdlock elect [flags] NAME [VALUE]
       etcdlock elect --listen [--json] [flags] NAME

Campaigns in the election NAME with VALUE as its proposal (first come,
first served), runs CMD while it is the leader, resigns when CMD exits, and
exits with CMD's exit code. VALUE defaults to HOST:PID, this host's name
and etcdlock's process ID; it must not start with "etcdlock/1 ".

With --on-release SIGNAL, a request to step down ('etcdlock release NAME')
is passed on to CMD as SIGNAL: the leadership moves to the next candidate
when CMD exits. Without it a request is ignored, and etcdlock says so on
standard error.

Without CMD, as 'etcdctl elect NAME VALUE', it prints its key and, on the
next line, its value on standard output once it leads, and leads until SIGINT, SIGTERM or SIGHUP; then it
resigns and exits 0, or exits 6 as soon as leadership is lost.

CMD finds in its environment:
  ETCDLOCK_NAME    the election name
  ETCDLOCK_KEY     the leader's key, NAME/<lease ID in hex>
  ETCDLOCK_TOKEN   the fencing token: the key's create revision, higher for
                   every later leader; pass it to what CMD writes to, so
                   that a stale leader can be refused
  ETCDLOCK_LEASE   the lease ID in hex
  ETCDLOCK_VALUE   VALUE, the proposal observers see

Leadership lasts as long as etcdlock renews its lease: if etcdlock dies, the
next candidate leads at most --ttl later. CMD is stopped before the next
candidate can lead: when renewals have failed so long that leadership could
pass on (exit 7), and when leadership is lost (exit 6), as 'etcdlock run'
stops it (see its "Stopping CMD"). Signals, process groups, CMD's death
with a killed etcdlock, what CMD leaves running (--keep-children), and a
candidate that loses its place in the queue (it joins again at the back)
work as in 'etcdlock run'.

Elections are those of etcd's concurrency.Election and 'etcdctl elect': the
key NAME/<lease ID in hex> holds the proposal, and the oldest key leads.
All three queue behind each other and observe each other on one name. Do
not use an election's name as a lock's.

With --listen, etcdlock takes no part: it prints the current leader, then
every change (a new leader, a new value, no leader), one line each, until
SIGINT, SIGTERM or SIGHUP, and then exits 0:
  leader "VALUE" (key KEY, token TOKEN, revision REV)
  no leader (revision REV)
VALUE is quoted as in Go (one line whatever it holds), and KEY too unless
it is plain, as 'etcdlock help status' tells. REV is the etcd revision
the line is true at. With --json each line is a JSON object, with TIME
when etcdlock saw it (RFC 3339):
  {"time":"TIME","revision":REV,"leader":true,"key":"KEY","lease":"LEASE","token":TOKEN,"value":"VALUE"}
  {"time":"TIME","revision":REV,"leader":false}
A KEY that is not valid UTF-8 also has its bytes in base64, as
"key_base64".
It rides out lost connections and etcd restarts without gaps (lines may lag
while etcd is out of reach); if observing fails for good (such as
permission denied), it says why and exits 1.
` + livenessHelp + `
` + connHelp + "\n" + exitCodesHelp

// A candidacy is what an 'etcdlock elect' campaigns with.
type candidacy struct {
	value string // the proposal
}

// A candidate is an Election seen as a lock, for lockRun: Lock campaigns
// with the value, Unlock resigns.
type candidate struct {
	*etcdlock.Election
	value string
}

func (c *candidate) Lock(ctx context.Context) error { return c.Campaign(ctx, c.value) }

// TryLock is not offered by elect.
func (c *candidate) TryLock(context.Context) error {
	return errors.New("etcdlock: an election has no try")
}

func (c *candidate) Unlock(ctx context.Context) error { return c.Resign(ctx) }

// defaultValue is the proposal of a candidate given none: HOST:PID.
func defaultValue() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

func cmdElect(args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("elect")
	var conn connFlags
	conn.register(fset)
	var ttl, grace time.Duration
	durationVar(fset, &ttl, "ttl", etcdlock.DefaultTTL, "lease `TTL`, rounded up to whole seconds (etcd's unit: 0.1 is 1s): if etcdlock dies, the next candidate leads at most this long after")
	durationVar(fset, &grace, "grace", defaultGrace, "wait this `duration` between SIGTERM and SIGKILL to CMD, when leadership is lost or etcd has not confirmed renewals for so long that it could pass on; at most --ttl/2 less a margin (default 10s, or --ttl/3 less the margin if that is less: see Stopping CMD below)")
	keepChildren := fset.Bool("keep-children", false, "when CMD exits, leave the processes it started running, outside the lock (default: kill them before the release)")
	pidns := fset.Bool("pid-namespace", false, "Linux: run CMD in a PID namespace of its own, so that all it starts dies even if etcdlock and its supervisor are killed at once (CMD then sees pids of its own; without root it needs user namespaces)")
	quiet := fset.Bool("quiet", false, "show no progress while waiting")
	listen := fset.Bool("listen", false, "do not campaign: print the leader and every change")
	fset.BoolVar(listen, "l", false, "the same as --listen, as in etcdctl elect -l")
	asJSON := fset.Bool("json", false, "with --listen, print JSON lines")
	onRelease := onReleaseFlag(fset)

	// NAME [VALUE] come before the "--" that starts CMD, so split there:
	// without the split, 'elect NAME -- CMD' would read CMD as VALUE.
	head, cmdArgs, hasCmd := args, []string(nil), false
	for i, a := range args {
		if a == "--" {
			head, cmdArgs, hasCmd = args[:i], args[i+1:], true
			break
		}
	}
	pos, extra, _, err := parseArgs(fset, head, 2, electHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("elect", "missing election NAME")
	}
	if err := nameErr("elect", "election NAME", pos[0]); err != nil {
		return err
	}
	switch {
	case len(extra) > 0:
		return usageErr("elect", "unexpected argument %q: CMD comes after \"--\"", extra[0])
	case hasCmd && len(cmdArgs) == 0:
		return usageErr("elect", "missing CMD after \"--\"")
	case *asJSON && !*listen:
		return usageErr("elect", "--json goes with --listen")
	case *listen && (len(pos) > 1 || hasCmd):
		return usageErr("elect", "--listen takes NAME only, no VALUE or CMD")
	case *onRelease != nil && !hasCmd:
		return usageErr("elect", "--on-release passes a request on to CMD: give CMD")
	case *keepChildren && !hasCmd:
		return usageErr("elect", "--keep-children is about the processes CMD starts: give CMD")
	case ttl <= 0:
		return usageErr("elect", "--ttl must be positive, not %v", ttl)
	case grace < 0:
		return usageErr("elect", "--grace must not be negative")
	}
	if err := checkPIDNamespace("elect", *pidns, *keepChildren, hasCmd); err != nil {
		return err
	}
	if grace, err = graceFor(fset, "elect", grace, ttl); err != nil {
		return err
	}
	value := defaultValue()
	if len(pos) > 1 {
		value = pos[1]
	}
	if strings.HasPrefix(value, "etcdlock/1 ") {
		return usageErr("elect", "VALUE must not start with %q", "etcdlock/1 ")
	}
	if err := setupConn(fset, &conn, "elect"); err != nil {
		return err
	}
	if *listen {
		return listenElection(&conn, pos[0], *asJSON, stdout, stderr)
	}
	r := &lockRun{conn: &conn, name: pos[0], ttl: ttl, stderr: stderr, elect: &candidacy{value: value}, onRelease: *onRelease, keepChildren: *keepChildren, pidNamespace: *pidns}
	return r.main(cmdArgs, false, 0, *quiet, grace, stdout)
}

// leaderJSON is one line of elect --listen --json.
type leaderJSON struct {
	Time      time.Time `json:"time"`     // when etcdlock saw it
	Revision  int64     `json:"revision"` // the etcd revision the line is true at
	Leader    bool      `json:"leader"`   // false: no leader, and no other field
	Key       string    `json:"key,omitempty"`
	KeyBase64 string    `json:"key_base64,omitempty"` // when Key is not UTF-8 (base64IfInvalid)
	Lease     string    `json:"lease,omitempty"`      // hex, as in the key
	Token     int64     `json:"token,omitempty"`      // create revision of the key
	Value     string    `json:"value,omitempty"`
}

// formatLeader is the line elect --listen prints for l, seen at now.
func formatLeader(l etcdlock.Leader, asJSON bool, now time.Time) string {
	if asJSON {
		j := leaderJSON{Time: now, Revision: l.Revision}
		if l.Key != "" {
			j.Leader, j.Key, j.KeyBase64, j.Lease, j.Token, j.Value = true, l.Key, base64IfInvalid(l.Key), fmt.Sprintf("%x", int64(l.Lease)), l.Token, string(l.Value)
		}
		b, _ := json.Marshal(j) // cannot fail: strings and numbers
		return string(b)
	}
	if l.Key == "" {
		return fmt.Sprintf("no leader (revision %d)", l.Revision)
	}
	return fmt.Sprintf("leader %q (key %s, token %d, revision %d)", l.Value, safeText(l.Key), l.Token, l.Revision)
}

// listenElection prints the leader of election name and every change
// until a signal (then it returns nil), or until observing fails.
func listenElection(conn *connFlags, name string, asJSON bool, stdout, stderr io.Writer) error {
	if err := conn.askPassword("elect", os.Stdin, stderr); err != nil {
		return err
	}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	cli, err := conn.connect(context.Background(), name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-sigc:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() { cancel(); <-stopped }()
	live := startLiveness(cli, name+"/", conn.commandTimeout, stderr)
	defer live.stop()
	for l, err := range etcdlock.ObserveLeader(ctx, cli, name) {
		if err != nil {
			if ctx.Err() != nil {
				return nil // a signal
			}
			return fmt.Errorf("observe election %q: %w", name, conn.explain(err, "read the keys with prefix", name+"/", nil))
		}
		if _, err := fmt.Fprintln(stdout, formatLeader(l, asJSON, time.Now())); err != nil {
			return fmt.Errorf("observe election %q: %w", name, err)
		}
	}
	return nil
}
