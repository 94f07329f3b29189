package main

import (
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// trapScript waits, ready, until SIGUSR1, then says so and exits 0.
const trapScript = `trap 'echo "got USR1"; exit 0' USR1; echo ready; while :; do sleep 0.05; done`

// TestReleaseRun: 'etcdlock release' asks; run --on-release USR1 passes the
// request on to CMD, which exits, and run releases the lock. Asking a free
// lock exits 4.
func TestReleaseRun(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	r := runProc(t, nil, "release", ep(), name)
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, "is not held")

	p := startProc(t, nil, "run", ep(), "--on-release", "USR1", name, "--", "sh", "-c", trapScript)
	p.stdout.waitFor(t, "ready")
	r = runProc(t, nil, "release", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "asked the holders")
	p.stdout.waitFor(t, "got USR1")
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Contains(t, p.stderr.String(), "asked to release")
	require.Empty(t, queueKeys(t, cli, name))
}

// TestReleaseIgnoredIsSaid: a holder started without --on-release ignores
// a request, and says so on stderr with how to act on the next; without
// CMD it says it holds until a signal (issue 31: it said nothing while
// the asker was told the request was recorded).
func TestReleaseIgnoredIsSaid(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	p := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", "echo ready; cat >/dev/null")
	p.stdout.waitFor(t, "ready")
	r := runProc(t, nil, "release", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	p.stderr.waitFor(t, "ignored: sh runs on (start etcdlock with --on-release SIGNAL to pass requests on to sh)")
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())

	p = startProc(t, nil, "run", ep(), name)
	p.stdout.waitFor(t, name+"/")
	r = runProc(t, nil, "release", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	p.stderr.waitFor(t, "it holds until this etcdlock gets SIGINT, SIGTERM or SIGHUP")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// TestReleaseElect: elect --on-release passes a request to step down on to
// CMD; the next candidate leads once CMD exited.
func TestReleaseElect(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "elect", ep(), "--on-release", "SIGUSR1", name, "a", "--", "sh", "-c", trapScript)
	p.stdout.waitFor(t, "ready")
	next := startProc(t, nil, "elect", ep(), name, "b", "--", "sh", "-c", `echo "b leads"; cat >/dev/null`)
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, name)) == 2 }, 10*time.Second, 5*time.Millisecond)
	r := runProc(t, nil, "release", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	p.stdout.waitFor(t, "got USR1")
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	next.stdout.waitFor(t, "b leads")
	next.stdin.Close()
	require.Equal(t, 0, next.wait(t), next.stderr.String())
}

// TestStatusShowsRequest: status shows a request its holder has not acted
// on, in text and JSON.
func TestStatusShowsRequest(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)
	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "release requested")

	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	r = runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "release requested: "+m.Key())
	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct {
		Holder struct {
			ReleaseRequested bool `json:"release_requested"`
		} `json:"holder"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.True(t, st.Holder.ReleaseRequested)
	require.NoError(t, m.Unlock(t.Context()))
}

func TestReleaseUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"release"}, "missing lock NAME"},
		{[]string{"release", ""}, "empty lock NAME"},
		{[]string{"release", "__etcdlock"}, `are the library's own`},
		{[]string{"release", "a", "b"}, `unexpected argument "b"`},
		{[]string{"run", "--on-release", "USR1", "n"}, "--on-release passes a request on to CMD"},
		{[]string{"run", "--on-release", "BOGUS", "n", "--", "true"}, `unknown signal "BOGUS"`},
		{[]string{"elect", "--on-release", "TERM", "n", "v"}, "--on-release passes a request on to CMD"},
	} {
		r := runProc(t, nil, tc.args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
	}
}
