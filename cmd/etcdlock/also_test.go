package main

import (
	"strconv"
	"strings"
	"testing"

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
