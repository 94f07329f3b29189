//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"},
		{"run", "--help"}, {"help", "run"},
		{"status", "-h"}, {"demo", "--help"}, {"help", "version"},
	} {
		r := runProc(t, nil, args...)
		require.Equal(t, exitOK, r.code, "%q: %s", args, r.stderr)
		require.Empty(t, r.stderr, "%q", args)
		require.Contains(t, r.stdout, "Usage", "%q", args)
	}
	r := runProc(t, nil, "--help")
	require.Contains(t, r.stdout, "Exit codes:")
	require.Contains(t, r.stdout, "127      run, elect: CMD not found")
	// A command without flags has no flags heading.
	r = runProc(t, nil, "help", "demo")
	require.NotContains(t, r.stdout, "Flags")
	r = runProc(t, nil, "run", "--help")
	for _, want := range []string{"Exit codes:", "ETCDLOCK_TOKEN", "ETCD_LOCK_REV", "-grace", "-timeout", "-try", "-ttl", "-shared", "-permits", "-of", "-endpoints", "ETCDCTL_ENDPOINTS"} {
		require.Contains(t, r.stdout, want)
	}
}

// version reports etcdlock's module version as the build of the binary
// recorded it ('go version -m' reads the same record: "(devel)" is
// "devel", and a build in a git checkout records a pseudo-version), Go's,
// and the etcd client's: the test binary is built from the same module.
func TestVersion(t *testing.T) {
	t.Parallel()
	bi, ok := debug.ReadBuildInfo()
	require.True(t, ok)
	client := ""
	for _, d := range bi.Deps {
		if d.Path == "go.etcd.io/etcd/client/v3" {
			client = d.Version
		}
	}
	require.NotEmpty(t, client)
	out, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	mod := regexp.MustCompile(`(?m)^\tmod\t\S+\t(\S+)`).FindStringSubmatch(string(out))
	require.NotNil(t, mod, "go version -m:\n%s", out)
	want := mod[1]
	if want == "(devel)" {
		want = "devel"
	} else {
		require.Regexp(t, `^v\d+\.\d+\.\d+`, want)
	}
	for _, arg := range []string{"version", "--version", "-version"} {
		r := runProc(t, nil, arg)
		require.Equal(t, 0, r.code, r.stderr)
		require.Empty(t, r.stderr)
		require.Equal(t, "etcdlock version: "+want+"\nGo version: "+runtime.Version()+"\netcd client version: "+client+"\n", r.stdout, arg)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	r := runProc(t, nil)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "Usage")

	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"bogus"}, `unknown command "bogus"`},
		{nil, []string{"run", "-x", "n", "--", "true"}, "flag provided but not defined: -x"},
		{nil, []string{"run", "n", "--bogus", "--", "true"}, "flag provided but not defined: -bogus"},
		{nil, []string{"run"}, "missing lock NAME"},
		{nil, []string{"run", "--", "true"}, `missing lock NAME before "--"`},
		{nil, []string{"run", "--ttl", "5s", "--", "sleep", "10"}, `missing lock NAME before "--"`},
		{nil, []string{"run", "", "--", "true"}, "empty lock NAME"},
		{nil, []string{"run", "__etcdlock", "--", "true"}, `lock NAME "__etcdlock": "__etcdlock" and the names under "__etcdlock/" are the library's own`},
		{nil, []string{"run", "__etcdlock/x", "--", "true"}, `lock NAME "__etcdlock/x": "__etcdlock" and the names`},
		{nil, []string{"elect", "__etcdlock", "v", "--", "true"}, `election NAME "__etcdlock": "__etcdlock" and the names`},
		{nil, []string{"run", "--ttl", "0", "n", "--", "true"}, "--ttl must be positive, not 0s"},
		{nil, []string{"run", "--ttl", "-1.5", "n", "--", "true"}, "--ttl must be positive, not -1.5s"},
		{nil, []string{"run", "--ttl", "soon", "n", "--", "true"}, `invalid value "soon" for flag -ttl`},
		// CMD must be stopped before the lease can expire: a grace that
		// does not fit in the TTL is refused, with what would (issue 43).
		{nil, []string{"run", "--grace", "10s", "n", "--", "true"}, "--grace 10s does not fit in --ttl 15s: CMD is stopped when renewals have failed for --ttl less --grace less 750ms (so that it is gone before the lock can pass on), which must leave at least half the TTL; give --grace at most 6.75s, or --ttl at least 23s"},
		{nil, []string{"run", "--keep-children", "n"}, "--keep-children is about the processes CMD starts: give CMD"},
		{nil, []string{"run", "--pid-namespace", "n"}, "--pid-namespace is about the processes CMD starts: give CMD"},
		{nil, []string{"run", "--pid-namespace", "--keep-children", "n", "--", "true"}, "--pid-namespace and --keep-children exclude each other: nothing outlives the namespace"},
		{nil, []string{"run", "--try", "--timeout", "1s", "n", "--", "true"}, "--try and --timeout exclude each other"},
		// consul's -try=5s habit written apart would take a lock named
		// "5s" and run q: refused, with the fixes (issue 31).
		{nil, []string{"run", "--try", "5s", "q", "--", "echo", "ran"}, `--try 5s: --try takes no value apart from it; write --try=5s to wait at most 5s (consul's -try=5s), or --try=true 5s to try the lock named "5s"`},
		{nil, []string{"run", "--try=5s", "--timeout", "1s", "n", "--", "true"}, "--try=5s and --timeout exclude each other"},
		{nil, []string{"run", "--try=soon", "n", "--", "true"}, "want true, false, or a duration to wait at most"},
		{nil, []string{"run", "-n", "3", "--permits", "1", "--of", "3", "n", "--", "true"}, "-n N is --permits 1 --of N: give one or the other, not both"},
		{nil, []string{"run", "-n", "0", "n", "--", "true"}, "-n must be at least 1, not 0"},
		{nil, []string{"run", "--lock-delay", "-1s", "n", "--", "true"}, "--lock-delay must be between 1s and 24h0m0s"},
		{nil, []string{"run", "--lock-delay", "25h", "n", "--", "true"}, "--lock-delay must be between"},
		{nil, []string{"run", "--lock-delay", "2s", "--also", "m", "n", "--", "true"}, "--lock-delay does not go with --also"},
		{nil, []string{"run", "--user", "root", "n", "--", "true"}, `--user "root" has no password, and standard input is not a terminal to ask for it`},
		{nil, []string{"status", "--user", "root", "n"}, "has no password"},
		{nil, []string{"run", "--password", "pw", "n", "--", "true"}, "--password needs --user"},
		{nil, []string{"run", "--endpoints", " , ", "n", "--", "true"}, "no etcd endpoints"},
		{[]string{"ETCDCTL_DIAL_TIMEOUT=soon"}, []string{"run", "n", "--", "true"}, "ETCDCTL_DIAL_TIMEOUT"},
		{nil, []string{"run", "--user", ":pw", "n", "--", "true"}, "has an empty user name"},
		{nil, []string{"status"}, "missing lock NAME"},
		{nil, []string{"status", ""}, "empty lock NAME"},
		{nil, []string{"status", "n", "extra"}, `unexpected argument "extra"`},
		{nil, []string{"demo", "extra"}, `unexpected argument "extra"`},
		{nil, []string{"version", "extra"}, `unexpected argument "extra"`},
	} {
		r := runProc(t, tc.env, tc.args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
	}
}

// A name longer than the library takes is bad usage, said on one short
// line with one "etcdlock:" (issue 43: exit 1, the whole name, and the
// library's message with a prefix of its own).
func TestNameTooLong(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", etcdlock.MaxNameLen+1)
	half := strings.Repeat("b", etcdlock.MaxNameLen/2+1)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", ep(), long, "--", "true"}, "lock NAME is 32769 bytes, longer than 32768"},
		{[]string{"run", ep(), "n", "--also", long, "--", "true"}, "--also NAME is 32769 bytes, longer than 32768"},
		{[]string{"run", ep(), half, "--also", half + "c", "--", "true"}, "the names are 32771 bytes in all, longer than 32768"},
		{[]string{"elect", ep(), long, "--", "true"}, "election NAME is 32769 bytes"},
		{[]string{"elect", "--listen", ep(), long}, "election NAME is 32769 bytes"},
		{[]string{"status", ep(), long}, "lock NAME is 32769 bytes"},
		{[]string{"release", ep(), long}, "lock NAME is 32769 bytes"},
		{[]string{"grants", long}, "lock NAME is 32769 bytes"},
	} {
		r := runProc(t, nil, tc.args...)
		require.Equal(t, exitUsage, r.code, "%s", r.stderr[:min(len(r.stderr), 200)])
		require.Less(t, len(r.stderr), 200, "the name is not repeated")
		requireOneLineError(t, r, tc.want)
		require.Equal(t, 1, strings.Count(r.stderr, "etcdlock:"), r.stderr)
	}
	// status of the library's own range is bad usage too, said once.
	r := runProc(t, nil, "status", ep(), "__etcdlock")
	require.Equal(t, exitUsage, r.code, r.stderr)
	requireOneLineError(t, r, `lock NAME "__etcdlock": "__etcdlock" and the names under "__etcdlock/" are the library's own`)
	require.Equal(t, 1, strings.Count(r.stderr, "etcdlock:"), r.stderr)
}

// CMD is looked up before etcdlock connects or queues: a typo must not
// wait its turn, nor need etcd.
func TestCmdNotFound(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)

	r := runProc(t, nil, "run", ep(), name, "--", "etcdlock-no-such-command")
	require.Equal(t, exitNotFound, r.code)
	requireOneLineError(t, r, `CMD "etcdlock-no-such-command" not found`)

	r = runProc(t, nil, "run", "--endpoints=127.0.0.1:1", name, "--", "/no/such/file")
	require.Equal(t, exitNotFound, r.code)
	requireOneLineError(t, r, "not found")

	notExec := filepath.Join(t.TempDir(), "data.txt")
	require.NoError(t, os.WriteFile(notExec, []byte("echo hi\n"), 0o644))
	r = runProc(t, nil, "run", ep(), name, "--", notExec)
	require.Equal(t, exitCannotExec, r.code)
	requireOneLineError(t, r, "cannot run CMD")

	require.Empty(t, queueKeys(t, cli, name))
}

// Unreachable endpoints fail within the dial timeout, naming them.
func TestUnreachable(t *testing.T) {
	t.Parallel()
	// A listener that never answers: TCP connects, gRPC hears nothing.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { silent.Close() })
	// A port nothing listens on: connections are refused.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := closed.Addr().String()
	closed.Close()

	for _, addr := range []string{silent.Addr().String(), refused} {
		for _, args := range [][]string{
			{"run", "--endpoints", addr, "--dial-timeout", "1s", "n", "--", "true"},
			{"status", "--endpoints", addr, "--dial-timeout", "1s", "n"},
		} {
			r := runProc(t, nil, args...)
			require.Equal(t, exitConnect, r.code, "%q: %s", args, r.stderr)
			requireOneLineError(t, r, "cannot reach etcd at "+addr+" within 1s")
			// 1s, and room for a loaded machine; not the 15s of a TTL.
			require.Less(t, r.elapsed, 10*time.Second)
		}
	}
}

// Where the cause can be found, the message names it: a plain-HTTP etcd
// asked for TLS, a host name that does not resolve, a refused connection.
// An endpoint that is not one is a usage error, before any dial.
func TestUnreachableSaysWhy(t *testing.T) {
	t.Parallel()
	host := strings.TrimPrefix(endpoint, "http://")
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := closed.Addr().String()
	closed.Close()
	for _, tc := range []struct{ ep, want string }{
		{"https://" + host, "TLS handshake with " + host + " failed: "},
		{"notahost.invalid:2379", `host "notahost.invalid" not found`},
		{refused, "cannot connect to " + refused + ": connection refused"},
	} {
		if strings.HasPrefix(tc.ep, "notahost") {
			// Only where name servers answer that it does not exist.
			_, err := net.DefaultResolver.LookupHost(t.Context(), "notahost.invalid")
			if dnsErr := (*net.DNSError)(nil); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
				t.Logf("skipped %s: no name server says it does not exist (%v)", tc.ep, err)
				continue
			}
		}
		r := runProc(t, nil, "status", "--endpoints", tc.ep, "--dial-timeout", "1s", "n")
		require.Equal(t, exitConnect, r.code, "%s: %s", tc.ep, r.stderr)
		requireOneLineError(t, r, "cannot reach etcd at "+tc.ep+" within 1s (--dial-timeout): "+tc.want)
	}
	for _, tc := range []struct{ ep, want string }{
		{"bogus url", "it holds a space"},
		{"ftp://h:1", `scheme "ftp"`},
		{"hostonly", "no host:port"},
		{"https://", "no host"},
		{"unix://", "no socket path"},
	} {
		r := runProc(t, nil, "status", "--endpoints", "127.0.0.1:2379,"+tc.ep, "n")
		require.Equal(t, exitUsage, r.code, "%s: %s", tc.ep, r.stderr)
		requireOneLineError(t, r, fmt.Sprintf("--endpoints: %q is not an etcd endpoint (%s", tc.ep, tc.want))
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	for _, tc := range []struct {
		cmd  []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"false"}, 1},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
	} {
		r := runProc(t, nil, append([]string{"run", ep(), name, "--"}, tc.cmd...)...)
		require.Equal(t, tc.code, r.code, "%q: %s", tc.cmd, r.stderr)
		require.Empty(t, r.stderr, "%q", tc.cmd)
		require.Empty(t, queueKeys(t, cli, name), "%q left its key", tc.cmd)
	}
}

// CMD sees the lock's key and token, etcdctl's names for them, and the
// rest of etcdlock's environment.
func TestEnvironment(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	script := `for v in ETCDLOCK_NAME ETCDLOCK_KEY ETCDLOCK_TOKEN ETCDLOCK_LEASE ETCD_LOCK_KEY ETCD_LOCK_REV OTHER; do
		eval "echo $v=\$$v"
	done
	echo ready
	cat >/dev/null`
	p := startProc(t, []string{"OTHER=kept", "ETCDLOCK_KEY=stale"}, "run", ep(), name, "--", "sh", "-c", script)
	p.stdout.waitFor(t, "ready")
	env := envLines(p.stdout.String())

	// Compare with the key in etcd while CMD runs and holds the lock.
	require.Equal(t, name, env["ETCDLOCK_NAME"])
	require.Equal(t, name+"/"+env["ETCDLOCK_LEASE"], env["ETCDLOCK_KEY"])
	require.Equal(t, env["ETCDLOCK_KEY"], env["ETCD_LOCK_KEY"])
	token, err := strconv.ParseInt(env["ETCDLOCK_TOKEN"], 10, 64)
	require.NoError(t, err)
	rev, err := strconv.ParseInt(env["ETCD_LOCK_REV"], 10, 64)
	require.NoError(t, err)
	require.GreaterOrEqual(t, rev, token, "granted before the key was created")
	require.Equal(t, "kept", env["OTHER"])
	resp, err := cli.Get(t.Context(), env["ETCDLOCK_KEY"])
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, strconv.FormatInt(resp.Kvs[0].CreateRevision, 10), env["ETCDLOCK_TOKEN"])
	require.Equal(t, env["ETCDLOCK_LEASE"], strconv.FormatInt(resp.Kvs[0].Lease, 16))
	require.Equal(t, []string{env["ETCDLOCK_KEY"]}, queueKeys(t, cli, name))

	p.stdin.Close() // CMD's cat ends
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, queueKeys(t, cli, name))
}

// ETCD_LOCK_REV means what etcdctl lock means by it: the revision of the
// response that granted the lock (concurrency.Mutex.Header), at which etcd
// shows the key first in line; ETCDLOCK_TOKEN stays the key's create
// revision. A waiter is granted after its predecessor's key was deleted, so
// the two differ, and a fleet mixing both tools sees one rising series.
func TestLockRevIsGrantRevision(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holder, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	p := startProc(t, nil, "run", "--quiet", ep(), name, "--", "sh", "-c",
		`echo "env $ETCDLOCK_KEY $ETCDLOCK_TOKEN $ETCD_LOCK_KEY $ETCD_LOCK_REV"; cat >/dev/null`)
	key := w.next(t) // the holder's key was put before the watch
	// Released by hand, to learn the revision of the release.
	del, err := cli.Delete(t.Context(), holder.Key())
	require.NoError(t, err)
	require.EqualValues(t, 1, del.Deleted)
	released := del.Header.Revision

	f := strings.Fields(p.stdout.waitFor(t, "env "))
	require.Len(t, f, 5, "env line: %q", f)
	require.Equal(t, key, f[1])
	require.Equal(t, key, f[3])
	token, err := strconv.ParseInt(f[2], 10, 64)
	require.NoError(t, err)
	rev, err := strconv.ParseInt(f[4], 10, 64)
	require.NoError(t, err)

	// What etcd says: the token is the key's create revision; the lock
	// was granted at or after the release; at that revision the key was
	// first in line.
	resp, err := cli.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, resp.Kvs[0].CreateRevision, token)
	require.Less(t, token, released)
	require.GreaterOrEqual(t, rev, released)
	require.LessOrEqual(t, rev, resp.Header.Revision)
	at, err := cli.Get(t.Context(), name+"/", clientv3.WithPrefix(), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.NotEmpty(t, at.Kvs)
	require.Equal(t, key, string(at.Kvs[0].Key), "not first in line at ETCD_LOCK_REV %d", rev)

	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, queueKeys(t, cli, name))
}

// The ETCDCTL_* variables configure the connection; flags win over them.
func TestConnectionEnv(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	r := runProc(t, []string{"ETCDCTL_ENDPOINTS=" + endpoint}, "run", name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)

	bad := []string{"ETCDCTL_ENDPOINTS=127.0.0.1:1", "ETCDCTL_DIAL_TIMEOUT=1s"}
	r = runProc(t, bad, "run", ep(), name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)

	r = runProc(t, bad, "status", name)
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, "cannot reach etcd at 127.0.0.1:1 within 1s")
}

func TestTry(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)

	r := runProc(t, nil, "run", "--try", ep(), name, "--", "echo", "ran")
	require.Equal(t, exitHeld, r.code)
	require.Empty(t, r.stdout)
	requireOneLineError(t, r, "is held by "+m.Key())
	require.Equal(t, []string{m.Key()}, queueKeys(t, cli, name))

	require.NoError(t, m.Unlock(t.Context()))
	r = runProc(t, nil, "run", "--try", ep(), name, "--", "echo", "ran")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "ran\n", r.stdout)
	require.Empty(t, queueKeys(t, cli, name))

	// A holder that etcdlock run started is named by its record: the
	// host and pid to look at, then its key.
	p := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "in $ETCDLOCK_KEY $ETCDLOCK_TOKEN"; cat >/dev/null`)
	f := strings.Fields(p.stdout.waitFor(t, "in "))
	host, _ := os.Hostname()
	r = runProc(t, nil, "run", "--try", ep(), name, "--", "echo", "ran")
	require.Equal(t, exitHeld, r.code)
	requireOneLineError(t, r, fmt.Sprintf("is held by etcdlock run sh, pid %d on %s (key %s, token %s)\n", p.cmd.Process.Pid, host, f[1], f[2]))
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// A name as etcd's Mutex and 'etcdctl lock' take it ("/my-lock/", as in
// etcd's own examples) is one queue with them: the key is NAME + "/" +
// the lease in hex. Such names were refused as ending in "/" (issue 30).
func TestRunEtcdNames(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := "/" + lockName(t) + "/"
	es, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer es.Close()
	theirs := concurrency.NewMutex(es, name)
	require.NoError(t, theirs.Lock(t.Context()))

	r := runProc(t, nil, "run", "--try", ep(), name, "--", "echo", "ran")
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, "is held by "+theirs.Key())

	require.NoError(t, theirs.Unlock(t.Context()))
	p := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "in $ETCDLOCK_KEY $ETCDLOCK_LEASE"; cat >/dev/null`)
	f := strings.Fields(p.stdout.waitFor(t, "in "))
	require.Equal(t, name+"/"+f[2], f[1])
	require.ErrorIs(t, theirs.TryLock(t.Context()), concurrency.ErrLocked)
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.NoError(t, theirs.TryLock(t.Context()))
	require.NoError(t, theirs.Unlock(t.Context()))
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)

	r := runProc(t, nil, "run", "--timeout", "1s", ep(), name, "--", "echo", "ran")
	require.Equal(t, exitTimeout, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.GreaterOrEqual(t, r.elapsed, time.Second)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.Contains(t, lines[len(lines)-1], "etcdlock: timed out after 1s waiting for lock")
	require.Equal(t, []string{m.Key()}, queueKeys(t, cli, name), "the timed-out waiter left its key")
}

// consul's habits: --try=DURATION waits at most that long (as --timeout
// does), and -n N is one of N holders at once (--permits 1 --of N).
func TestConsulHabits(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)
	r := runProc(t, nil, "run", "--try=1s", ep(), name, "--", "echo", "ran")
	require.Equal(t, exitTimeout, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.GreaterOrEqual(t, r.elapsed, time.Second)
	require.Contains(t, r.stderr, "etcdlock: timed out after 1s waiting for lock")
	require.NoError(t, m.Unlock(t.Context()))
	r = runProc(t, nil, "run", "--try=10s", ep(), name, "--", "echo", "ran")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "ran\n", r.stdout)

	sem := name + "/n"
	p := startProc(t, nil, "run", "-n", "2", ep(), sem, "--", "sh", "-c", "echo in; cat >/dev/null")
	p.stdout.waitFor(t, "in")
	r = runProc(t, nil, "run", "--try", "-n", "2", ep(), sem, "--", "echo", "second")
	require.Equal(t, 0, r.code, "one of 2: a second holds beside the first: %s", r.stderr)
	require.Equal(t, "second\n", r.stdout)
	q, err := etcdlock.InspectLock(t.Context(), cli, sem)
	require.NoError(t, err)
	require.Equal(t, etcdlock.KeyMode{Weight: 1, Capacity: 2}, q.Holders()[0].Mode)
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// A lost lock stops CMD and its children with SIGTERM, and etcdlock exits
// with exitLost.
func TestLostLockStopsCmd(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	// The child shares etcdlock's stdout: wait checks that it ended too.
	// Once it said it is ready, its own SIGTERM disposition is in force.
	script := writeScript(t, t.TempDir(), "cmd.sh", `trap 'echo "got TERM"; exit 0' TERM
sh -c 'echo "child ready"; exec sleep 30' &
echo "started $ETCDLOCK_KEY"
wait
echo "not stopped"
`)
	p := startProc(t, nil, "run", ep(), name, "--", script)
	key := strings.Fields(p.stdout.waitFor(t, "started"))[1]
	p.stdout.waitFor(t, "child ready")

	_, err := cli.Delete(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, exitLost, p.wait(t))
	require.Contains(t, p.stdout.String(), "got TERM\n")
	require.NotContains(t, p.stdout.String(), "not stopped")
	stderr := p.stderr.String()
	require.Contains(t, stderr, "etcdlock: lost lock")
	require.Contains(t, stderr, "sending it SIGTERM")
	require.Contains(t, stderr, "was lost while cmd.sh ran")
	require.NotContains(t, stderr, "sending it SIGKILL")
}

// A CMD that ignores SIGTERM gets SIGKILL after --grace.
func TestLostLockKillsAfterGrace(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	// Ignored signals are inherited: sleep ignores SIGTERM too.
	script := writeScript(t, t.TempDir(), "cmd.sh", `trap '' TERM
sh -c 'echo "child ready"; exec sleep 30' &
echo "started $ETCDLOCK_LEASE"
wait
`)
	p := startProc(t, nil, "run", "--grace", "1s", ep(), name, "--", script)
	lease, err := strconv.ParseInt(strings.Fields(p.stdout.waitFor(t, "started"))[1], 16, 64)
	p.stdout.waitFor(t, "child ready")
	require.NoError(t, err)

	revoked := time.Now()
	_, err = cli.Revoke(t.Context(), clientv3.LeaseID(lease))
	require.NoError(t, err)
	require.Equal(t, exitLost, p.wait(t))
	require.GreaterOrEqual(t, time.Since(revoked), time.Second)
	stderr := p.stderr.String()
	require.Contains(t, stderr, "sending it SIGTERM")
	require.Contains(t, stderr, "still runs 1s after SIGTERM; sending it SIGKILL")
	require.Contains(t, stderr, "exited with status 137")
}

// With etcd out of reach, the lock is lost when the lease can no longer
// be renewed in time: CMD is stopped, and etcdlock exits soon after, not
// after an Unlock and a revoke that cannot succeed (it took 13s more with
// --ttl 3s). The lease expires on its own; etcd then deletes the key.
func TestLostLockExitsPromptly(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	const ttl = 3 * time.Second
	px := etcdtest.NewProxy(t, endpoint)
	script := writeScript(t, t.TempDir(), "cmd.sh", `trap 'echo "got TERM"; exit 0' TERM
sh -c 'echo "child ready"; exec sleep 30' &
echo "started $ETCDLOCK_KEY"
wait
`)
	p := startProc(t, nil, "run", "--ttl", "3", "--endpoints="+px.URL(), name, "--", script)
	key := strings.Fields(p.stdout.waitFor(t, "started"))[1]
	p.stdout.waitFor(t, "child ready")
	kv := waitRecorded(t, cli, key) // nothing of the run is in flight
	deleted := cli.Watch(t.Context(), key, clientv3.WithRev(kv.ModRevision+1), clientv3.WithFilterPut())

	px.Cut()
	cut := time.Now()
	// CMD is stopped while the lease still lives (jeopardy: exit 7),
	// and etcdlock exits once its session has ended.
	require.Equal(t, exitJeopardy, p.wait(t), p.stderr.String())
	took := time.Since(cut)
	t.Logf("etcdlock exited %v after the cut", took)
	require.Less(t, took, ttl+3*time.Second, "etcdlock lingered after the loss")
	require.Contains(t, p.stdout.String(), "got TERM")
	stderr := p.stderr.String()
	require.Contains(t, stderr, "etcd has not confirmed a renewal of the lease for")
	require.Contains(t, stderr, "cmd.sh was stopped before lock")
	require.Contains(t, stderr, "not renewed within its TTL")

	select {
	case wr := <-deleted:
		require.NoError(t, wr.Err())
	case <-time.After(procTimeout):
		t.Fatal("the lost holder's key was not deleted when its lease expired")
	}
}

// SIGINT or SIGTERM while waiting abandons the queue: no key is left, CMD
// does not run, and the exit code is 128+N.
func TestSignalWhileWaiting(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
	}{
		{syscall.SIGINT, "SIGINT"},
		{syscall.SIGTERM, "SIGTERM"},
	} {
		name := lockName(t) + "/" + tc.name
		m, _ := holdLock(t, cli, name)
		w := watchQueue(t, cli, name)
		p := startProc(t, nil, "run", ep(), name, "--", "echo", "ran")
		w.next(t) // the holder's key was put before the watch
		require.NoError(t, p.cmd.Process.Signal(tc.sig))
		require.Equal(t, 128+int(tc.sig), p.wait(t))
		require.Empty(t, p.stdout.String())
		lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
		require.Equal(t, "etcdlock: interrupted by "+tc.name+` while waiting for lock "`+name+`"; left the queue`, lines[len(lines)-1])
		require.Equal(t, []string{m.Key()}, queueKeys(t, cli, name))
	}
}

// SIGINT, SIGTERM and SIGHUP to etcdlock reach CMD and its children;
// etcdlock exits with CMD's code.
func TestSignalsForwarded(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	// A background job of sh ignores SIGINT: the traps end it.
	script := writeScript(t, t.TempDir(), "cmd.sh", `trap 'echo "got INT"; kill $!; exit 42' INT
trap 'echo "got TERM"; exit 43' TERM
trap 'echo "got HUP"; exit 44' HUP
sh -c 'echo "child ready"; exec sleep 30' &
echo started
wait
`)
	for _, tc := range []struct {
		sig  syscall.Signal
		want string
		code int
	}{
		{syscall.SIGINT, "got INT", 42},
		{syscall.SIGTERM, "got TERM", 43},
		{syscall.SIGHUP, "got HUP", 44},
	} {
		p := startProc(t, nil, "run", ep(), name, "--", script)
		p.stdout.waitFor(t, "started")
		p.stdout.waitFor(t, "child ready")
		require.NoError(t, p.cmd.Process.Signal(tc.sig))
		require.Equal(t, tc.code, p.wait(t), p.stderr.String())
		require.Contains(t, p.stdout.String(), tc.want+"\n")
		require.Empty(t, p.stderr.String())
		require.Empty(t, queueKeys(t, cli, name))
	}
}

// Without CMD, run prints the key once it holds the lock, and holds it
// until SIGINT or SIGTERM, as 'etcdctl lock NAME' does; then it releases
// the lock and exits 0.
func TestHoldWithoutCmd(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		args []string
	}{
		{syscall.SIGINT, nil},
		{syscall.SIGTERM, []string{"--"}},
	} {
		name := lockName(t) + "/" + tc.sig.String()
		p := startProc(t, nil, append([]string{"run", ep(), name}, tc.args...)...)
		key := p.stdout.waitFor(t, name+"/")
		require.Equal(t, []string{key}, queueKeys(t, cli, name))
		// The Put that joined the queue recorded who holds: the mode's
		// line (empty: exclusive), then run's identity.
		kv := waitRecorded(t, cli, key)
		require.Equal(t, int64(1), kv.Version, "no write after the one that joined")
		mode, identity, ok := strings.Cut(string(kv.Value), "\n")
		require.True(t, ok)
		require.Empty(t, mode)
		rec, ok := parseRunRecord(identity)
		require.True(t, ok, identity)
		require.Equal(t, p.cmd.Process.Pid, rec.PID)
		require.Empty(t, rec.Command)

		// Held: a waiter queues behind it and does not get the lock.
		w := watchQueue(t, cli, name)
		next := startWaiter(t, cli, name)
		require.Equal(t, next.m.Key(), w.next(t))
		select {
		case <-next.finished:
			t.Fatalf("the waiter got the lock while run held it: %v", next.err)
		default:
		}

		require.NoError(t, p.cmd.Process.Signal(tc.sig))
		require.Equal(t, 0, p.wait(t), p.stderr.String())
		require.Equal(t, key+"\n", p.stdout.String())
		require.Empty(t, p.stderr.String())
		next.unlock(t)
		require.Empty(t, queueKeys(t, cli, name))
	}
}

// Holding without CMD, a lost lock ends run at once with the lost code.
func TestHoldWithoutCmdLost(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "run", ep(), name)
	key := p.stdout.waitFor(t, name+"/")
	_, err := cli.Delete(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, exitLost, p.wait(t), p.stderr.String())
	requireOneLineError(t, result{stderr: p.stderr.String()}, `etcdlock: lost lock "`+name+`" while holding it (lock was lost: key `+key+` was deleted)`)
}

// leaseOf returns the lease ID of a lock key NAME/<lease ID in hex>.
func leaseOf(t *testing.T, key string) clientv3.LeaseID {
	t.Helper()
	id, err := strconv.ParseInt(key[strings.LastIndex(key, "/")+1:], 16, 64)
	require.NoError(t, err)
	return clientv3.LeaseID(id)
}

// A waiter whose session ends (here its lease is revoked; in a leader
// election renewals fail while etcd keeps the lease) does not give up: it
// rejoins the queue with a new session, at the back, says so, and runs CMD
// in its new turn. Its old key is gone.
func TestWaiterRejoins(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holder, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	p := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "ran $ETCDLOCK_KEY"`)
	first := w.next(t) // the holder's key was put before the watch
	other := startWaiter(t, cli, name)
	require.Equal(t, other.m.Key(), w.next(t))

	_, err := cli.Revoke(t.Context(), leaseOf(t, first))
	require.NoError(t, err)
	second := w.next(t)
	require.NotEqual(t, first, second)
	line := p.stderr.waitFor(t, `etcdlock: left the queue of lock "`+name+`": `)
	require.Contains(t, line, "session expired")
	require.True(t, strings.HasSuffix(line, "; rejoining at the back with a new session"), line)
	// At the back, behind the waiter that was behind it; the old key is
	// gone with its lease.
	require.Equal(t, []string{holder.Key(), other.m.Key(), second}, queueKeys(t, cli, name))

	require.NoError(t, holder.Unlock(t.Context()))
	other.unlock(t)
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	t.Logf("stderr:\n%s", p.stderr)
	require.Equal(t, "ran "+second+"\n", p.stdout.String())
	require.Empty(t, queueKeys(t, cli, name))
}

// The case of the issue: etcd answers late (a leader election, a frozen
// leader), so the waiter cannot confirm its renewals and its session ends,
// while etcd, which got the renewals in time, keeps the lease. The waiter
// rejoins, and runs CMD once answers come in time again.
func TestWaiterRejoinsAfterFalseAlarm(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holder, _ := holdLock(t, cli, name)
	px := etcdtest.NewProxy(t, endpoint)
	w := watchQueue(t, cli, name)
	p := startProc(t, nil, "run", "--quiet", "--ttl", "2", "--endpoints="+px.URL(), name, "--", "sh", "-c", `echo "ran $ETCDLOCK_KEY"`)
	first := w.next(t)

	px.DelayAnswers(3 * time.Second) // longer than the TTL
	p.stderr.waitFor(t, "rejoining at the back with a new session")
	px.DelayAnswers(0)
	second := w.next(t)
	require.NotEqual(t, first, second)

	require.NoError(t, holder.Unlock(t.Context()))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	t.Logf("stderr:\n%s", p.stderr)
	require.Contains(t, p.stdout.String(), "ran "+name+"/")
	require.Empty(t, queueKeys(t, cli, name))
}

// A waiter whose key is deleted while its session lives rejoins at the
// back with the same session.
func TestWaiterRejoinsAfterKeyDeleted(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holder, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	p := startProc(t, nil, "run", "--quiet", ep(), name, "--", "sh", "-c", `echo "ran $ETCDLOCK_KEY"`)
	key := w.next(t)
	other := startWaiter(t, cli, name)
	require.Equal(t, other.m.Key(), w.next(t))

	_, err := cli.Delete(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, key, w.next(t), "not put again")
	line := p.stderr.waitFor(t, `etcdlock: left the queue of lock "`+name+`": `)
	require.Contains(t, line, "deleted")
	require.True(t, strings.HasSuffix(line, "; rejoining at the back"), line)
	require.Equal(t, []string{holder.Key(), other.m.Key(), key}, queueKeys(t, cli, name))

	require.NoError(t, holder.Unlock(t.Context()))
	other.unlock(t)
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Equal(t, "ran "+key+"\n", p.stdout.String())
}

// --timeout counts from the first join: a rejoin does not restart it.
func TestRejoinKeepsTimeout(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	const timeout = 6 * time.Second
	holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	p := startProc(t, nil, "run", "--timeout", "6", ep(), name, "--", "echo", "ran")
	key := w.next(t)
	// Let half of the timeout pass before the waiter loses its place.
	<-time.After(timeout / 2)
	_, err := cli.Revoke(t.Context(), leaseOf(t, key))
	require.NoError(t, err)
	revoked := time.Now()
	p.stderr.waitFor(t, "rejoining at the back with a new session")
	w.next(t)

	require.Equal(t, exitTimeout, p.wait(t), p.stderr.String())
	require.Less(t, time.Since(revoked), timeout-time.Second, "the rejoin restarted --timeout")
	require.Contains(t, p.stderr.String(), "etcdlock: timed out after 6s waiting for lock")
	require.Empty(t, p.stdout.String())
	require.Len(t, queueKeys(t, cli, name), 1, "a waiter's key is left")
}

// Runs on one lock never overlap and get the lock in the order they
// queued.
func TestRunsInOrderWithoutOverlap(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	// The pause widens the window in which an overlap would show.
	step := writeScript(t, dir, "step.sh", `echo "start $1 $ETCDLOCK_TOKEN $ETCD_LOCK_REV" >> "$2"
sleep 0.2
echo "end $1" >> "$2"
`)

	m, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	var procs []*proc
	for _, id := range []string{"A", "B", "C", "D"} {
		procs = append(procs, startProc(t, nil, "run", "--quiet", ep(), name, "--", step, id, log))
		w.next(t) // queued before the next one starts
	}
	require.NoError(t, m.Unlock(t.Context()))
	for _, p := range procs {
		require.Equal(t, 0, p.wait(t), p.stderr.String())
	}

	data, err := os.ReadFile(log)
	require.NoError(t, err)
	var got []string
	lastToken, lastRev := int64(0), int64(0)
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		got = append(got, f[0]+" "+f[1])
		if f[0] == "start" {
			token, err := strconv.ParseInt(f[2], 10, 64)
			require.NoError(t, err)
			require.Greater(t, token, lastToken, "tokens must rise")
			rev, err := strconv.ParseInt(f[3], 10, 64)
			require.NoError(t, err)
			require.Greater(t, rev, lastRev, "ETCD_LOCK_REV must rise")
			lastToken, lastRev = token, rev
		}
	}
	require.Equal(t, []string{"start A", "end A", "start B", "end B", "start C", "end C", "start D", "end D"}, got)
	require.Empty(t, queueKeys(t, cli, name))
}

// Without a terminal, a waiting run prints a plain line when its place in
// the queue changes, and one when it gets the lock.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m1, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	s2 := startWaiter(t, cli, name)
	w.next(t)

	p := startProc(t, nil, "run", ep(), name, "--", "true")
	line := p.stderr.waitFor(t, `etcdlock: waiting for lock "`+name+`": queue position 2 of 2, waited`)
	// It names whom it waits for (issue 31): the holder, here by its key
	// (it recorded nothing).
	require.True(t, strings.HasSuffix(line, "; held by "+m1.Key()), line)
	require.NoError(t, m1.Unlock(t.Context()))
	p.stderr.waitFor(t, "queue position 1 of 1")
	s2.unlock(t)
	require.Equal(t, 0, p.wait(t))
	stderr := p.stderr.String()
	require.Contains(t, stderr, `etcdlock: acquired lock "`+name+`" after`)
	require.NotContains(t, stderr, "\r")
	// One line per change of place, not one per poll.
	require.Equal(t, 1, strings.Count(stderr, "position 2 of 2"), stderr)
}

// Connection flags may come before the command, as etcdctl takes them
// (issue 40): they are moved after it; anything else before it is refused.
func TestLeadingConnFlags(t *testing.T) {
	for _, tc := range []struct {
		in, want []string
		err      string
	}{
		{[]string{"status", "n"}, []string{"status", "n"}, ""},
		{[]string{"--endpoints", "a:1", "status", "n"}, []string{"status", "--endpoints", "a:1", "n"}, ""},
		{[]string{"--endpoints=a:1", "--insecure-skip-tls-verify", "--user", "u:p", "ls", "p/"},
			[]string{"ls", "--endpoints=a:1", "--insecure-skip-tls-verify", "--user", "u:p", "p/"}, ""},
		{[]string{"-endpoints", "a:1", "run", "n", "--", "true"}, []string{"run", "-endpoints", "a:1", "n", "--", "true"}, ""},
		{[]string{"--help"}, []string{"--help"}, ""},
		{[]string{"--version"}, []string{"--version"}, ""},
		{[]string{"--ttl", "5s", "run", "n"}, nil, "--ttl before the command: only connection flags"},
		{[]string{"--endpoints", "a:1", "--ttl", "5s", "run", "n"}, nil, "--ttl before the command"},
		{[]string{"--endpoints"}, nil, "flag needs an argument: --endpoints"},
		{[]string{"--endpoints", "a:1"}, nil, "no command after --endpoints a:1"},
	} {
		got, err := leadingConnFlags(tc.in)
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// etcdctl's habit, end to end: the connection flags before the command.
func TestConnFlagsBeforeCommand(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	r := runProc(t, nil, ep(), "status", name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "is free")
	r = runProc(t, nil, "--endpoints", endpoint, "--command-timeout", "3s", "status", "--json", name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"holder": null`)
}

// An error line says "etcdlock:" once, also when it wraps the library's
// errors, which say it themselves.
func TestErrLineSaysEtcdlockOnce(t *testing.T) {
	lib := fmt.Errorf("etcdlock: session expired: %w", errors.New("lease 1 was revoked"))
	require.Equal(t, "start a session: session expired: lease 1 was revoked", errLine(fmt.Errorf("start a session: %w", lib)))
	require.Equal(t, "session expired: lease 1 was revoked", errLine(lib))
	require.Equal(t, "cannot run CMD \"x\": not found", errLine(errors.New("cannot run CMD \"x\": not found")))
}
