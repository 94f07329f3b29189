package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const runHelp = `Usage: etcdlock run [flags] NAME -- CMD [ARGS...]
       etcdlock run [flags] NAME

Waits for the lock NAME (first come, first served), runs CMD while holding
it, releases it when CMD exits, and exits with CMD's exit code.

By default the lock is exclusive (a Mutex, or an RWMutex's write lock: one
holder at a time). With --shared it is a read lock of an RWMutex: runs
with --shared hold together while no exclusive run holds or waits ahead
of them. With --permits N --of C it is N permits of a Semaphore of C: runs
hold together while their permits fit C ('consul lock -n C' is --permits 1
--of C, and -n C is taken as that). All modes share one queue, first come, first served: an
exclusive run excludes every other, and a waiter waits for those ahead of
it, even where it would fit (no overtaking). 'etcdlock status' and
'etcdlock ls' show each key's mode.

With --min-hold D the lock stays taken until D after it was taken, even
once CMD has exited: a job that several hosts fire on the same schedule,
with --try, runs once per tick though their clocks disagree by less than D
(choose D above that skew, below the interval less it). etcdlock waits
for nothing at exit: etcd keeps the rest on a lease. Give it to every run
of the name.

With --also NAME2 (repeated for more names) it holds NAME and every NAME2
at once, or none of them: a MultiMutex, whose keys join every name's queue
in one write. Runs over overlapping names, given in any order, never
deadlock, and each name stays first come, first served. The progress shown
is NAME's queue.

With --on-release SIGNAL, a request to release the lock ('etcdlock release
NAME', or the library's RequestRelease) is passed on to CMD as SIGNAL: CMD
decides, and the lock is released when CMD exits. Without it a request is
ignored, and etcdlock says so on standard error.

Without CMD, as 'etcdctl lock NAME', it prints the lock's key on standard
output once it holds the lock, and holds it until SIGINT, SIGTERM or SIGHUP;
then it releases the lock and exits 0, or exits 6 as soon as the lock is
lost.

CMD finds in its environment:
  ETCDLOCK_NAME    the lock name
  ETCDLOCK_KEY     the lock key, NAME/<lease ID in hex>   (also ETCD_LOCK_KEY)
  ETCDLOCK_NAMES   with --also: every name, NAME first, one per line
  ETCDLOCK_KEYS    with --also: every key, in the order of the names, one
                   per line; all share ETCDLOCK_TOKEN
  ETCDLOCK_TOKEN   the fencing token: the key's create revision, higher for
                   every later holder; pass it to what CMD writes to, so
                   that a stale holder can be refused
  ETCDLOCK_LEASE   the lease ID in hex
  ETCD_LOCK_REV    as 'etcdctl lock' sets it: the etcd revision of the
                   response that granted the lock

Fence on ETCDLOCK_TOKEN. It names the hold itself: it stays the same for
the whole hold, 'etcdlock status' shows it, and etcd can check it (the
create revision of ETCDLOCK_KEY; a Txn comparing it guards a write to etcd
by the lock). ETCD_LOCK_REV is only the moment of the grant: it rises from
one holder to the next too, but no key in etcd carries it. It is there for
scripts written for 'etcdctl lock', and in a fleet that mixes both tools it
is the one number both set with the same meaning.

The lock lives as long as etcdlock renews its lease: if etcdlock dies, the
lock passes on at most --ttl later.

With authentication on etcd 3.4, give etcd an --auth-token-ttl longer than
the longest run (it is 300s by default): this etcdlock's etcd client hangs
on its first request after its token expired there, so the release waits
out --command-timeout, and the lock passes on only when the lease runs
out. etcd 3.5 and newer are not affected.

` + stoppingHelp + `

SIGINT, SIGTERM and SIGHUP are passed on to CMD; while etcdlock still waits
they make it leave the queue and exit 128+N. Unless standard input is the
terminal etcdlock runs in the foreground of, CMD runs in a process group of
its own, and signals reach its children too. With the terminal as standard
input, CMD shares etcdlock's process group: Ctrl-C reaches it from the
terminal (etcdlock sends no second SIGINT), and a lost lock signals CMD only.

` + diesWithParentHelp + `

A waiter that loses its place in the queue does not give up: if its
session ends (its lease was revoked or expired, or could not be renewed in
time, as happens in a leader election while etcd keeps the lease), it
revokes that lease, says so on standard error, and joins again at the back
with a new session; if its key was deleted, it joins again with the same
session. --timeout counts from the first join. Only waiting works this way:
a holder whose session ends has lost the lock.

While it waits, etcdlock shows its place in the queue on standard error (one
line updated in place on a terminal; a line per change otherwise). The write that
joins the queue records in its key's value the time it joined (by its own
clock), host, pid and CMD's name, for 'etcdlock status' and 'etcdlock ls':
no write of its own.
` + connHelp + "\n" + exitCodesHelp

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("run")
	var conn connFlags
	conn.register(fset)
	var ttl, timeout, grace time.Duration
	durationVar(fset, &ttl, "ttl", etcdlock.DefaultTTL, "lease `TTL`, rounded up to whole seconds (etcd's unit: 0.1 is 1s): if etcdlock dies, the lock passes on at most this long after")
	durationVar(fset, &timeout, "timeout", 0, "give up waiting after this `duration`, counted from the first join, and exit 5 (0: wait for ever)")
	var try tryFlag
	fset.Var(&try, "try", "do not wait: exit 4 if the lock cannot be taken at once (it is held, or has waiters); --try=`DURATION` (consul's -try=5s) waits at most that long instead, as --timeout does")
	durationVar(fset, &grace, "grace", defaultGrace, "wait this `duration` between SIGTERM and SIGKILL to CMD, when the lock is lost or etcd has not confirmed renewals for so long that it could pass on; at most --ttl/2 less a margin (default 10s, or --ttl/3 less the margin if that is less: see Stopping CMD below)")
	keepChildren := fset.Bool("keep-children", false, "when CMD exits, leave the processes it started running, outside the lock (default: kill them before the release)")
	pidns := fset.Bool("pid-namespace", false, "Linux: run CMD in a PID namespace of its own, so that all it starts dies even if etcdlock and its supervisor are killed at once (CMD then sees pids of its own; without root it needs user namespaces)")
	quiet := fset.Bool("quiet", false, "show no progress while waiting")
	shared := fset.Bool("shared", false, "take a read lock (an RWMutex's): hold together with other --shared runs")
	var permits, capacity int64
	fset.Int64Var(&permits, "permits", 0, "take `N` permits of a Semaphore (with --of): hold together while the permits fit its capacity")
	fset.Int64Var(&capacity, "of", 0, "the Semaphore's capacity `C`, in permits (with --permits)")
	var consulN int64
	fset.Int64Var(&consulN, "n", 0, "consul lock's -n: one of `N` holders at once, the same as --permits 1 --of N")
	onRelease := onReleaseFlag(fset)
	var lockDelay time.Duration
	durationVar(fset, &lockDelay, "lock-delay", 0, "if etcdlock dies holding the lock (or loses it), keep the lock free this `duration` after, rounded up to whole seconds, so that CMD's writes in flight land first (0: none)")
	var minHold time.Duration
	durationVar(fset, &minHold, "min-hold", 0, "keep the lock taken until this `duration` after it was taken, even once CMD has exited, so that a job fired by several hosts whose clocks disagree runs once (0: none)")
	var also []string
	fset.Func("also", "also hold the lock `NAME2`, all at once with NAME (repeat for more names)", func(v string) error {
		also = append(also, v)
		return nil
	})
	pos, cmdArgs, dashed, err := parseArgs(fset, args, 1, runHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("run", "missing lock NAME")
	case dashed:
		// 'run -- true': the "--" starts CMD, NAME is missing.
		return usageErr("run", "missing lock NAME before \"--\"")
	}
	if err := nameErr("run", "lock NAME", pos[0]); err != nil {
		return err
	}
	switch {
	case ttl <= 0:
		return usageErr("run", "--ttl must be positive, not %v", ttl)
	case timeout < 0:
		return usageErr("run", "--timeout must not be negative")
	case grace < 0:
		return usageErr("run", "--grace must not be negative")
	case detachedTry(args) != "":
		v := detachedTry(args)
		return usageErr("run", "--try %s: --try takes no value apart from it; write --try=%s to wait at most %s (consul's -try=%s), or --try=true %s to try the lock named %q", v, v, v, v, v, v)
	case try.wait > 0 && timeout > 0:
		return usageErr("run", "--try=%v and --timeout exclude each other: both bound the wait", try.wait)
	case try.on && timeout > 0:
		return usageErr("run", "--try and --timeout exclude each other")
	case lockDelay < 0 || lockDelay > etcdlock.MaxLockDelay:
		return usageErr("run", "--lock-delay must be between %v and %v, not %v", etcdlock.MinTTL, etcdlock.MaxLockDelay, lockDelay)
	case lockDelay != 0 && len(also) > 0:
		return usageErr("run", "--lock-delay does not go with --also: a MultiMutex takes no lock delay")
	case minHold != 0 && (minHold < time.Millisecond || minHold > etcdlock.MaxLockDelay):
		return usageErr("run", "--min-hold must be between 1ms and %v, not %v", etcdlock.MaxLockDelay, minHold)
	case minHold != 0 && (len(also) > 0 || *shared || permits != 0 || consulN != 0):
		return usageErr("run", "--min-hold is for an exclusive lock: it does not go with --also, --shared, --permits or -n")
	}
	if lockDelay > 0 {
		// Whole seconds, rounded up, as its help says: 0.5 is 1s.
		lockDelay = leaseTTL(lockDelay)
	}
	if grace, err = graceFor(fset, "run", grace, ttl); err != nil {
		return err
	}
	mode, err := runMode(fset, *shared, permits, capacity, consulN)
	if err != nil {
		return err
	}
	if err := checkAlso(pos[0], also, mode); err != nil {
		return err
	}
	if err := setupConn(fset, &conn, "run"); err != nil {
		return err
	}
	if *onRelease != nil && len(cmdArgs) == 0 {
		return usageErr("run", "--on-release passes a request on to CMD: give CMD")
	}
	if err := checkPIDNamespace("run", *pidns, *keepChildren, len(cmdArgs) > 0); err != nil {
		return err
	}
	if *keepChildren && len(cmdArgs) == 0 {
		return usageErr("run", "--keep-children is about the processes CMD starts: give CMD")
	}
	r := &lockRun{conn: &conn, name: pos[0], also: also, ttl: ttl, stderr: stderr, mode: mode, onRelease: *onRelease, lockDelay: lockDelay, minHold: minHold, keepChildren: *keepChildren, pidNamespace: *pidns}
	if try.wait > 0 {
		timeout = try.wait
	}
	return r.main(cmdArgs, try.on, timeout, *quiet, grace, stdout)
}

// runMode returns the mode run's flags ask for: exclusive (the zero
// KeyMode), shared, or permits; a usage error for a combination that
// means nothing.
func runMode(fset *flag.FlagSet, shared bool, permits, capacity, consulN int64) (etcdlock.KeyMode, error) {
	given := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["n"] {
		switch {
		case shared || given["permits"] || given["of"]:
			return etcdlock.KeyMode{}, usageErr("run", "-n N is --permits 1 --of N: give one or the other, not both")
		case consulN < 1:
			return etcdlock.KeyMode{}, usageErr("run", "-n must be at least 1, not %d", consulN)
		}
		return etcdlock.KeyMode{Weight: 1, Capacity: consulN}, nil
	}
	switch {
	case shared && (given["permits"] || given["of"]):
		return etcdlock.KeyMode{}, usageErr("run", "--shared and --permits/--of exclude each other")
	case shared:
		return etcdlock.KeyMode{Shared: true}, nil
	case given["permits"] && !given["of"]:
		return etcdlock.KeyMode{}, usageErr("run", "--permits needs --of, the Semaphore's capacity")
	case given["of"] && !given["permits"]:
		return etcdlock.KeyMode{}, usageErr("run", "--of needs --permits, how many permits to take")
	case !given["permits"]:
		return etcdlock.KeyMode{}, nil
	case capacity < 1:
		return etcdlock.KeyMode{}, usageErr("run", "--of must be at least 1, not %d", capacity)
	case permits < 1 || permits > capacity:
		return etcdlock.KeyMode{}, usageErr("run", "--permits must be from 1 to --of (%d), not %d", capacity, permits)
	}
	return etcdlock.KeyMode{Weight: permits, Capacity: capacity}, nil
}

// onReleaseFlag registers --on-release on fset: the signal that passes a
// request to release (etcdlock release) on to CMD; nil when not given.
func onReleaseFlag(fset *flag.FlagSet) *os.Signal {
	sig := new(os.Signal)
	fset.Func("on-release", "when asked to release ('etcdlock release NAME'), send CMD this `SIGNAL` (TERM, USR1, HUP...; default: none, the request is ignored)", func(v string) error {
		s, err := parseSignal(v)
		*sig = s
		return err
	})
	return sig
}

// checkAlso returns a usage error for --also names that a MultiMutex over
// name and them would refuse, or that go with another mode than
// exclusive.
func checkAlso(name string, also []string, mode etcdlock.KeyMode) error {
	switch {
	case len(also) == 0:
		return nil
	case !mode.Exclusive():
		return usageErr("run", "--also takes exclusive locks only: not with --shared or --permits")
	case len(also)+1 > etcdlock.MaxMultiNames:
		return usageErr("run", "%d names, more than %d (one etcd Txn carries every key)", len(also)+1, etcdlock.MaxMultiNames)
	}
	seen, total := map[string]bool{name: true}, len(name)
	for _, n := range also {
		if err := nameErr("run", "--also NAME", n); err != nil {
			return err
		}
		if seen[n] {
			return usageErr("run", "lock NAME %q given twice", n)
		}
		seen[n], total = true, total+len(n)
	}
	if total > etcdlock.MaxNameLen {
		return usageErr("run", "the names are %d bytes in all, longer than %d (one etcd Txn carries every key)", total, etcdlock.MaxNameLen)
	}
	return nil
}

// main is what run and elect do once their flags are checked: look CMD
// up, connect, queue (with try, try once; with a timeout, give up after
// it), and run CMD (nil: hold until a signal) while holding.
func (r *lockRun) main(cmdArgs []string, try bool, timeout time.Duration, quiet bool, grace time.Duration, stdout io.Writer) error {
	command := "run"
	if r.elect != nil {
		command = "elect"
	}
	// Look CMD up before queueing: a typo must not wait its turn.
	var cmd *exec.Cmd // nil: hold the lock until a signal
	if len(cmdArgs) > 0 {
		if _, err := exec.LookPath(cmdArgs[0]); err != nil {
			return cmdErr(cmdArgs[0], err)
		}
		cmd = exec.Command(cmdArgs[0], cmdArgs[1:]...)
		r.cmdName = filepath.Base(cmdArgs[0])
	}
	// Before signals are caught: Ctrl-C at the prompt must end etcdlock.
	if err := r.conn.askPassword(command, os.Stdin, r.stderr); err != nil {
		return err
	}

	// From here on a signal must not kill etcdlock, whose lease would then
	// linger for its TTL: until CMD runs, it ends the run cleanly.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	r.sigc = sigc

	cli, err := r.conn.connect(context.Background(), r.name+"/")
	if err != nil {
		return err
	}
	defer cli.Close()
	r.cli = cli
	if err := r.startSession(context.Background()); err != nil {
		return err
	}
	// Revokes the lease: whatever is left of this run in etcd goes now.
	defer r.endSession(context.Background(), true)
	if err := r.acquire(try, timeout, quiet); err != nil {
		return err
	}
	if cmd == nil {
		return r.hold(stdout)
	}
	return r.runLocked(cmd, grace, stdout)
}

// diesWithParentHelp tells, in run's and elect's help, what becomes of
// CMD when etcdlock is killed.
const diesWithParentHelp = `CMD and every process it starts run only while the lock is held. On Linux
CMD runs under a small supervisor (etcdlock __supervise), and each of
etcdlock, supervisor, CMD is tied to the one before: if etcdlock dies
(SIGKILL, the OOM killer), the supervisor kills CMD and all it started; if
the supervisor dies, CMD gets SIGKILL from the kernel and etcdlock kills
what CMD started; either way before the lease lets the next holder in.
Processes are reached wherever they moved (a process group or session of
their own, a double fork): etcdlock and the supervisor are child
subreapers, so orphans are handed to them, not to init. When CMD exits,
what it left running is killed before the lock is released, unless
--keep-children (then it runs on outside the lock). One gap is left: if
etcdlock and the supervisor are both killed at once (pkill -9 -f
etcdlock), CMD dies, but processes CMD started are handed to init and run
on. --pid-namespace closes it: CMD runs in a PID namespace whose init is
the supervisor, and the kernel kills all of it when the supervisor dies,
however it dies. CMD then sees pids of its own namespace ($$ is not the
pid 'ps' shows outside), and without root it needs user namespaces
(where sudo in CMD cannot work). On other systems CMD runs in a process group of its own, what is left
of the group is killed when CMD exits, and if etcdlock is killed, CMD runs
on and may overlap the next holder once the lease expires.`

// stoppingHelp tells, in run's and elect's help, when and how CMD is
// stopped, and what --grace may be.
const stoppingHelp = `Stopping CMD: CMD is gone before the lock can pass on. etcd can expire
the lease --ttl after the newest renewal it received; CMD gets SIGKILL at
the latest a margin before that (the larger of 500ms and --ttl/20), and
SIGTERM --grace before the SIGKILL. So when renewals have failed for
--ttl less --grace less the margin (etcd out of reach, or paused), CMD is
stopped, and etcdlock exits 7 once CMD has exited (the lock may still
have been held; it is released, or goes with the lease). The supervisor
keeps the same deadline, and stops CMD by it even if etcdlock cannot (it
is paused or starved). --grace may be at most --ttl/2 less the margin, so
that one slow renewal does not stop CMD; by default it is 10s, or
--ttl/3 less the margin if that is less (4.25s at the default --ttl of
15s; at --ttl 60s, 10s). If the lock is lost while CMD runs (the key was
deleted, the lease revoked, or the session ended), CMD gets SIGTERM, then
SIGKILL after --grace (sooner if the lease's deadline comes first), and
etcdlock exits 6 as soon as CMD has exited: it tries to revoke the lease
for a second at most (etcd may be out of reach; the lease expires on its
own).`

// cmdErr explains why CMD cannot be started.
func cmdErr(name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return failf(exitNotFound, "CMD %q not found", name)
	case errors.Is(err, exec.ErrDot):
		return failf(exitNotFound, "CMD %q not found in $PATH (it is in the current directory: run ./%s)", name, name)
	default:
		return failf(exitCannotExec, "cannot run CMD %q: %v", name, err)
	}
}

// lostCleanupTimeout bounds the cleanup once the lock is known lost. The
// lease then expires on its own within its TTL, and etcd may be out of
// reach: waiting longer for it would only delay the exit, and with it
// whatever runs the next attempt.
const lostCleanupTimeout = time.Second

// A lockRun is one 'etcdlock run' or 'etcdlock elect' once connected: the
// session and Mutex (or Election) it waits for and holds the lock (or
// leadership) through, and what it needs to report. Its methods are called
// from one goroutine.
type lockRun struct {
	cli    *clientv3.Client
	conn   *connFlags
	name   string
	ttl    time.Duration
	sigc   <-chan os.Signal // SIGINT, SIGTERM, SIGHUP to etcdlock
	stderr io.Writer
	// elect makes the run a candidate of the election name proposing
	// value, rather than a locker of the lock name.
	elect *candidacy
	// also are the other names of a MultiMutex over name and them; nil
	// for a lock of name alone.
	also []string
	// onRelease is sent to CMD when the hold is asked to release
	// (--on-release); nil: a request is ignored.
	onRelease os.Signal
	// lockDelay is --lock-delay's (etcdlock.WithLockDelay); 0 for none.
	lockDelay time.Duration
	// minHold is --min-hold's (etcdlock.WithMinHold); 0 for none.
	minHold time.Duration
	// mode is what a locker takes: the lock alone (the zero KeyMode), a
	// read lock (Shared), or permits (Weight of Capacity).
	mode etcdlock.KeyMode

	s      *etcdlock.Session // nil between two sessions
	m      holdable          // of s
	lost   bool              // the lock is known lost: cleanup is best effort, and short
	shown  bool              // progress was shown while waiting
	joined time.Time         // when the run first joined the queue
	// cmdName is CMD's name, without arguments, for the key's identity;
	// "" without CMD.
	cmdName string
	// keepChildren leaves what CMD started running when CMD exits
	// (--keep-children).
	keepChildren bool
	// pidNamespace runs CMD in a PID namespace of the supervisor's
	// (--pid-namespace, Linux).
	pidNamespace bool
	// renewed gets a value after a renewal of s's lease has moved its
	// Expiry.
	renewed chan struct{}
}

// holdable is what a lockRun waits for and holds: a Mutex, or a candidacy
// in an election.
type holdable interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Done() <-chan struct{}
	Err() error
	ReleaseRequested() <-chan struct{}
	Token() int64
	Key() string
	Header() *pb.ResponseHeader
	IsOwner() clientv3.Cmp
}

// newHold returns what the run waits for and holds through session s. A
// lock records who runs it, and when it joined the queue, in the Put that
// joins it (etcdlock.WithIdentity): no write of its own. A candidate's
// value is its proposal, which observers read: it records nothing.
func (r *lockRun) newHold(s *etcdlock.Session) holdable {
	if r.elect != nil {
		return &candidate{Election: etcdlock.NewElection(s, r.name), value: r.elect.value}
	}
	opts := []etcdlock.MutexOption{etcdlock.WithIdentity(newRunRecord(r.cmdName))}
	if r.lockDelay > 0 {
		opts = append(opts, etcdlock.WithLockDelay(r.lockDelay))
	}
	if r.minHold > 0 {
		opts = append(opts, etcdlock.WithMinHold(r.minHold))
	}
	switch {
	case r.mode.Shared:
		return reader{etcdlock.NewRWMutex(s, r.name, opts...)}
	case r.mode.Weight > 0:
		return permits{etcdlock.NewSemaphore(s, r.name, r.mode.Capacity, opts...), r.mode.Weight}
	case len(r.also) > 0:
		return multi{etcdlock.NewMultiMutex(s, r.names(), opts...), r.name}
	}
	return etcdlock.NewMutex(s, r.name, opts...)
}

// names returns every name the run locks: NAME, then --also's.
func (r *lockRun) names() []string { return append([]string{r.name}, r.also...) }

// multi is a MultiMutex seen as a lock of its first name, for lockRun:
// its Key and IsOwner are that name's.
type multi struct {
	*etcdlock.MultiMutex
	name string
}

func (m multi) Key() string           { return m.Keys()[0] }
func (m multi) IsOwner() clientv3.Cmp { return m.MultiMutex.IsOwner(m.name) }

// A reader is an RWMutex's read lock seen as a lock, for lockRun.
type reader struct{ *etcdlock.RWMutex }

func (r reader) Lock(ctx context.Context) error    { return r.RLock(ctx) }
func (r reader) TryLock(ctx context.Context) error { return r.TryRLock(ctx) }
func (r reader) Unlock(ctx context.Context) error  { return r.RUnlock(ctx) }

// permits are n permits of a Semaphore seen as a lock, for lockRun.
type permits struct {
	*etcdlock.Semaphore
	n int64
}

func (p permits) Lock(ctx context.Context) error    { return p.Acquire(ctx, p.n) }
func (p permits) TryLock(ctx context.Context) error { return p.TryAcquire(ctx, p.n) }
func (p permits) Unlock(ctx context.Context) error  { return p.Release(ctx) }

// what names what the run queues for, for messages: lock "NAME" or
// election "NAME".
func (r *lockRun) what() string {
	switch {
	case r.elect != nil:
		return fmt.Sprintf("election %q", r.name)
	case len(r.also) > 0:
		quoted := make([]string, len(r.names()))
		for i, n := range r.names() {
			quoted[i] = strconv.Quote(n)
		}
		return "locks " + strings.Join(quoted, ", ")
	}
	return fmt.Sprintf("lock %q", r.name)
}

// held names what the run holds once it got it: lock "NAME", a read lock
// of lock "NAME", 2 of 5 permits of lock "NAME", or leadership of election
// "NAME".
func (r *lockRun) held() string {
	switch {
	case r.elect != nil:
		return "leadership of " + r.what()
	case r.mode.Shared:
		return "a read lock of " + r.what()
	case r.mode.Weight > 0:
		return fmt.Sprintf("%d of %d permits of %s", r.mode.Weight, r.mode.Capacity, r.what())
	}
	return r.what()
}

// startSession starts the session whose lease the lock's key is bound to.
// Granting the lease may take until ctx ends or --command-timeout passes.
func (r *lockRun) startSession(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, r.conn.commandTimeout)
	defer cancel()
	// --ttl rounds up to whole seconds, as etcd counts them: a TTL below
	// the first second is that second, which WithTTL alone would refuse.
	r.renewed = make(chan struct{}, 1)
	renewed := r.renewed // this session's
	s, err := etcdlock.NewSession(gctx, r.cli, etcdlock.WithTTL(max(r.ttl, etcdlock.MinTTL)), etcdlock.WithHooks(etcdlock.Hooks{
		RenewDone: func(i etcdlock.RenewDoneInfo) {
			if i.Err == nil {
				select {
				case renewed <- struct{}{}:
				default: // one is enough: the reader reads Expiry
				}
			}
		},
	}))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return ctx.Err()
	case gctx.Err() != nil:
		return fmt.Errorf("start a session: no answer from etcd within %v (--command-timeout)", r.conn.commandTimeout)
	default:
		return fmt.Errorf("start a session: %w", err)
	}
	r.s, r.m = s, r.newHold(s)
	return nil
}

// endSession stops the session's keepalives and revokes its lease, which
// deletes whatever key of this run is left. The revoke waits at most
// --command-timeout, and after a loss, or at exit after the session's
// end, at most lostCleanupTimeout; if it
// fails, the lease expires within its TTL. (Session.Close would wait up
// to the TTL.) The revoke also ends with ctx.
func (r *lockRun) endSession(ctx context.Context, atExit bool) {
	if r.s == nil {
		return
	}
	timeout := r.conn.commandTimeout
	if r.lost || atExit && r.s.Err() != nil {
		// Lost, or exiting once the session has ended (its lease ran out
		// unrenewed, or is gone): the lease expires on its own, and etcd,
		// which did not answer the renewals, may not answer the revoke
		// either. (A waiter that rejoins waits longer: its old key stays
		// ahead of its new one until the revoke is done.)
		timeout = min(timeout, lostCleanupTimeout)
	}
	if r.minHold > 0 && !r.lost {
		// Close, unlike revoke, moves what is left of a minimum hold
		// onto a lease of its own before the lease goes: the lock stays
		// taken while etcdlock exits.
		_ = r.s.Close()
	} else {
		revoke(ctx, r.s, r.cli, timeout)
	}
	r.s, r.m = nil, nil
}

// revoke ends s without Close, and revokes its lease within timeout, or
// until ctx ends.
func revoke(ctx context.Context, s *etcdlock.Session, cli *clientv3.Client, timeout time.Duration) {
	s.Orphan()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, _ = cli.Revoke(ctx, s.Lease())
}

// acquire takes the lock (or tries to, with try), showing progress on
// stderr. A signal abandons the wait: Lock removes the key. A waiter that
// loses its place in the queue (its session ended, or its key was deleted)
// joins it again at the back; --timeout counts from the first join.
func (r *lockRun) acquire(try bool, timeout time.Duration, quiet bool) error {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if timeout > 0 {
		var cancelT context.CancelFunc
		ctx, cancelT = context.WithTimeout(ctx, timeout)
		defer cancelT()
	}
	// A signal ends the wait, in Lock or between sessions.
	stopSignals, signalsDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(signalsDone)
		select {
		case sig := <-r.sigc:
			cancel(&signalError{sig})
		case <-stopSignals:
		}
	}()
	r.joined = time.Now()
	err := r.wait(ctx, try, quiet)
	close(stopSignals)
	<-signalsDone

	var se *signalError
	switch {
	case errors.As(context.Cause(ctx), &se):
		if err == nil {
			// The lock was granted before Lock saw the cancel.
			r.release()
		}
		return failf(exitSignalBase+signalNumber(se.sig), "interrupted by %s while waiting for %s; left the queue", sigName(se.sig), r.held())
	case err == nil:
		if r.shown {
			fmt.Fprintf(r.stderr, "etcdlock: acquired %s after %s (token %d)\n", r.held(), fmtDur(time.Since(r.joined)), r.m.Token())
		}
		return nil
	case errors.Is(err, etcdlock.ErrLocked):
		name, by := r.describeHolder()
		return failf(exitHeld, "lock %q is held%s", name, by)
	case timeout > 0 && errors.Is(ctx.Err(), context.DeadlineExceeded):
		name, by := r.describeHolder()
		return failf(exitTimeout, "timed out after %v waiting for lock %q, held%s", timeout, name, by)
	case r.m == nil:
		return err // no session: startSession said why
	default:
		var need *grantNeed // what else the Lock writes
		if r.lockDelay > 0 || r.minHold > 0 {
			need = &grantNeed{also: []string{etcdlock.LockDelayPrefix + r.name + "/"}}
			if r.lockDelay > 0 {
				need.flags = append(need.flags, "--lock-delay")
			}
			if r.minHold > 0 {
				need.flags = append(need.flags, "--min-hold")
			}
			if errors.Is(err, rpctypes.ErrPermissionDenied) {
				pctx, cancel := context.WithTimeout(ctx, r.conn.dialTimeout)
				probeWrites(pctx, r.cli, need, r.m.Key(), etcdlock.LockDelayPrefix+r.m.Key())
				cancel()
			}
		}
		if errors.Is(err, rpctypes.ErrPermissionDenied) {
			// The library's explanation of it is explain's, in the
			// command's words (the user, the grants line to run).
			err = rpctypes.ErrPermissionDenied
		}
		return r.conn.explain(fmt.Errorf("%s: %w", r.what(), err), "write key", r.m.Key(), need)
	}
}

// wait locks (or with try, try-locks) the Mutex until it holds the lock or
// ctx ends, rejoining the queue when the waiter's place in it is gone.
func (r *lockRun) wait(ctx context.Context, try bool, quiet bool) error {
	for {
		err := r.lockOnce(ctx, try, quiet)
		if err == nil || try || ctx.Err() != nil {
			return err
		}
		switch {
		case errors.Is(err, etcdlock.ErrSessionExpired) && r.s.Err() != nil:
			// A false alarm as often as not: in a leader election or a
			// pause of etcd, renewals fail while etcd keeps the lease.
			// The lease is revoked, with the key it holds in the queue,
			// and a new session joins at the back.
			fmt.Fprintf(r.stderr, "etcdlock: left the queue of %s: %s; rejoining at the back with a new session\n", r.what(), detail(err))
			r.endSession(ctx, false)
			if err := r.restartSession(ctx); err != nil {
				return err
			}
		case errors.Is(err, etcdlock.ErrLockLost):
			// Someone deleted the waiter's key; the session lives on.
			fmt.Fprintf(r.stderr, "etcdlock: left the queue of %s: %s; rejoining at the back\n", r.what(), detail(err))
		default:
			return err
		}
	}
}

// lockOnce locks (or try-locks) the Mutex once, showing progress.
func (r *lockRun) lockOnce(ctx context.Context, try, quiet bool) error {
	if r.elect == nil {
		r.m = r.newHold(r.s) // its identity says it joins now
	}
	if try {
		return r.m.TryLock(ctx)
	}
	var prog *progress
	if !quiet {
		f, ok := r.stderr.(*os.File)
		prog = startProgress(r.cli, r.name, r.what(), r.m.Key(), r.stderr, ok && isTerminal(f), r.joined)
	}
	err := r.m.Lock(ctx)
	if prog != nil && prog.stop() {
		r.shown = true
	}
	return err
}

// restartSession starts a new session for a waiter whose session ended,
// trying again until ctx ends: etcd may be out of reach for a while.
func (r *lockRun) restartSession(ctx context.Context) error {
	const maxBackoff = 5 * time.Second
	backoff := 100 * time.Millisecond
	said := ""
	for {
		err := r.startSession(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		if msg := detail(err); msg != said {
			fmt.Fprintf(r.stderr, "etcdlock: %s; trying again\n", msg)
			said = msg
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// describeHolder names the lock that keeps the run out (NAME, or with
// --also the first of the names that has a holder) and its holder, and
// how many wait, for a message: who the holder says it is (etcdlock run's
// host and pid), with its key and token; "" if that cannot be read within
// --command-timeout.
func (r *lockRun) describeHolder() (name, by string) {
	ctx, cancel := context.WithTimeout(context.Background(), r.conn.commandTimeout)
	defer cancel()
	for _, n := range r.names() {
		if by := r.holderOf(ctx, n); by != "" {
			return n, by
		}
	}
	return r.name, ""
}

// holderOf is describeHolder for the lock name.
func (r *lockRun) holderOf(ctx context.Context, name string) string {
	q, err := readQueue(ctx, r.cli, name, false)
	if err != nil || len(q.Keys) == 0 {
		return ""
	}
	holders := q.Holders()
	if len(holders) == 0 {
		return "" // released since the try
	}
	h := holders[0]
	s := " by "
	switch rec, ok := parseRunRecord(h.Identity); {
	case ok:
		s += rec.who() + fmt.Sprintf(" (key %s, token %d)", safeText(h.Key), h.Token)
	case h.Identity != "":
		s += strconv.Quote(h.Identity) + fmt.Sprintf(" (key %s, token %d)", safeText(h.Key), h.Token)
	default:
		s += fmt.Sprintf("%s (token %d)", safeText(h.Key), h.Token)
	}
	if n := len(holders) - 1; n > 0 {
		s += fmt.Sprintf(" and %d more", n)
	}
	if n := len(q.Waiters()); n > 0 {
		s += fmt.Sprintf(", %d waiting", n)
	}
	return s
}

// release unlocks the Mutex within --command-timeout; if that fails,
// endSession revokes the lease, and with it the lock.
func (r *lockRun) release() error {
	ctx, cancel := context.WithTimeout(context.Background(), r.conn.commandTimeout)
	defer cancel()
	err := r.m.Unlock(ctx)
	if errors.Is(err, etcdlock.ErrLockLost) {
		r.lost = true
	}
	return err
}

// runLocked runs cmd while the lock is held, passing signals on to it, and
// stops it if the lock is lost. It releases the lock when cmd exits, and
// returns cmd's exit code as an exitError, or exitLost.
func (r *lockRun) runLocked(cmd *exec.Cmd, grace time.Duration, stdout io.Writer) error {
	m, held, stderr := r.m, r.held(), r.stderr
	lost := m.Done()              // starts watching the hold now, before CMD runs
	asked := m.ReleaseRequested() // without --on-release, only said on stderr
	cmdName := filepath.Base(cmd.Args[0])
	token := strconv.FormatInt(m.Token(), 10)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"ETCDLOCK_NAME="+r.name,
		"ETCDLOCK_KEY="+m.Key(),
		"ETCDLOCK_TOKEN="+token,
		"ETCDLOCK_LEASE="+fmt.Sprintf("%x", int64(r.s.Lease())),
	)
	if m, ok := m.(multi); ok {
		cmd.Env = append(cmd.Env,
			"ETCDLOCK_NAMES="+strings.Join(r.names(), "\n"),
			"ETCDLOCK_KEYS="+strings.Join(m.Keys(), "\n"),
		)
	}
	if r.elect != nil {
		cmd.Env = append(cmd.Env, "ETCDLOCK_VALUE="+r.elect.value)
	} else {
		// etcdctl's ETCD_LOCK_REV is the revision of the response that
		// showed the lock was ours (concurrency.Mutex.Header), not the
		// key's create revision: scripts that mix both tools compare them.
		cmd.Env = append(cmd.Env,
			"ETCD_LOCK_KEY="+m.Key(),
			"ETCD_LOCK_REV="+strconv.FormatInt(m.Header().Revision, 10),
		)
	}
	group := !interactive()
	ch, waitc, err := startChild(cmd, group, r.keepChildren, grace, r.pidNamespace)
	if err != nil {
		r.release()
		return cmdErr(cmd.Args[0], err)
	}

	w := &cmdWatch{ch: ch, waitc: waitc, s: r.s, renewed: r.renewed, grace: grace, cmdName: cmdName, held: held, stderr: stderr,
		ended: lost,
		why: func() error {
			r.lost = true
			return cmp.Or(m.Err(), etcdlock.ErrLockLost)
		},
		stopMsg: func(lostErr error) string {
			return fmt.Sprintf("lost %s while %s ran (%s)", held, cmdName, detail(lostErr))
		},
		asked: asked,
		onAsked: func() {
			if r.onRelease == nil {
				// The asker was told the request was recorded: say here
				// that it is ignored, and how to act on the next one.
				fmt.Fprintf(stderr, "etcdlock: asked to release %s ('etcdlock release'); ignored: %s runs on (start etcdlock with --on-release SIGNAL to pass requests on to %s)\n", held, cmdName, cmdName)
				return
			}
			fmt.Fprintf(stderr, "etcdlock: asked to release %s; sending %s %s\n", held, cmdName, sigName(r.onRelease))
			ch.signal(r.onRelease)
		},
		sigc: r.sigc,
		onSignal: func(sig os.Signal) {
			if !group && sig == os.Interrupt {
				return // the terminal sent it to CMD as well
			}
			ch.signal(sig)
		},
	}
	end := w.watch()
	waitErr, lostErr, stoppedEarly := end.waitErr, end.lostErr, end.stoppedEarly
	if lostErr != nil {
		r.lost = true
	}

	code := exitFailure
	var ee *exec.ExitError
	if waitErr == nil || errors.As(waitErr, &ee) {
		code = exitStatus(ch.cmd.ProcessState)
	}
	// Before the lock is released: if the supervisor was killed, what CMD
	// started is killed now.
	if sig := ch.exited(); sig != nil {
		after := held + " was released"
		switch {
		case lostErr != nil:
			after = held + " was lost before (" + detail(lostErr) + ")"
		default:
			if uerr := r.release(); uerr != nil {
				after = "release " + held + ": " + detail(uerr)
			}
		}
		return failf(exitFailure, "the supervisor of %s (%s %s, pid %d) was killed by %s: %s and every process it started were killed; %s",
			cmdName, filepath.Base(os.Args[0]), superviseCmd, ch.cmd.Process.Pid, sigName(sig), cmdName, after)
	}
	if stoppedEarly {
		// CMD is gone, and was stopped before the lock could pass on.
		after := "the lock was released after"
		switch {
		case lostErr != nil:
			after = "the lock was lost after (" + detail(lostErr) + ")"
		default:
			if uerr := r.release(); uerr != nil {
				after = "it goes with the lease (" + detail(uerr) + ")"
			}
		}
		return failf(exitJeopardy, "%s was stopped before %s could pass on, as etcd did not confirm renewals of the lease in time; %s exited with status %d; %s", cmdName, held, cmdName, code, after)
	}
	if lostErr == nil && end.late {
		// CMD is found gone only after the lease's deadline: etcdlock
		// was paused or starved (the supervisor kept the deadline). The
		// lease may have expired, and the lock passed on.
		r.lost = true
		lostErr = errLate()
	}
	if lostErr != nil {
		// No Unlock: the key is gone, or goes with the lease, which
		// endSession revokes if etcd answers within a second.
		return failf(exitLost, "%s was lost while %s ran; %s exited with status %d", held, cmdName, cmdName, code)
	}
	uerr := r.release()
	switch {
	case errors.Is(uerr, etcdlock.ErrLockLost):
		return failf(exitLost, "%s was found lost when %s exited (%s): it may have run without it", held, cmdName, detail(uerr))
	case uerr != nil:
		fmt.Fprintf(stderr, "etcdlock: release %s: %s; revoking the session's lease instead\n", held, detail(uerr))
	case waitErr != nil && ee == nil:
		return fmt.Errorf("wait for %s: %w", cmdName, waitErr)
	}
	return exitWith(code)
}

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// startLocked starts c, and returns the channel that gets c.Wait's
// result once c has exited. c is started and waited for by a goroutine
// locked to its OS thread: the kernel sends a parent-death signal (the
// supervisor gives CMD one) when the thread that forked the child exits,
// not the process, and a thread locked to a goroutine serves no other, so
// it cannot end while that goroutine waits. The goroutine ends when c has
// exited.
func startLocked(c *exec.Cmd) (<-chan error, error) {
	started, waitc := make(chan error, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := c.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waitc <- c.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waitc, nil
}

// hold keeps the lock until a signal, as 'etcdctl lock NAME' does, after
// printing its key on stdout (and, leading an election, its value on the
// next line, as 'etcdctl elect NAME VALUE' does). It returns nil once the lock is released, or
// exitLost as soon as it is lost.
func (r *lockRun) hold(stdout io.Writer) error {
	lost := r.m.Done()
	fmt.Fprintln(stdout, r.m.Key())
	if r.elect != nil {
		// As 'etcdctl elect NAME VALUE': the key, then the value.
		fmt.Fprintln(stdout, r.elect.value)
	}

	asked := r.m.ReleaseRequested()
	for signalled := false; !signalled; {
		select {
		case <-lost:
			r.lost = true
			err := r.m.Err()
			if err == nil {
				err = etcdlock.ErrLockLost
			}
			return failf(exitLost, "lost %s while holding it (%s)", r.held(), detail(err))
		case <-asked:
			asked = nil
			fmt.Fprintf(r.stderr, "etcdlock: asked to release %s ('etcdlock release'); it holds until this etcdlock gets SIGINT, SIGTERM or SIGHUP\n", r.held())
		case <-r.sigc:
			signalled = true
		}
	}
	switch err := r.release(); {
	case errors.Is(err, etcdlock.ErrLockLost):
		return failf(exitLost, "%s was found lost when released (%s)", r.held(), detail(err))
	case err != nil:
		fmt.Fprintf(r.stderr, "etcdlock: release %s: %s; revoking the session's lease instead\n", r.held(), detail(err))
	}
	return nil
}

// tryFlag is --try: alone (or --try=true) do not wait; --try=DURATION,
// consul's -try=5s, wait at most that long (as --timeout does).
type tryFlag struct {
	on   bool
	wait time.Duration
}

func (f *tryFlag) IsBoolFlag() bool { return true }

func (f *tryFlag) String() string {
	if f == nil || f.wait == 0 {
		return strconv.FormatBool(f != nil && f.on)
	}
	return f.wait.String()
}

func (f *tryFlag) Set(s string) error {
	if b, err := strconv.ParseBool(s); err == nil {
		f.on, f.wait = b, 0
		return nil
	}
	var d durationFlag
	if err := d.Set(s); err != nil || d <= 0 {
		return errors.New("want true, false, or a duration to wait at most, such as 5s (consul's -try=5s)")
	}
	f.on, f.wait = false, time.Duration(d)
	return nil
}

// detachedTry returns the argument after a bare --try (before any "--")
// when it reads as a duration with a unit: 'run --try 5s q -- ...' is
// consul's habit for --try=5s, which the flag package would take as
// --try and a lock named "5s". A habit must not take the wrong lock
// silently: the caller refuses it, naming the two fixes.
func detachedTry(args []string) string {
	for i, a := range args {
		if a == "--" {
			return ""
		}
		if (a == "--try" || a == "-try") && i+1 < len(args) {
			if _, err := time.ParseDuration(args[i+1]); err == nil {
				return args[i+1]
			}
		}
	}
	return ""
}

// nameErr returns a usage error of command for a name the library refuses
// (etcdlock.CheckName), what naming it ("lock NAME"), and nil for any
// other: those are taken as etcd's Mutex and `etcdctl lock` take them,
// "/my-lock/" queues under "/my-lock//", with them. The library refuses an
// empty name, one longer than etcdlock.MaxNameLen (the message gives its
// length, not the name), and one whose queue would lie in its own range,
// "__etcdlock/". Checked before connecting, as usage: exit 2.
func nameErr(command, what, name string) error {
	switch {
	case name == "":
		return usageErr(command, "empty %s", what)
	case len(name) > etcdlock.MaxNameLen:
		return usageErr(command, "%s is %d bytes, longer than %d", what, len(name), etcdlock.MaxNameLen)
	case strings.HasPrefix(name+"/", "__etcdlock/"):
		return usageErr(command, `%s %q: "__etcdlock" and the names under "__etcdlock/" are the library's own`, what, name)
	}
	return nil
}
