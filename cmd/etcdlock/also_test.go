package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// TestRunAlso: run --also holds every name at once (a MultiMutex): CMD
// sees every key, which share its token; each name is held meanwhile; a
// Try exits 4 naming the name that is held; nothing is left after.
func TestRunAlso(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	a, b := lockName(t)+"/a", lockName(t)+"/b"
	script := `for v in ETCDLOCK_NAME ETCDLOCK_KEY ETCDLOCK_TOKEN ETCDLOCK_LEASE; do
		eval "echo $v=\$$v"
	done
	echo "NAMES=$(echo "$ETCDLOCK_NAMES" | tr '\n' ' ')"
	echo "KEYS=$(echo "$ETCDLOCK_KEYS" | tr '\n' ' ')"
	echo ready
	cat >/dev/null`
	p := startProc(t, nil, "run", ep(), "--also", b, a, "--", "sh", "-c", script)
	p.stdout.waitFor(t, "ready")
	env := envLines(p.stdout.String())
	require.Equal(t, a, env["ETCDLOCK_NAME"])
	require.Equal(t, []string{a, b}, strings.Fields(env["NAMES"]))
	keys := strings.Fields(env["KEYS"])
	require.Equal(t, []string{a + "/" + env["ETCDLOCK_LEASE"], b + "/" + env["ETCDLOCK_LEASE"]}, keys)
	require.Equal(t, keys[0], env["ETCDLOCK_KEY"])
	for i, n := range []string{a, b} {
		require.Equal(t, []string{keys[i]}, queueKeys(t, cli, n))
		resp, err := cli.Get(t.Context(), keys[i])
		require.NoError(t, err)
		require.Equal(t, env["ETCDLOCK_TOKEN"], strconv.FormatInt(resp.Kvs[0].CreateRevision, 10), "every key has the token")
	}
	// Both names are held, the second one too.
	r := runProc(t, nil, "run", "--try", ep(), b, "--", "echo", "ran")
	require.Equal(t, exitHeld, r.code)
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, queueKeys(t, cli, a))
	require.Empty(t, queueKeys(t, cli, b))

	// A Try finds the second name held, names it, and leaves no key.
	m, _ := holdLock(t, cli, b)
	r = runProc(t, nil, "run", "--try", ep(), "--also", b, a, "--", "echo", "ran")
	require.Equal(t, exitHeld, r.code, r.stderr)
	require.Empty(t, r.stdout)
	requireOneLineError(t, r, `lock "`+b+`" is held by `+m.Key())
	require.Empty(t, queueKeys(t, cli, a))
	require.NoError(t, m.Unlock(t.Context()))
}

// TestStatusWaitingSet: a run --also that is first in line for one name
// but still waits for its other name holds neither, and has not started
// CMD: status and ls show its key first in line, waiting for that name,
// and nobody holding (issue 30: they showed it holding, and its run as
// running).
func TestStatusWaitingSet(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	a, b := lockName(t)+"/a", lockName(t)+"/b"
	m, _ := holdLock(t, cli, b)
	p := startProc(t, nil, "run", ep(), "--also", b, a, "--", "sh", "-c", "echo ran; cat >/dev/null")
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, a)) == 1 }, procTimeout, 10*time.Millisecond)

	r := runProc(t, nil, "status", ep(), a)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("lock %q is held by nobody, 1 waiting: first in line is a MultiMutex that still waits for %q", a, b))
	require.NotContains(t, r.stdout, "running")
	r = runProc(t, nil, "status", "--json", ep(), a)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Empty(t, st.Holders)
	require.Equal(t, b, st.Waiters[0].WaitsFor)
	r = runProc(t, nil, "ls", ep(), a)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, regexp.QuoteMeta(a)+`\s+nobody \(a MultiMutex waits for `+regexp.QuoteMeta(strconv.Quote(b))+`\)\s+-\s+1\n`, r.stdout)
	require.NotContains(t, p.stdout.String(), "ran")
	r = runProc(t, nil, "release", ep(), a)
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, fmt.Sprintf("lock %q is not held by anyone: no holder to ask (first in line is a MultiMutex", a))
	require.Contains(t, r.stderr, "that still waits for "+b)

	require.NoError(t, m.Unlock(t.Context()))
	p.stdout.waitFor(t, "ran")
	r = runProc(t, nil, "status", ep(), a)
	require.Contains(t, r.stdout, fmt.Sprintf("lock %q is held, 0 waiting", a))
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

func TestRunAlsoUsage(t *testing.T) {
	t.Parallel()
	many := []string{"run"}
	for i := range etcdlock.MaxMultiNames {
		many = append(many, "--also", "n"+strconv.Itoa(i))
	}
	many = append(many, "n", "--", "true")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--also", "__etcdlock", "n", "--", "true"}, `--also NAME "__etcdlock": "__etcdlock" and the names`},
		{[]string{"run", "--also", "", "n", "--", "true"}, "empty --also NAME"},
		{[]string{"run", "--also", "n", "n", "--", "true"}, `lock NAME "n" given twice`},
		{[]string{"run", "--also", "x", "--also", "x", "n", "--", "true"}, `lock NAME "x" given twice`},
		{[]string{"run", "--shared", "--also", "x", "n", "--", "true"}, "--also takes exclusive locks only"},
		{[]string{"run", "--permits", "1", "--of", "2", "--also", "x", "n", "--", "true"}, "--also takes exclusive locks only"},
		{many, "65 names, more than 64"},
	} {
		r := runProc(t, nil, tc.args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
	}
}
