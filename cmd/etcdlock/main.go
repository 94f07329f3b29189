// Command etcdlock takes fair distributed locks on etcd from the shell.
//
// Usage:
//
//	etcdlock demo                              three clients take turns on one lock, on an embedded etcd
//	etcdlock run [flags] NAME -- CMD [ARGS...] hold the lock NAME while CMD runs
//	etcdlock run [flags] NAME                  hold the lock NAME until a signal, printing its key
//	etcdlock elect [flags] NAME [VALUE] -- CMD  lead the election NAME while CMD runs
//	etcdlock elect --listen [--json] NAME      print the leader of NAME and every change
//	etcdlock shards [flags] NAME --count N -- CMD  run CMD for each of N shards this process owns
//	etcdlock shards status|weight|drain ...    show a shard set, set a member's weight, drain it
//	etcdlock status [flags] NAME               show the holders and the waiters of NAME (--watch: and every change)
//	etcdlock ls [flags] PREFIX                 list every lock under PREFIX: holder, held for, waiters (--watch: and every change)
//	etcdlock release [flags] NAME              ask the holders of NAME to release it (run and elect --on-release pass it on to CMD)
//	etcdlock version                           show the versions of etcdlock, Go and the etcd client
//
// Locks are those of package etcdlock: the key NAME/<lease ID in hex>, bound
// to a lease the process keeps alive, the layout of `etcdctl lock`, so both
// tools and etcd's concurrency.Mutex share a lock name. Waiters get the lock
// first come, first served. A holder that dies loses the lock at most its
// TTL later. The fencing token of a hold is its key's create revision; it
// rises from one holder to the next.
//
// run acquires NAME, runs CMD with ETCDLOCK_NAME, ETCDLOCK_KEY,
// ETCDLOCK_TOKEN and ETCDLOCK_LEASE (and etcdctl's ETCD_LOCK_KEY and
// ETCD_LOCK_REV, the revision of the response that granted the lock) in
// its environment, and releases NAME when CMD exits. If the lock is lost
// while CMD runs (its key was deleted, or the lease could not be renewed
// within its TTL), CMD gets SIGTERM, then SIGKILL after --grace, and
// etcdlock exits as soon as CMD has. SIGINT, SIGTERM and SIGHUP to etcdlock
// are passed on to CMD; while etcdlock still waits, they make it leave the
// queue and exit. A waiter whose session ends, or whose key is deleted,
// joins the queue again at the back. Without CMD, run prints the key and
// holds the lock until one of those signals, as 'etcdctl lock NAME' does.
// With --shared run takes a read lock of an RWMutex on NAME, and with
// --permits N --of C N permits of a Semaphore of capacity C: such runs
// hold together, in the one first-come, first-served queue of NAME.
//
// elect campaigns in the election NAME, whose keys have the layout of
// etcd's concurrency.Election and 'etcdctl elect' (the key NAME/<lease ID
// in hex>, its value the candidate's proposal, VALUE, by default HOST:PID),
// and runs CMD while it leads, as run does with a lock: the same signals,
// --grace and exit codes, with ETCDLOCK_NAME, ETCDLOCK_KEY, ETCDLOCK_TOKEN,
// ETCDLOCK_LEASE and ETCDLOCK_VALUE in CMD's environment. elect --listen
// prints the leader, then every change (a new leader, a new value, no
// leader), a line each, and exits 0 on SIGINT, SIGTERM or SIGHUP.
//
// Unless its standard input is the terminal etcdlock runs in the foreground
// of, CMD runs in a process group of its own: forwarded signals and the
// signals of a lost lock reach CMD's children too. With the terminal as
// standard input CMD stays in etcdlock's process group so that it can use
// the terminal; Ctrl-C then reaches CMD from the terminal itself and etcdlock
// does not send it a second SIGINT, and a lost lock signals CMD alone.
//
// On Linux CMD dies with etcdlock even when etcdlock is killed with SIGKILL,
// while its lease still bars the next holder: CMD runs under a small
// supervisor (etcdlock itself, as the hidden command __supervise) that
// leads CMD's process group and kills the whole group when etcdlock dies;
// with the terminal as standard input, CMD alone gets SIGKILL. On other
// systems CMD runs on, and may overlap the next holder once the lease
// expires.
//
// Connection flags are etcdctl's, with its defaults: --endpoints, --user,
// --password, --cacert, --cert, --key, --insecure-skip-tls-verify,
// --dial-timeout and --command-timeout, each also read from the matching
// ETCDCTL_* environment variable when the flag is not given. A --user
// without a password is asked for it when standard input is a terminal.
// Durations may be bare seconds, as etcdctl's --ttl: --ttl 10, --ttl 1.5
// (a lease TTL rounds up to whole seconds, as etcd counts them: --ttl 0.1
// is 1s).
//
// Exit codes:
//
//	0        success; for run and elect: CMD's own exit code
//	1        an error from etcd or the system not covered below
//	2        usage: unknown flag, missing NAME, bad value
//	3        cannot reach etcd within --dial-timeout, or TLS or authentication failed
//	4        run --try: the lock is held or has waiters; release: nothing holds NAME
//	5        run --timeout: gave up waiting
//	6        run: the lock was lost while CMD ran (CMD was stopped), or while
//	         held without CMD; elect: the same for leadership
//	126      run, elect: CMD cannot be executed
//	127      run, elect: CMD not found
//	128+N    run, elect: interrupted by signal N while waiting (130 SIGINT, 143 SIGTERM),
//	         or CMD was killed by signal N
//
// Once CMD runs, etcdlock exits with CMD's code, which may be any of these;
// etcdlock's own failures are also reported on standard error, each on one
// line starting with "etcdlock:".
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Exit codes; see the package comment.
const (
	exitOK         = 0
	exitFailure    = 1
	exitUsage      = 2
	exitConnect    = 3
	exitHeld       = 4
	exitTimeout    = 5
	exitLost       = 6
	exitJeopardy   = 7
	exitCannotExec = 126
	exitNotFound   = 127
	exitSignalBase = 128
)

const exitCodesHelp = `Exit codes:
  0        success; for run and elect: CMD's own exit code
  1        an error from etcd or the system not covered below
  2        usage: unknown flag, missing NAME, bad value
  3        cannot reach etcd within --dial-timeout, TLS or authentication failed,
           or etcd refused the user permission on a key (every command alike)
  4        run --try: the lock is held or has waiters; release: nothing holds NAME
  5        run --timeout: gave up waiting
  6        run: the lock was lost while CMD ran (CMD was stopped), or while
           held without CMD; elect: the same for leadership
  7        run, elect: etcd did not confirm renewals of the lease for so long
           that the lock could soon pass on, so CMD was stopped before it could
  126      run, elect: CMD cannot be executed
  127      run, elect: CMD not found
  128+N    run, elect: interrupted by signal N while waiting (130 SIGINT, 143 SIGTERM),
           or CMD was killed by signal N
`

const mainUsage = `etcdlock takes fair distributed locks on etcd.

Usage:
  etcdlock demo                               three clients take turns on one lock,
                                              on an embedded etcd: no setup needed
  etcdlock run [flags] NAME -- CMD [ARGS...]  hold the lock NAME while CMD runs
                                              (--shared: a read lock; --permits N
                                              --of C: N of a semaphore's C permits)
  etcdlock run [flags] NAME                   hold it until SIGINT or SIGTERM,
                                              printing its key ('etcdctl lock')
  etcdlock elect [flags] NAME [VALUE] -- CMD  lead the election NAME while CMD
                                              runs, campaigning with VALUE
  etcdlock elect --listen [--json] NAME       print the leader of NAME and
                                              every change
  etcdlock shards [flags] NAME --count N -- CMD
                                              spread N shards over the processes
                                              running this, and run CMD for each
                                              shard this one owns (shards status,
                                              weight, drain: 'etcdlock help shards')
  etcdlock status [flags] NAME                show the holders and waiters of NAME
                                              (--watch: and every change)
  etcdlock ls [flags] PREFIX                  list every lock under PREFIX: its
                                              holder, held for, waiters
                                              (--watch: and every change)
  etcdlock release [flags] NAME               ask the holders of NAME to release it
                                              (run and elect --on-release SIGNAL
                                              pass the request on to CMD)
  etcdlock serve [flags] PREFIX               serve every lock under PREFIX:
                                              Prometheus metrics and a live page
  etcdlock break [flags] NAME                 end the hold of NAME from outside
                                              (after asking; --yes), printing
                                              its fencing token
  etcdlock grants [flags] NAME...             print the etcdctl lines that grant a
                                              role what the uses of NAME need
                                              (--prefix P: of every lock under P)
  etcdlock version                            show the versions of etcdlock, Go
                                              and the etcd client
  etcdlock help [COMMAND]                     show help

Connection flags (--endpoints, --user, ...: 'etcdlock help status') may also
come before the command, as etcdctl takes them.

Locks are keys NAME/<lease ID in hex>, the layout of 'etcdctl lock': both tools
share lock names. Waiters get the lock first come, first served; a holder that
dies loses it at most its TTL later.

` + exitCodesHelp

// An exitError ends the program with code, after printing err (if not nil)
// on standard error.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// failf returns an exitError with code and a message.
func failf(code int, format string, args ...any) error {
	return &exitError{code: code, err: fmt.Errorf(format, args...)}
}

// exitWith returns an exitError that ends the program with code silently.
func exitWith(code int) error { return &exitError{code: code} }

// usageErr reports bad usage of command (one line, pointing at its help).
func usageErr(command string, format string, args ...any) error {
	hint := "etcdlock --help"
	if command != "" {
		hint = "etcdlock " + command + " --help"
	}
	return failf(exitUsage, "%s (see '%s')", fmt.Sprintf(format, args...), hint)
}

func main() {
	os.Exit(runMain(os.Args[1:], os.Stdout, os.Stderr))
}

// runMain runs the command line args and returns the exit code.
func runMain(args []string, stdout, stderr io.Writer) int {
	err := dispatch(args, stdout, stderr)
	if err == nil {
		return exitOK
	}
	code := exitFailure
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if err == error(ee) || ee.err == nil {
			err = ee.err
		} // else: a message wraps the exitError, and says more than it
	}
	if err != nil {
		fmt.Fprintf(stderr, "etcdlock: %s\n", errLine(err))
	}
	return code
}

// errLine is err's message for the line "etcdlock: ...": one line, where
// the library's own errors, wrapped ("start a session: etcdlock: session
// expired"), do not say "etcdlock:" a second time.
func errLine(err error) string {
	return strings.ReplaceAll(detail(err), ": etcdlock: ", ": ")
}

// detail is err's message for the middle of a line of etcdlock's, which
// says "etcdlock:" at its start: one line, without the library's prefix.
func detail(err error) string {
	return strings.TrimPrefix(oneLine(err.Error()), "etcdlock: ")
}

func dispatch(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return exitWith(exitUsage)
	}
	args, err := leadingConnFlags(args)
	if err != nil {
		return err
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "demo":
		return cmdDemo(rest, stdout, stderr)
	case "run":
		return cmdRun(rest, stdout, stderr)
	case "elect":
		return cmdElect(rest, stdout, stderr)
	case "shards":
		return cmdShards(rest, stdout, stderr)
	case "status":
		return cmdStatus(rest, stdout, stderr)
	case "ls":
		return cmdLs(rest, stdout, stderr)
	case "release":
		return cmdRelease(rest, stdout, stderr)
	case "grants":
		return cmdGrants(rest, stdout, stderr)
	case "break":
		return cmdBreak(rest, stdout, stderr)
	case "serve":
		return cmdServe(rest, stdout, stderr)
	case "version", "--version", "-version":
		return cmdVersion(rest, stdout)
	case demoHolderCmd:
		return cmdDemoHolder(rest, stdout)
	case superviseCmd:
		return cmdSupervise(rest)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" {
			return dispatch([]string{rest[0], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, mainUsage)
		return nil
	default:
		return usageErr("", "unknown command %q", cmd)
	}
}

// leadingConnFlags moves connection flags given before the command, as
// etcdctl takes them ('etcdlock --endpoints X status NAME'), to after it,
// where every command that connects parses them. Other arguments are
// returned as they are.
func leadingConnFlags(args []string) ([]string, error) {
	var flags []string
	for len(args) > 0 && strings.HasPrefix(args[0], "-") && args[0] != "-" && args[0] != "--" {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		switch {
		case len(flags) == 0 && slices.Contains([]string{"-h", "-help", "--help", "-version", "--version"}, args[0]):
			return args, nil
		case !isConnFlag(name):
			return nil, usageErr("", "%s before the command: only connection flags may come before it, a command's own flags after it", args[0])
		case hasValue || name == "insecure-skip-tls-verify":
			flags, args = append(flags, args[0]), args[1:]
		case len(args) < 2:
			return nil, usageErr("", "flag needs an argument: %s", args[0])
		default:
			flags, args = append(flags, args[0], args[1]), args[2:]
		}
	}
	if len(flags) == 0 {
		return args, nil
	}
	if len(args) == 0 {
		return nil, usageErr("", "no command after %s", strings.Join(flags, " "))
	}
	return append(append([]string{args[0]}, flags...), args[1:]...), nil
}

// isConnFlag reports whether name is one of the connection flags.
func isConnFlag(name string) bool {
	for _, e := range connEnv {
		if e.flag == name {
			return true
		}
	}
	return false
}

// newFlagSet returns a flag set that reports errors to its caller instead
// of printing them: parse prints help for --help and turns errors into one
// line.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("etcdlock "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags placed before, between and after the first n
// positional arguments, and returns those arguments and what follows them
// (after an optional "--"). dashed reports that a "--" came before the
// positional arguments and none after them: in 'run -- true' or
// 'run -- sleep 10' the user meant "--" to start CMD, and NAME is missing
// ('run -- NAME -- CMD' is not dashed). For --help it prints help to
// stdout and returns an exitError with code 0.
func parseArgs(fs *flag.FlagSet, args []string, n int, help string, stdout io.Writer) (pos, rest []string, dashed bool, err error) {
	command := strings.TrimPrefix(fs.Name(), "etcdlock ")
	parse := func(args []string) error {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			printHelp(fs, help, stdout)
			return exitWith(exitOK)
		}
		if err != nil {
			return usageErr(command, "%v", err)
		}
		return nil
	}
	if err := parse(args); err != nil {
		return nil, nil, false, err
	}
	// Parse stops after a "--", which it consumes.
	endedByDash := func(args []string) bool {
		consumed := len(args) - fs.NArg()
		return consumed > 0 && args[consumed-1] == "--"
	}
	dashed = n > 0 && fs.NArg() > 0 && endedByDash(args)
	for len(pos) < n && fs.NArg() > 0 {
		pos = append(pos, fs.Arg(0))
		after := fs.Args()[1:]
		if err := parse(after); err != nil {
			return nil, nil, false, err
		}
		if len(pos) == n && endedByDash(after) {
			dashed = false
		}
	}
	return pos, fs.Args(), dashed, nil
}

// printHelp prints a command's help text with its flags, if it has any.
func printHelp(fs *flag.FlagSet, help string, w io.Writer) {
	fmt.Fprint(w, help)
	flags := 0
	fs.VisitAll(func(*flag.Flag) { flags++ })
	if flags == 0 {
		return
	}
	fmt.Fprintln(w, "\nFlags (-flag and --flag are the same):")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// durationFlag is a flag.Value for a duration that also takes a bare
// number of seconds, as etcdctl's --ttl does: "10" is 10s, "1.5" 1.5s.
type durationFlag time.Duration

// durationVar defines a durationFlag flag that stores into p.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*durationFlag)(p), name, usage)
}

func (d *durationFlag) String() string { return time.Duration(*d).String() }

func (d *durationFlag) Set(s string) error {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n > math.MaxInt64/int64(time.Second) || n < math.MinInt64/int64(time.Second) {
			return errors.New("out of range")
		}
		*d = durationFlag(time.Duration(n) * time.Second)
		return nil
	}
	if secondsFraction.MatchString(s) {
		s += "s" // 1.5 is 1.5s
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration such as 10s or 1m30s, nor a number of seconds such as 10 or 1.5")
	}
	*d = durationFlag(v)
	return nil
}

// secondsFraction matches a number of seconds with a fraction: 1.5, -0.25.
var secondsFraction = regexp.MustCompile(`^-?[0-9]+\.[0-9]+$`)

// fmtDur formats d for people: milliseconds below a second, tenths of a
// second below a minute.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
