package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// brokenToken reads the token break printed.
func brokenToken(t *testing.T, stdout string) int64 {
	t.Helper()
	m := regexp.MustCompile(`its fencing token was (\d+):`).FindStringSubmatch(stdout)
	require.NotNil(t, m, stdout)
	tok, err := strconv.ParseInt(m[1], 10, 64)
	require.NoError(t, err)
	return tok
}

// TestBreak (issue 40): break, refused without --yes when no terminal can
// ask, ends a wedged holder's hold with --yes: the holder's run sees its
// key gone and stops CMD (exit 6), the waiter gets the lock with a larger
// token, and break printed the old token; a second break finds nothing.
func TestBreak(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	joined := watchQueue(t, cli, name)
	holder := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", "echo ready; exec sleep 60")
	holder.stdout.waitFor(t, "ready")
	held := joined.next(t)
	waiter := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "token $ETCDLOCK_TOKEN"`)
	joined.next(t)

	r := runProc(t, nil, "break", ep(), name)
	require.Equal(t, exitUsage, r.code, r.stderr)
	requireOneLineError(t, r, "not confirmed: standard input is not a terminal to ask on; give --yes to break the hold of "+held)
	require.Equal(t, held, queueKeys(t, cli, name)[0], "nothing broken")

	r = runProc(t, nil, "break", ep(), "--yes", name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("broke the hold of %s of lock %q: deleted it\n", held, name))
	old := brokenToken(t, r.stdout)

	require.Equal(t, exitLost, holder.wait(t), "the holder's run stops CMD: %s", holder.stderr)
	require.Equal(t, 0, waiter.wait(t), waiter.stderr.String())
	line := waiter.stdout.waitFor(t, "token ")
	got, err := strconv.ParseInt(strings.TrimPrefix(line, "token "), 10, 64)
	require.NoError(t, err)
	require.Greater(t, got, old, "the next holder's token is larger")

	r = runProc(t, nil, "break", ep(), "--yes", name)
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, fmt.Sprintf("lock %q is not held by anyone: nothing to break", name))
}

// TestBreakKeyAndRevoke: with KEY, break ends a waiter's place (its run
// fails: exit 6) and leaves the holder; among several holders it needs
// KEY; --revoke revokes the holder's lease, which ends its other locks
// too.
func TestBreakKeyAndRevoke(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)

	// Two readers hold: break needs to be told which.
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	r1, r2 := etcdlock.NewRWMutex(s, name), etcdlock.NewRWMutex(newSessionT(t, cli), name)
	require.NoError(t, r1.RLock(t.Context()))
	require.NoError(t, r2.RLock(t.Context()))
	r := runProc(t, nil, "break", ep(), "--yes", name)
	require.Equal(t, exitUsage, r.code, r.stderr)
	requireOneLineError(t, r, fmt.Sprintf("lock %q has 2 holders (%s, %s): choose one: 'etcdlock break %s KEY'", name, r1.Key(), r2.Key(), name))

	// A waiter's place: run, which keeps trying, joins again at the back.
	joined := watchQueue(t, cli, name)
	waiter := startProc(t, nil, "run", ep(), name, "--", "true")
	wkey := joined.next(t)
	r = runProc(t, nil, "break", ep(), "--yes", name, wkey)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("broke the place of waiter 1, %s of lock %q: deleted it\n", wkey, name))
	require.NotContains(t, r.stdout, "fencing token", "a waiter held nothing")
	waiter.stderr.waitFor(t, "rejoining at the back")
	again := joined.next(t)
	require.Equal(t, []string{r1.Key(), r2.Key(), again}, queueKeys(t, cli, name), "the holders stay")
	require.NoError(t, waiter.cmd.Process.Signal(os.Interrupt))
	waiter.wait(t)

	// --revoke: r1's session's other lock goes with it.
	other := etcdlock.NewMutex(s, name+"-other")
	require.NoError(t, other.Lock(t.Context()))
	r = runProc(t, nil, "break", ep(), "--yes", "--revoke", name, r1.Key())
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("revoked its lease %x", int64(s.Lease())))
	for _, m := range []interface{ Done() <-chan struct{} }{r1, other} {
		select {
		case <-m.Done():
		case <-time.After(procTimeout):
			t.Fatal("a hold of the revoked session did not end")
		}
	}
	require.Equal(t, []string{r2.Key()}, queueKeys(t, cli, name))
	require.Empty(t, queueKeys(t, cli, name+"-other"))

	// A key that is not in the queue.
	r = runProc(t, nil, "break", ep(), "--yes", name, r1.Key())
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, "is not in the queue of lock")
}

// TestBreakRefused: a user who may read a lock but not write it sees
// who holds, and is refused the break (exit 3), with the grant named.
func TestBreakRefused(t *testing.T) {
	t.Parallel()
	c, root := grantTeams(t, []team{{"watchers", "w/", "wendy"}}, "--observe-only")
	m := etcdlock.NewMutex(newSessionT(t, root), "w/x")
	require.NoError(t, m.Lock(t.Context()))
	r := runProc(t, nil, "break", "--endpoints="+c.Endpoint(0), "--user", "wendy:pw", "--yes", "w/x")
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, `etcd user "wendy" may not delete key "`+m.Key()+`" (break needs write permission on the keys with prefix "w/x/": 'etcdlock grants --role ROLE -- w/x' prints the etcdctl lines)`)
	require.Equal(t, m.Key(), queueKeys(t, root, "w/x")[0], "nothing broken")
}

// newSessionT is a session of cli closed at the end of the test.
func newSessionT(t *testing.T, cli *clientv3.Client) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestBreakConfirm: on a terminal, break asks, and breaks only for a yes.
func TestBreakConfirm(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, s := holdLock(t, cli, name)
	term, tty := openPTY(t)
	for _, tc := range []struct {
		typed string
		code  int
	}{{"n", exitUsage}, {"", exitUsage}, {"yes", 0}} {
		cmd := exec.Command(bin, "break", ep(), name)
		cmd.Env = append(cleanEnv(), "ETCDCTL_DIAL_TIMEOUT=30s")
		stdout, stderr := newSyncBuffer(), newSyncBuffer()
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, stdout, stderr
		require.NoError(t, cmd.Start())
		waitWritten(t, stderr, "Break it? [y/N] ")
		asked, _ := stderr.read()
		require.Contains(t, asked, fmt.Sprintf("The hold of %s (lease %x, token %d)", m.Key(), int64(s.Lease()), m.Token()))
		_, err := term.WriteString(tc.typed + "\n")
		require.NoError(t, err)
		cmd.Wait() // the exit code is checked below
		out, _ := stderr.read()
		require.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "%q: %s", tc.typed, out)
		if tc.code != 0 {
			require.Contains(t, out, "not confirmed: nothing broken")
			require.Equal(t, m.Key(), queueKeys(t, cli, name)[0])
		}
	}
	select {
	case <-m.Done():
	case <-time.After(procTimeout):
		t.Fatal("the hold did not end")
	}
}
