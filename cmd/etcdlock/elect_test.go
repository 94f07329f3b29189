//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"encoding/json"
	"os"
	"regexp"
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

// electEnvScript prints the environment elect gives CMD, says "ready",
// and runs until its standard input closes.
const electEnvScript = `for v in ETCDLOCK_NAME ETCDLOCK_KEY ETCDLOCK_TOKEN ETCDLOCK_LEASE ETCDLOCK_VALUE; do
	eval "echo $v=\$$v"
done
echo ready
cat >/dev/null`

// envLines reads the NAME=VALUE lines of out.
func envLines(out string) map[string]string {
	env := make(map[string]string)
	for line := range strings.Lines(out) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			env[k] = v
		}
	}
	return env
}

// CMD runs while elect leads, with the leadership in its environment; the
// key holds VALUE, which observers read as the leader's. When CMD exits,
// elect resigns and exits with CMD's code.
func TestElectEnvironment(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, []string{"ETCDLOCK_VALUE=stale"}, "elect", ep(), name, "primary at host-1", "--", "sh", "-c", electEnvScript)
	p.stdout.waitFor(t, "ready")
	env := envLines(p.stdout.String())

	require.Equal(t, name, env["ETCDLOCK_NAME"])
	require.Equal(t, name+"/"+env["ETCDLOCK_LEASE"], env["ETCDLOCK_KEY"])
	require.Equal(t, "primary at host-1", env["ETCDLOCK_VALUE"])
	l, err := etcdlock.CurrentLeader(t.Context(), cli, name)
	require.NoError(t, err)
	require.Equal(t, env["ETCDLOCK_KEY"], l.Key)
	require.Equal(t, "primary at host-1", string(l.Value))
	require.Equal(t, strconv.FormatInt(l.Token, 10), env["ETCDLOCK_TOKEN"])
	require.Equal(t, env["ETCDLOCK_LEASE"], strconv.FormatInt(int64(l.Lease), 16))

	p.stdin.Close() // CMD's cat ends
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, p.stderr.String())
	_, err = etcdlock.CurrentLeader(t.Context(), cli, name)
	require.ErrorIs(t, err, etcdlock.ErrNoLeader)

	r := runProc(t, nil, "elect", ep(), name, "--", "sh", "-c", "exit 7")
	require.Equal(t, 7, r.code, r.stderr)
}

// A second candidate waits in line while the first leads, and takes over
// when the first one's CMD exits. Without VALUE it proposes HOST:PID.
func TestElectTakeover(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	w := watchQueue(t, cli, name)
	first := startProc(t, nil, "elect", "--quiet", ep(), name, "first", "--", "sh", "-c", electEnvScript)
	first.stdout.waitFor(t, "ready")
	firstKey := w.next(t)
	second := startProc(t, nil, "elect", "--quiet", ep(), name, "--", "sh", "-c", electEnvScript)
	secondKey := w.next(t)

	// The second candidate is in line, and its CMD has not started.
	require.Equal(t, []string{firstKey, secondKey}, queueKeys(t, cli, name))
	l, err := etcdlock.CurrentLeader(t.Context(), cli, name)
	require.NoError(t, err)
	require.Equal(t, "first", string(l.Value))
	require.NotContains(t, second.stdout.String(), "ready")

	first.stdin.Close()
	require.Equal(t, 0, first.wait(t), first.stderr.String())
	second.stdout.waitFor(t, "ready")
	env1, env2 := envLines(first.stdout.String()), envLines(second.stdout.String())
	require.Equal(t, secondKey, env2["ETCDLOCK_KEY"])
	host, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, host+":"+strconv.Itoa(second.cmd.Process.Pid), env2["ETCDLOCK_VALUE"])
	token1, err := strconv.ParseInt(env1["ETCDLOCK_TOKEN"], 10, 64)
	require.NoError(t, err)
	token2, err := strconv.ParseInt(env2["ETCDLOCK_TOKEN"], 10, 64)
	require.NoError(t, err)
	require.Greater(t, token2, token1)
	require.Equal(t, []string{secondKey}, queueKeys(t, cli, name))

	second.stdin.Close()
	require.Equal(t, 0, second.wait(t), second.stderr.String())
	require.Empty(t, queueKeys(t, cli, name))
}

// lossScript reports SIGTERM and ends; its child shares etcdlock's
// output, so wait checks that the child ended too.
const lossScript = `trap 'echo "got TERM"; exit 0' TERM
sh -c 'echo "child ready"; exec sleep 30' &
echo "started $ETCDLOCK_LEASE"
wait
echo "not stopped"
`

// A revoked session ends leadership: CMD and its children get SIGTERM at
// once, and elect exits 6.
func TestElectLossStopsCmd(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	script := writeScript(t, t.TempDir(), "cmd.sh", lossScript)
	p := startProc(t, nil, "elect", ep(), name, "v", "--", script)
	lease, err := strconv.ParseInt(strings.Fields(p.stdout.waitFor(t, "started"))[1], 16, 64)
	require.NoError(t, err)
	p.stdout.waitFor(t, "child ready")

	_, err = cli.Revoke(t.Context(), clientv3.LeaseID(lease))
	require.NoError(t, err)
	require.Equal(t, exitLost, p.wait(t), p.stderr.String())
	require.Contains(t, p.stdout.String(), "got TERM\n")
	require.NotContains(t, p.stdout.String(), "not stopped")
	stderr := p.stderr.String()
	require.Contains(t, stderr, `etcdlock: lost leadership of election "`+name+`" while cmd.sh ran`)
	require.Contains(t, stderr, "sending it SIGTERM")
	require.Contains(t, stderr, "was lost while cmd.sh ran")
}

// Cut off from etcd, the leader stops CMD before its lease can expire, and
// exits once its session has ended; the lease then expires and the
// next candidate leads.
func TestElectCutOffStopsCmd(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	const ttl = 3 * time.Second
	px := etcdtest.NewProxy(t, endpoint)
	script := writeScript(t, t.TempDir(), "cmd.sh", lossScript)
	p := startProc(t, nil, "elect", "--ttl", "3", "--endpoints="+px.URL(), name, "old", "--", script)
	p.stdout.waitFor(t, "started")
	p.stdout.waitFor(t, "child ready")
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	defer s.Close()
	standby := etcdlock.NewElection(s, name)
	campaigned := make(chan error, 1)
	go func() { campaigned <- standby.Campaign(t.Context(), "new") }()

	px.Cut()
	cut := time.Now()
	// CMD is stopped while the lease still lives (jeopardy: exit 7),
	// and etcdlock exits once its session has ended.
	require.Equal(t, exitJeopardy, p.wait(t), p.stderr.String())
	took := time.Since(cut)
	t.Logf("etcdlock exited %v after the cut", took)
	require.Less(t, took, ttl+3*time.Second, "etcdlock lingered after the loss")
	require.Contains(t, p.stdout.String(), "got TERM")
	require.Contains(t, p.stderr.String(), "cmd.sh was stopped before leadership of election")
	select {
	case err := <-campaigned:
		require.NoError(t, err)
	case <-time.After(procTimeout):
		t.Fatal("the standby was not elected after the old leader's lease expired")
	}
	require.NoError(t, standby.Resign(t.Context()))
}

// waitLines waits until l has n lines, and returns them.
func waitLines(t *testing.T, l *lines, n int) []string {
	t.Helper()
	timeout := time.After(procTimeout)
	for {
		l.mu.Lock()
		all, eof, changed := append([]string(nil), l.all...), l.eof, l.changed
		l.mu.Unlock()
		if len(all) >= n {
			return all
		}
		if eof {
			t.Fatalf("EOF after %d lines, want %d:\n%s", len(all), n, l.String())
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("%d lines, want %d:\n%s", len(all), n, l.String())
		}
	}
}

// campaign makes a candidate of a session of its own campaign in election
// name; the session ends with the test.
func campaign(t *testing.T, cli *clientv3.Client, name, value string) *etcdlock.Election {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	e := etcdlock.NewElection(s, name)
	require.NoError(t, e.Campaign(t.Context(), value))
	return e
}

// --listen prints the state first ("no leader"), then every change once:
// a new leader, a new value, the next leader, no leader. It exits 0 on
// SIGTERM.
func TestElectListen(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "elect", "--listen", ep(), name)
	require.Regexp(t, `^no leader \(revision \d+\)$`, waitLines(t, p.stdout, 1)[0])
	// -l is --listen, as in etcdctl elect -l (issue 31).
	l := startProc(t, nil, "elect", "-l", ep(), name)
	require.Regexp(t, `^no leader \(revision \d+\)$`, waitLines(t, l.stdout, 1)[0])
	require.NoError(t, l.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, l.wait(t), l.stderr.String())

	e1 := campaign(t, cli, name, "one")
	key1, token1 := e1.Key(), e1.Token()
	require.NoError(t, e1.Proclaim(t.Context(), "two\nlines"))
	s2, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	defer s2.Close()
	e2 := etcdlock.NewElection(s2, name)
	w := watchQueue(t, cli, name)
	campaigned := make(chan error, 1)
	go func() { campaigned <- e2.Campaign(t.Context(), "three") }()
	joined := w.next(t) // e2 waits behind e1
	require.NoError(t, e1.Resign(t.Context()))
	require.NoError(t, <-campaigned)
	require.Equal(t, joined, e2.Key())

	key2, token2 := e2.Key(), e2.Token()
	require.NoError(t, e2.Resign(t.Context()))

	got := waitLines(t, p.stdout, 5)
	lead := func(value, key string, token int64) string {
		return `^leader ` + regexp.QuoteMeta(strconv.Quote(value)) + ` \(key ` + key + `, token ` + strconv.FormatInt(token, 10) + `, revision \d+\)$`
	}
	require.Regexp(t, lead("one", key1, token1), got[1])
	require.Regexp(t, lead("two\nlines", key1, token1), got[2])
	require.Regexp(t, lead("three", key2, token2), got[3])
	require.Regexp(t, `^no leader \(revision \d+\)$`, got[4])

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, p.stderr.String())
	require.Len(t, strings.Split(strings.TrimSpace(p.stdout.String()), "\n"), 5, "a state was printed twice")
}

// --listen --json prints one JSON object a line, and sees a leader elected
// by etcd's concurrency.Election (the layout of 'etcdctl elect').
func TestElectListenJSONInterop(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	s, err := concurrency.NewSession(cli)
	require.NoError(t, err)
	defer s.Close()
	e := concurrency.NewElection(s, name)
	require.NoError(t, e.Campaign(t.Context(), "etcd's"))
	resp, err := cli.Get(t.Context(), e.Key())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)

	p := startProc(t, nil, "elect", "--listen", "--json", ep(), name)
	var first, second leaderJSON
	require.NoError(t, json.Unmarshal([]byte(waitLines(t, p.stdout, 1)[0]), &first))
	require.WithinDuration(t, time.Now(), first.Time, time.Minute, "when etcdlock saw it")
	require.Equal(t, leaderJSON{
		Time: first.Time, Revision: first.Revision, Leader: true, Key: e.Key(),
		Lease: strconv.FormatInt(int64(s.Lease()), 16), Token: resp.Kvs[0].CreateRevision, Value: "etcd's",
	}, first)
	require.GreaterOrEqual(t, first.Revision, resp.Header.Revision)

	require.NoError(t, e.Resign(t.Context()))
	line := waitLines(t, p.stdout, 2)[1]
	require.NoError(t, json.Unmarshal([]byte(line), &second))
	require.Regexp(t, `^\{"time":"[^"]+","revision":\d+,"leader":false\}$`, line)
	require.Greater(t, second.Revision, first.Revision)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

func TestElectUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"elect"}, "missing election NAME"},
		{[]string{"elect", "", "--", "true"}, "empty election NAME"},
		{[]string{"elect", "n", "v", "true"}, `unexpected argument "true": CMD comes after "--"`},
		{[]string{"elect", "n", "--"}, `missing CMD after "--"`},
		{[]string{"elect", "--json", "n", "--", "true"}, "--json goes with --listen"},
		{[]string{"elect", "--listen", "n", "v"}, "--listen takes NAME only"},
		{[]string{"elect", "--listen", "n", "--", "true"}, "--listen takes NAME only"},
		{[]string{"elect", "--ttl", "0", "n", "--", "true"}, "--ttl must be positive, not 0s"},
		{[]string{"elect", "--ttl", "4", "--grace", "2s", "n", "--", "true"}, "--grace 2s does not fit in --ttl 4s"},
		{[]string{"elect", "--keep-children", "n", "v"}, "--keep-children is about the processes CMD starts: give CMD"},
		{[]string{"elect", "n", "etcdlock/1 x", "--", "true"}, `VALUE must not start with "etcdlock/1 "`},
	} {
		r := runProc(t, nil, tc.args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
	}
	r := runProc(t, nil, "help", "elect")
	require.Equal(t, exitOK, r.code, r.stderr)
	for _, want := range []string{"Usage: etcdlock elect", "ETCDLOCK_VALUE", "HOST:PID", "--listen", "-grace", "Exit codes:"} {
		require.Contains(t, r.stdout, want)
	}
}

// Without CMD, as 'etcdctl elect NAME VALUE', elect prints its key and
// value once it leads and leads until a signal; its key keeps VALUE (nothing is
// recorded over it). A lost leadership ends it with the lost code.
func TestElectWithoutCmd(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "elect", ep(), name, "standalone")
	key := p.stdout.waitFor(t, name+"/")
	// As etcdctl elect: the key, then the value (issue 31).
	require.Equal(t, "standalone", p.stdout.waitLine(t, 1))
	l, err := etcdlock.CurrentLeader(t.Context(), cli, name)
	require.NoError(t, err)
	require.Equal(t, key, l.Key)
	require.Equal(t, "standalone", string(l.Value))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, p.stderr.String())
	require.Empty(t, queueKeys(t, cli, name))

	p = startProc(t, nil, "elect", ep(), name)
	key = p.stdout.waitFor(t, name+"/")
	_, err = cli.Delete(t.Context(), key)
	require.NoError(t, err)
	require.Equal(t, exitLost, p.wait(t), p.stderr.String())
	requireOneLineError(t, result{stderr: p.stderr.String()}, `etcdlock: lost leadership of election "`+name+`" while holding it`)
}
