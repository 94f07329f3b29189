//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// holdingRun starts etcdlock run with flags on lock name, whose CMD says
// "in KEY" once it holds and holds until its stdin closes.
func holdingRun(t *testing.T, name string, flags ...string) *proc {
	t.Helper()
	args := append(append([]string{"run", "--quiet", ep()}, flags...), name, "--", "sh", "-c", `echo "in $ETCDLOCK_KEY"; cat >/dev/null`)
	return startProc(t, nil, args...)
}

// --shared runs hold together; an exclusive run waits for them all, and
// a --shared run behind it waits for it (no overtaking). status and ls
// show the modes.
func TestRunShared(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	r1 := holdingRun(t, name, "--shared")
	r1.stdout.waitFor(t, "in ")
	r2 := holdingRun(t, name, "--shared")
	r2.stdout.waitFor(t, "in ") // both hold: r1 has not released
	w := watchQueue(t, cli, name)
	ex := holdingRun(t, name)
	exKey := w.next(t)
	r3 := holdingRun(t, name, "--shared")
	r3Key := w.next(t)

	st := statusOf(t, name)
	require.Len(t, st.Holders, 2)
	for _, h := range st.Holders {
		require.Equal(t, "shared", h.Mode)
		require.Equal(t, "sh", h.Command, "run's record")
	}
	require.Len(t, st.Waiters, 2)
	require.Equal(t, exKey, st.Waiters[0].Key)
	require.Equal(t, "exclusive", st.Waiters[0].Mode)
	require.Equal(t, r3Key, st.Waiters[1].Key)
	require.Equal(t, "shared", st.Waiters[1].Mode)
	out := statusText(t, name)
	require.Contains(t, out, "is held by 2, 2 waiting")
	require.Regexp(t, `holder +\S+ +\S+ +\d+ +shared\n`, out)
	r := runProc(t, nil, "ls", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^`+name+` +etcdlock run sh, pid \d+ on \S+ \(\+1 more\) .* 2$`, r.stdout)
	// --try: a reader may not pass the waiting writer.
	r = runProc(t, nil, "run", "--try", "--shared", ep(), name, "--", "true")
	require.Equal(t, exitHeld, r.code, r.stderr)

	r1.stdin.Close()
	require.Equal(t, 0, r1.wait(t), r1.stderr.String())
	r2.stdin.Close()
	require.Equal(t, 0, r2.wait(t), r2.stderr.String())
	require.Equal(t, "in "+exKey, ex.stdout.waitFor(t, "in "))
	st = statusOf(t, name)
	require.Len(t, st.Holders, 1, "the reader behind the writer waits")
	require.Equal(t, exKey, st.Holder.Key)
	ex.stdin.Close()
	require.Equal(t, 0, ex.wait(t), ex.stderr.String())
	require.Equal(t, "in "+r3Key, r3.stdout.waitFor(t, "in "))
	r3.stdin.Close()
	require.Equal(t, 0, r3.wait(t), r3.stderr.String())
	require.Empty(t, queueKeys(t, cli, name))
}

// --permits N --of C: runs hold together while their permits fit C, in
// queue order; status and ls show the permits.
func TestRunPermits(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	a := holdingRun(t, name, "--permits", "1", "--of", "3")
	a.stdout.waitFor(t, "in ")
	b := holdingRun(t, name, "--permits", "2", "--of", "3")
	b.stdout.waitFor(t, "in ") // 1+2 fit 3: both hold
	w := watchQueue(t, cli, name)
	c := holdingRun(t, name, "--permits", "1", "--of", "3")
	cKey := w.next(t)

	st := statusOf(t, name)
	require.Len(t, st.Holders, 2)
	require.Equal(t, modeJSON{Mode: "permits", Weight: 1, Capacity: 3}, st.Holders[0].modeJSON)
	require.Equal(t, modeJSON{Mode: "permits", Weight: 2, Capacity: 3}, st.Holders[1].modeJSON)
	require.Len(t, st.Waiters, 1)
	require.Equal(t, cKey, st.Waiters[0].Key)
	out := statusText(t, name)
	require.Contains(t, out, "permits held: 3 of 3\n")
	require.Regexp(t, `(?m)^1 +`+cKey+` .* 1 of 3$`, out)
	r := runProc(t, nil, "ls", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `"mode": "2 of 3"`)
	r = runProc(t, nil, "run", "--try", "--permits", "1", "--of", "3", ep(), name, "--", "true")
	require.Equal(t, exitHeld, r.code, r.stderr)

	b.stdin.Close()
	require.Equal(t, 0, b.wait(t), b.stderr.String())
	require.Equal(t, "in "+cKey, c.stdout.waitFor(t, "in "))
	for _, p := range []*proc{a, c} {
		p.stdin.Close()
		require.Equal(t, 0, p.wait(t), p.stderr.String())
	}
	require.Empty(t, queueKeys(t, cli, name))
}

func TestRunModeUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--shared", "--permits", "1", "--of", "2"}, "--shared and --permits/--of exclude each other"},
		{[]string{"--shared", "--of", "2"}, "--shared and --permits/--of exclude each other"},
		{[]string{"--permits", "1"}, "--permits needs --of"},
		{[]string{"--of", "2"}, "--of needs --permits"},
		{[]string{"--permits", "3", "--of", "2"}, "--permits must be from 1 to --of (2), not 3"},
		{[]string{"--permits", "0", "--of", "2"}, "--permits must be from 1 to --of (2), not 0"},
		{[]string{"--permits", "1", "--of", "0"}, "--of must be at least 1, not 0"},
		{[]string{"--permits", "x", "--of", "2"}, `invalid value "x" for flag -permits`},
	} {
		r := runProc(t, nil, append(append([]string{"run", "--endpoints=127.0.0.1:1"}, tc.args...), "n", "--", "true")...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
		require.True(t, strings.HasSuffix(r.stderr, "(see 'etcdlock run --help')\n"), r.stderr)
	}
}
