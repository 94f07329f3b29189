package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const shardsHelp = `Usage: etcdlock shards [flags] NAME --count N -- CMD [ARGS...]
       etcdlock shards status [flags] NAME --count N
       etcdlock shards weight [flags] NAME MEMBER WEIGHT
       etcdlock shards drain [flags] NAME MEMBER

Spreads N shards of work, numbered 0 to N-1, over the etcdlock processes
(replicas) that run 'etcdlock shards NAME --count N', and runs CMD once
for each shard this replica owns, for as long as it owns it. Every
replica of NAME must give the same N. Each shard is run by one replica at
a time; with M replicas each owns N/M shards, rounded down or up; and a
replica that joins or leaves moves about N/M shards, not all (the
library's RunShards: the replicas are the read lock NAME/members, and
shard I is the lock NAME/I).

CMD finds in its environment:
  ETCDLOCK_NAME    the shard set's name, NAME
  ETCDLOCK_SHARD   the shard's number, 0 to N-1
  ETCDLOCK_SHARDS  N
  ETCDLOCK_TOKEN   the fencing token of this hold of the shard: higher for
                   every later owner of the shard; pass it to what CMD
                   writes to, so that a stale owner can be refused
  ETCDLOCK_KEY     the key of this hold of the shard, NAME/I/<lease ID in hex>
  ETCDLOCK_LEASE   this replica's lease ID in hex (MEMBER below)

When a shard moves to another replica (one joined, or this one is
drained), or is lost (its key was deleted, or the session's lease ended),
its CMD gets SIGTERM, then SIGKILL after --grace (sooner if the lease's
deadline comes first), and the shard is released once CMD is gone: the
next owner's CMD starts only then. CMD is also stopped, as 'etcdlock run'
stops it (see its "Stopping CMD"), when etcd has not confirmed renewals of
the lease for so long that the shards could pass on. A CMD that exits
while its shard is still owned here is started again after a pause (under
a second), and etcdlock says so on standard error with its exit status;
a CMD that exits at once is restarted about once a second.

SIGINT and SIGTERM make the replica leave the set: every CMD gets SIGTERM
(then SIGKILL after --grace), each shard is released once its CMD is
gone, and etcdlock exits 0 once all are; a second SIGINT or SIGTERM is
passed on to every CMD. SIGHUP is passed on to every CMD, and the replica
runs on. If the session's lease ends (etcd out of reach for --ttl, or the
lease revoked), every CMD is stopped and etcdlock exits 6: start it again
(a service manager's restart) to rejoin. A replica whose key under
NAME/members is deleted (etcdlock break) puts it again and runs on.

Each CMD runs in a process group of its own with standard input
/dev/null, its output etcdlock's. On Linux each runs under a supervisor,
as in 'etcdlock run': it dies with its shard's hold, and with etcdlock
even if etcdlock is killed with SIGKILL, before the lease lets another
replica take its shard; what CMD started is killed when CMD exits. On
other systems a killed etcdlock leaves CMD running.

A replica records who it is in its keys: by default the host, pid and
CMD's name; --identity S adds a name. 'etcdlock shards status' shows it.

status shows the set as etcd has it now: each member (MEMBER, its lease
ID in hex; its weight; how many shards it owns, and how many the
assignment gives it), then each shard (its owner, the owner's token,
where the assignment puts it, how many replicas wait for it, and whether
it is moving). Give the set's --count. --json prints it as one JSON
object:
  {"name":NAME,"revision":REV,"count":N,"moving":K,
   "members":[{"id":MEMBER,"weight":W,"owns":O,"assigned":A,
               "host":..,"pid":..,"command":..,"name":..}],
   "shards":[{"shard":I,"owner":MEMBER,"token":T,"assigned":MEMBER,
              "waiting":W,"moving":false}]}
An owner of "" is none (nobody has taken the shard yet, or a lock delay
keeps it free); a member's identity other than a replica's record is
"identity".

weight sets the weight of MEMBER, from 0 to 100 (the default): its share
of the shards is its weight over the sum of the members' weights. drain
is weight 0: MEMBER hands its shards over to the others, gracefully (each
CMD is stopped as for any move), and keeps none while it stays a member;
'weight NAME MEMBER 100' gives it its share back. The weight goes with
the member: a replica that starts again has the default. When every
member's weight is 0, they count as equal. weight and drain exit 4 when
MEMBER is not a member of NAME.

Exit codes: 0 left the set on SIGINT or SIGTERM (status, weight, drain:
done), 1 an error from etcd or the system, 2 usage, 3 cannot reach etcd,
4 weight, drain: MEMBER is not a member, 6 the session's lease ended and
every CMD was stopped, 126 CMD cannot be executed, 127 CMD not found.
` + connHelp

// shardsStatusHelp is the help of 'etcdlock shards status'.
const shardsStatusHelp = `Usage: etcdlock shards status [flags] NAME --count N

Shows the members of the shard set NAME of N shards and where each shard
is: its owner, its token, where the assignment puts it, and whether it is
moving ('etcdlock help shards' tells the columns and --json).
` + connHelp

// shardsWeightHelp is the help of 'etcdlock shards weight' and 'drain'.
const shardsWeightHelp = `Usage: etcdlock shards weight [flags] NAME MEMBER WEIGHT
       etcdlock shards drain [flags] NAME MEMBER

Sets the weight of MEMBER (its lease ID in hex, as 'etcdlock shards status'
shows it) in the shard set NAME, from 0 to 100; drain sets 0: MEMBER hands
its shards over and keeps none ('etcdlock help shards'). Exits 4 when
MEMBER is not a member of NAME.
` + connHelp

func cmdShards(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return cmdShardsStatus(args[1:], stdout, stderr)
		case "weight":
			return cmdShardsWeight("weight", args[1:], stdout, stderr)
		case "drain":
			return cmdShardsWeight("drain", args[1:], stdout, stderr)
		}
	}
	fset := newFlagSet("shards")
	var conn connFlags
	conn.register(fset)
	count := countFlag(fset)
	var ttl, grace, lockDelay time.Duration
	durationVar(fset, &ttl, "ttl", etcdlock.DefaultTTL, "lease `TTL`, rounded up to whole seconds (etcd's unit: 0.1 is 1s): if etcdlock dies, its shards pass on at most this long after")
	durationVar(fset, &grace, "grace", defaultGrace, "wait this `duration` between SIGTERM and SIGKILL to a CMD whose shard moves or is lost; at most --ttl/2 less a margin (default 10s, or --ttl/3 less the margin if that is less: see 'etcdlock help run')")
	durationVar(fset, &lockDelay, "lock-delay", 0, "if etcdlock dies owning a shard (or loses it), keep the shard free this `duration` after, rounded up to whole seconds, so that CMD's writes in flight land first (0: none); give it to every replica")
	identity := fset.String("identity", "", "a `name` for this replica, recorded in its keys with its host and pid, which status shows")
	quiet := fset.Bool("quiet", false, "do not say on standard error when a CMD starts (stops and problems are still said)")
	pos, cmdArgs, dashed, err := parseArgs(fset, args, 1, shardsHelp, stdout)
	if ee := (*exitError)(nil); errors.As(err, &ee) && ee.code == exitOK {
		printShardsFlags(stdout) // after the help: status's own flags
	}
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("shards", "missing shard set NAME")
	case dashed:
		return usageErr("shards", "missing shard set NAME before \"--\"")
	}
	name := pos[0]
	if err := shardNameErr(fset, "shards", name, *count); err != nil {
		return err
	}
	switch {
	case len(cmdArgs) == 0:
		return usageErr("shards", "missing CMD: 'etcdlock shards NAME --count N -- CMD [ARGS...]' runs CMD for each shard")
	case ttl <= 0:
		return usageErr("shards", "--ttl must be positive, not %v", ttl)
	case grace < 0:
		return usageErr("shards", "--grace must not be negative")
	case lockDelay < 0 || lockDelay > etcdlock.MaxLockDelay:
		return usageErr("shards", "--lock-delay must be between %v and %v, not %v", etcdlock.MinTTL, etcdlock.MaxLockDelay, lockDelay)
	case len(*identity) > etcdlock.MaxIdentityLen/2:
		return usageErr("shards", "--identity is %d bytes, longer than %d", len(*identity), etcdlock.MaxIdentityLen/2)
	}
	if lockDelay > 0 {
		lockDelay = leaseTTL(lockDelay)
	}
	if grace, err = graceFor(fset, "shards", grace, ttl); err != nil {
		return err
	}
	if err := setupConn(fset, &conn, "shards"); err != nil {
		return err
	}
	path, err := exec.LookPath(cmdArgs[0])
	if err != nil {
		return cmdErr(cmdArgs[0], err)
	}
	if err := conn.askPassword("shards", os.Stdin, stderr); err != nil {
		return err
	}
	r := &shardsRun{conn: &conn, name: name, n: *count, ttl: ttl, grace: grace, lockDelay: lockDelay, quiet: *quiet,
		path: path, args: cmdArgs, cmdName: filepath.Base(cmdArgs[0]), stdout: stdout, stderr: stderr,
		subs: map[*shardSub]struct{}{}, sups: map[int]bool{}}
	host, _ := os.Hostname()
	rec, _ := json.Marshal(runRecord{Queued: time.Now().UTC(), whoJSON: whoJSON{By: "etcdlock-shards", Name: *identity, Host: host, PID: os.Getpid(), Command: r.cmdName}})
	r.identity = string(rec)
	return r.main()
}

// printShardsFlags prints, after the help of shards, the flags that only
// status takes.
func printShardsFlags(w io.Writer) {
	fs := newFlagSet("shards status")
	fs.Bool("json", false, "status: print JSON")
	fmt.Fprintln(w, "\nFlags of 'shards status' (besides --count and the connection flags):")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// countFlag registers --count on fset.
func countFlag(fset *flag.FlagSet) *int {
	return fset.Int("count", 0, fmt.Sprintf("the number `N` of shards, 1 to %d: the same for every replica of the set", etcdlock.MaxShards))
}

// shardNameErr returns a usage error of command for a shard set name the
// library refuses, or a --count out of range (or not given in fset).
func shardNameErr(fset *flag.FlagSet, command, name string, count int) error {
	if err := nameErr(command, "shard set NAME", name); err != nil {
		return err
	}
	switch {
	case !given(fset, "count"):
		return usageErr(command, "missing --count N, the number of shards (the same for every replica)")
	case count < 1 || count > etcdlock.MaxShards:
		return usageErr(command, "--count must be from 1 to %d, not %d", etcdlock.MaxShards, count)
	}
	// The longest lock name the set uses: NAME/members, or its last shard.
	longest := max(len(name+"/members"), len(name+"/"+strconv.Itoa(count-1)))
	if longest > etcdlock.MaxNameLen {
		return usageErr(command, "shard set NAME is %d bytes: its locks' names (NAME/members) would be longer than %d", len(name), etcdlock.MaxNameLen)
	}
	return nil
}

// A shardsRun is one 'etcdlock shards NAME -- CMD': a replica of the set,
// on a session of its own, running CMD for each shard it owns.
type shardsRun struct {
	conn      *connFlags
	name      string
	n         int
	ttl       time.Duration
	grace     time.Duration
	lockDelay time.Duration
	quiet     bool
	identity  string // its keys' record
	path      string // CMD, looked up
	args      []string
	cmdName   string
	stdout    io.Writer
	stderr    io.Writer

	s       *etcdlock.Session
	leaving atomic.Bool // SIGINT or SIGTERM came: every shard is being released

	subsMu sync.Mutex             // guards subs
	subs   map[*shardSub]struct{} // the CMDs running, to tell of renewals and signals
	supsMu sync.Mutex             // guards sups; held while a supervisor starts
	// sups are the pids of the supervisors started and not yet waited
	// for: every other child of etcdlock is a stray (killStrays).
	sups map[int]bool
}

// A shardSub is what one running CMD is told: renewals of the session's
// lease, and the signals etcdlock passes on.
type shardSub struct {
	renewed chan struct{} // capacity 1
	sigc    chan os.Signal
}

// main connects, starts the session, runs the shards until a signal or
// the session's end, and returns the exit.
func (r *shardsRun) main() error {
	// From here on a signal must not kill etcdlock, whose lease would then
	// keep its shards for its TTL.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)

	cli, err := r.conn.connect(context.Background(), r.name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, signalsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(signalsDone)
		r.signals(stop, sigc, cancel)
	}()
	defer func() { close(stop); <-signalsDone }()

	gctx, gcancel := context.WithTimeout(ctx, r.conn.commandTimeout)
	s, err := etcdlock.NewSession(gctx, cli, etcdlock.WithTTL(max(r.ttl, etcdlock.MinTTL)), etcdlock.WithHooks(etcdlock.Hooks{
		RenewDone: func(i etcdlock.RenewDoneInfo) {
			if i.Err == nil {
				r.renewed()
			}
		},
	}))
	gerr := gctx.Err()
	gcancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil // a signal: nothing was joined
	case gerr != nil:
		return fmt.Errorf("start a session: no answer from etcd within %v (--command-timeout)", r.conn.commandTimeout)
	default:
		return fmt.Errorf("start a session: %w", err)
	}
	r.s = s
	defer func() {
		// Every shard is released (or was lost): the lease goes, with
		// anything of this replica left in etcd. Once the session has
		// ended etcd may not answer: the lease expires on its own.
		timeout := r.conn.commandTimeout
		if s.Err() != nil {
			timeout = min(timeout, lostCleanupTimeout)
		}
		revoke(context.Background(), s, cli, timeout)
	}()

	opts := []etcdlock.ShardOption{etcdlock.WithShardIdentity(r.identity)}
	if r.lockDelay > 0 {
		opts = append(opts, etcdlock.WithShardMutexOptions(etcdlock.WithLockDelay(r.lockDelay)))
	}
	err = etcdlock.RunShards(ctx, s, r.name, r.n, r.runShard, opts...)
	var ee *exitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ee):
		return err // CMD could not be started; the message says which shard
	case s.Err() != nil:
		return failf(exitLost, "left the shard set %q: the session ended (%s); every CMD was stopped", r.name, detail(s.Err()))
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("shard set %q: no answer from etcd within %v (--command-timeout)", r.name, r.conn.commandTimeout)
	}
	return r.conn.explain(fmt.Errorf("shard set %q: %w", r.name, err), "write key", r.name+"/members/"+fmt.Sprintf("%x", int64(s.Lease())), nil)
}

// signals acts on the signals etcdlock gets until stop is closed: the
// first SIGINT or SIGTERM leaves the set (cancel), a later one and SIGHUP
// are passed on to every CMD.
func (r *shardsRun) signals(stop <-chan struct{}, sigc <-chan os.Signal, cancel context.CancelFunc) {
	for {
		select {
		case <-stop:
			return
		case sig := <-sigc:
			if sig != syscall.SIGHUP && !r.leaving.Swap(true) {
				fmt.Fprintf(r.stderr, "etcdlock: %s: leaving the shard set %q; every CMD gets SIGTERM\n", sigName(sig), r.name)
				cancel()
				continue
			}
			r.subsMu.Lock()
			for sub := range r.subs {
				select {
				case sub.sigc <- sig:
				default:
				}
			}
			r.subsMu.Unlock()
		}
	}
}

// renewed tells every running CMD's watch that the lease was renewed.
func (r *shardsRun) renewed() {
	r.subsMu.Lock()
	defer r.subsMu.Unlock()
	for sub := range r.subs {
		select {
		case sub.renewed <- struct{}{}:
		default:
		}
	}
}

// runShard is RunShards's fn: it runs CMD for shard sh until CMD exits
// or ctx ends (the shard moves or is lost, or the replica leaves), and
// returns once CMD is gone. An error ends the replica: CMD cannot be
// started.
func (r *shardsRun) runShard(ctx context.Context, sh etcdlock.Shard) error {
	held := fmt.Sprintf("shard %d of %q", sh.Num, r.name)
	cmdName := fmt.Sprintf("%s (shard %d)", r.cmdName, sh.Num)
	cmd := exec.Command(r.path, r.args[1:]...)
	cmd.Args[0] = r.args[0]
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr // Stdin: /dev/null
	cmd.Env = append(os.Environ(),
		"ETCDLOCK_NAME="+r.name,
		"ETCDLOCK_SHARD="+strconv.Itoa(sh.Num),
		"ETCDLOCK_SHARDS="+strconv.Itoa(r.n),
		"ETCDLOCK_TOKEN="+strconv.FormatInt(sh.Token, 10),
		"ETCDLOCK_KEY="+sh.Key(),
		"ETCDLOCK_LEASE="+fmt.Sprintf("%x", int64(r.s.Lease())),
	)
	sub := &shardSub{renewed: make(chan struct{}, 1), sigc: make(chan os.Signal, 4)}
	r.supsMu.Lock()
	ch, waitc, err := startChild(cmd, true, false, r.grace, false)
	if err == nil {
		r.sups[ch.cmd.Process.Pid] = true
	}
	r.supsMu.Unlock()
	if err != nil {
		return cmdErr(r.args[0], err)
	}
	r.subsMu.Lock()
	r.subs[sub] = struct{}{}
	r.subsMu.Unlock()
	if !r.quiet {
		fmt.Fprintf(r.stderr, "etcdlock: %s: started %s (token %d)\n", held, r.cmdName, sh.Token)
	}
	w := &cmdWatch{ch: ch, waitc: waitc, s: r.s, renewed: sub.renewed, grace: r.grace, cmdName: cmdName, held: held, stderr: r.stderr,
		ended: ctx.Done(),
		why: func() error {
			switch cause := context.Cause(ctx); {
			case r.leaving.Load():
				return nil
			case r.s.Err() != nil:
				return r.s.Err()
			case errors.Is(cause, etcdlock.ErrLockLost):
				return cause
			}
			return nil // moved
		},
		stopMsg: func(lostErr error) string {
			switch {
			case lostErr != nil:
				return fmt.Sprintf("lost %s while %s ran (%s)", held, cmdName, detail(lostErr))
			case r.leaving.Load():
				return "leaving " + held
			}
			return held + " moves to another replica"
		},
		sigc:     sub.sigc,
		onSignal: func(sig os.Signal) { ch.signal(sig) },
	}
	end := w.watch()
	code := exitFailure
	var ee *exec.ExitError
	if end.waitErr == nil || errors.As(end.waitErr, &ee) {
		code = exitStatus(ch.cmd.ProcessState)
	}
	r.subsMu.Lock()
	delete(r.subs, sub)
	r.subsMu.Unlock()
	r.supsMu.Lock()
	delete(r.sups, ch.cmd.Process.Pid)
	sig := ch.closed()
	if sig != nil {
		// Before the shard is released: what CMD started is killed now.
		killStrays(func(pid int) bool { return r.sups[pid] })
	}
	r.supsMu.Unlock()
	switch {
	case sig != nil:
		fmt.Fprintf(r.stderr, "etcdlock: the supervisor of %s (%s %s, pid %d) was killed by %s: %s and every process it started were killed\n",
			cmdName, filepath.Base(os.Args[0]), superviseCmd, ch.cmd.Process.Pid, sigName(sig), cmdName)
	case end.stoppedEarly:
		fmt.Fprintf(r.stderr, "etcdlock: %s was stopped before %s could pass on, as etcd did not confirm renewals of the lease in time; it exited with status %d\n", cmdName, held, code)
	case ctx.Err() == nil:
		fmt.Fprintf(r.stderr, "etcdlock: %s exited with status %d; it starts again after a pause while this replica owns %s\n", cmdName, code, held)
	}
	if end.waitErr != nil && ee == nil {
		fmt.Fprintf(r.stderr, "etcdlock: wait for %s: %s\n", cmdName, detail(end.waitErr))
	}
	return nil
}

// shardsJSON is the output of shards status --json.
type shardsJSON struct {
	Name     string            `json:"name"`
	Revision int64             `json:"revision"` // etcd revision of the read
	Count    int               `json:"count"`
	Moving   int               `json:"moving"` // shards not where the assignment puts them
	Members  []shardMemberJSON `json:"members"`
	Shards   []shardJSON       `json:"shards"`
}

type shardMemberJSON struct {
	ID       string `json:"id"` // the lease in hex: MEMBER
	Weight   int    `json:"weight"`
	Owns     int    `json:"owns"`
	Assigned int    `json:"assigned"`
	whoJSON
	// Identity is a library replica's WithShardIdentity, when it is not
	// etcdlock shards' record.
	Identity identityJSON `json:"identity,omitempty"`
}

type shardJSON struct {
	Num      int    `json:"shard"`
	Owner    string `json:"owner"` // "": none
	Token    int64  `json:"token,omitempty"`
	Assigned string `json:"assigned"`
	Waiting  int    `json:"waiting"`
	Moving   bool   `json:"moving"`
}

func cmdShardsStatus(args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("shards status")
	var conn connFlags
	conn.register(fset)
	count := countFlag(fset)
	asJSON := fset.Bool("json", false, "print JSON")
	pos, rest, _, err := parseArgs(fset, args, 1, shardsStatusHelp, stdout)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("shards status", "missing shard set NAME")
	}
	if len(rest) > 0 {
		return usageErr("shards status", "unexpected argument %q after NAME", rest[0])
	}
	name := pos[0]
	if err := shardNameErr(fset, "shards status", name, *count); err != nil {
		return err
	}
	cli, err := openConn(fset, &conn, "shards status", name+"/", stderr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	set, err := etcdlock.InspectShards(ctx, cli, name, *count)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("read shard set %q: no answer from etcd within %v (--command-timeout)", name, conn.commandTimeout)
	case err != nil:
		return fmt.Errorf("read shard set %q: %w", name, conn.explain(err, "read the keys with prefix", name+"/", nil))
	}
	st := newShardsJSON(set)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printShards(stdout, st)
	return nil
}

// newShardsJSON tells set.
func newShardsJSON(set *etcdlock.ShardSet) *shardsJSON {
	st := &shardsJSON{Name: set.Name, Revision: set.Revision, Count: len(set.Shards), Members: []shardMemberJSON{}, Shards: []shardJSON{}}
	for _, m := range set.Members {
		mj := shardMemberJSON{ID: m.ID, Weight: m.Weight, Owns: m.Owns, Assigned: m.Assigned}
		if rec, ok := parseRunRecord(m.Identity); ok {
			mj.whoJSON = rec.whoJSON
		} else {
			mj.Identity = identityJSON(m.Identity)
		}
		st.Members = append(st.Members, mj)
	}
	for _, sh := range set.Shards {
		st.Shards = append(st.Shards, shardJSON{Num: sh.Num, Owner: sh.Owner, Token: sh.Token, Assigned: sh.Assigned, Waiting: sh.Waiting, Moving: sh.Moving()})
		if sh.Moving() {
			st.Moving++
		}
	}
	return st
}

// printShards prints st as two tables: the members, then the shards.
func printShards(w io.Writer, st *shardsJSON) {
	state := "settled: every shard where the assignment puts it"
	switch {
	case len(st.Members) == 0:
		state = "no shard runs"
	case st.Moving > 0:
		state = fmt.Sprintf("%d moving", st.Moving)
	}
	fmt.Fprintf(w, "shard set %q: %d shards, %d members, %s (etcd revision %d)\n", st.Name, st.Count, len(st.Members), state, st.Revision)
	if len(st.Members) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tWEIGHT\tOWNS\tASSIGNED\tIDENTITY")
		for _, m := range st.Members {
			who := safeText(string(m.Identity))
			if m.PID != 0 || m.Host != "" || m.By != "" {
				who = m.who()
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", m.ID, m.Weight, m.Owns, m.Assigned, who)
		}
		tw.Flush()
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tOWNER\tTOKEN\tASSIGNED\tWAITING\tSTATE")
	for _, sh := range st.Shards {
		owner, token, assigned, state := sh.Owner, strconv.FormatInt(sh.Token, 10), sh.Assigned, ""
		if owner == "" {
			owner, token = "-", "-"
		}
		if assigned == "" {
			assigned = "-"
		}
		switch {
		case sh.Moving:
			state = "moving"
		case sh.Owner == "":
			state = "free" // no member to own it
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\n", sh.Num, owner, token, assigned, sh.Waiting, state)
	}
	tw.Flush()
}

func cmdShardsWeight(sub string, args []string, stdout, stderr io.Writer) error {
	command := "shards " + sub
	fset := newFlagSet(command)
	var conn connFlags
	conn.register(fset)
	want := 3
	if sub == "drain" {
		want = 2
	}
	pos, rest, _, err := parseArgs(fset, args, want, shardsWeightHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr(command, "missing shard set NAME")
	case len(pos) == 1:
		return usageErr(command, "missing MEMBER, a member's lease ID in hex ('etcdlock shards status NAME --count N' lists them)")
	case len(pos) == 2 && sub == "weight":
		return usageErr(command, "missing WEIGHT, from 0 to %d", etcdlock.FullShardWeight)
	case len(rest) > 0:
		return usageErr(command, "unexpected argument %q", rest[0])
	}
	name := pos[0]
	if err := nameErr(command, "shard set NAME", name); err != nil {
		return err
	}
	id, err := strconv.ParseInt(pos[1], 16, 64)
	if err != nil || id <= 0 {
		return usageErr(command, "MEMBER %q is not a lease ID in hex, as 'etcdlock shards status' shows it", pos[1])
	}
	weight := 0
	if sub == "weight" {
		weight, err = strconv.Atoi(pos[2])
		if err != nil || weight < 0 || weight > etcdlock.FullShardWeight {
			return usageErr(command, "WEIGHT must be a whole number from 0 to %d, not %q", etcdlock.FullShardWeight, pos[2])
		}
	}
	cli, err := openConn(fset, &conn, command, name+"/", stderr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	member := fmt.Sprintf("%x", id)
	switch err := etcdlock.SetShardWeight(ctx, cli, name, clientv3.LeaseID(id), weight); {
	case errors.Is(err, etcdlock.ErrNotInQueue):
		return failf(exitHeld, "%s is not a member of the shard set %q ('etcdlock shards status %s --count N' lists them)", member, name, name)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("set the weight of %s in shard set %q: no answer from etcd within %v (--command-timeout)", member, name, conn.commandTimeout)
	case err != nil:
		return fmt.Errorf("set the weight of %s in shard set %q: %w", member, name, conn.explain(err, "write key", name+"/members/"+member+"/weight", nil))
	}
	if weight == 0 {
		fmt.Fprintf(stdout, "drained %s in shard set %q: it hands its shards over and keeps none while it stays a member (etcdlock shards weight %s %s %d gives them back)\n", member, name, name, member, etcdlock.FullShardWeight)
		return nil
	}
	fmt.Fprintf(stdout, "set the weight of %s in shard set %q to %d\n", member, name, weight)
	return nil
}
