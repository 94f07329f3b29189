package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestGrants: the lines grants prints, applied to a fresh role on an etcd
// with authentication on, give a user of that role every use they name
// (run with a lock delay, status, release heard by the holder) and nothing
// more: another lock, or a write with --observe-only, is refused (exit 3).
func TestGrants(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	name := "/" + lockName(t) + "/" // as etcd's examples name locks
	apply := func(role string, args ...string) {
		t.Helper()
		r := runProc(t, nil, append([]string{"grants", "--role", role}, args...)...)
		require.Equal(t, 0, r.code, r.stderr)
		_, err := root.RoleAdd(t.Context(), role)
		require.NoError(t, err)
		applyGrants(t, root, role, r.stdout)
		_, err = root.UserAdd(t.Context(), role+"-user", "pw")
		require.NoError(t, err)
		_, err = root.UserGrantRole(t.Context(), role+"-user", role)
		require.NoError(t, err)
	}
	apply("locker", "--lock-delay", "--requests", name)
	apply("watcher", "--observe-only", name)
	apply("plain", name)
	require.NoError(t, etcdtest.EnableAuth(t.Context(), root, "secret"))
	eps := "--endpoints=" + c.Endpoint(0)
	locker, watcher := []string{"--user", "locker-user:pw"}, []string{"--user", "watcher-user:pw"}
	cmdline := func(user []string, args ...string) []string {
		return append(append([]string{args[0], eps}, user...), args[1:]...)
	}

	p := startProc(t, nil, cmdline(locker, "run", "--lock-delay", "2s", "--on-release", "TERM", name, "--", "sh", "-c", "echo ready; exec sleep 30")...)
	p.stdout.waitFor(t, "ready")
	for _, user := range [][]string{locker, watcher} {
		r := runProc(t, nil, cmdline(user, "status", name)...)
		require.Equal(t, 0, r.code, r.stderr)
		require.Contains(t, r.stdout, "is held")
	}
	r := runProc(t, nil, cmdline(watcher, "release", name)...)
	require.Equal(t, exitConnect, r.code, "observe-only may not ask: %s", r.stderr)
	r = runProc(t, nil, cmdline(locker, "release", name)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, 128+15, p.wait(t), "the holder heard the request: %s", p.stderr.String())
	require.NotContains(t, p.stderr.String(), "permission denied")

	r = runProc(t, nil, cmdline(watcher, "run", name, "--", "true")...)
	require.Equal(t, exitConnect, r.code, "observe-only may not lock: %s", r.stderr)
	r = runProc(t, nil, cmdline(locker, "run", "--lock-delay", "2s", lockName(t)+"-other", "--", "true")...)
	require.Equal(t, exitConnect, r.code, "another lock is not granted: %s", r.stderr)
	// Without the delay's grants, run --lock-delay is refused, and the
	// message names the delay records' prefix too (issue 31: it named
	// only the lock's key, which the user may write).
	plain := []string{"--user", "plain-user:pw"}
	r = runProc(t, nil, cmdline(plain, "run", "--lock-delay", "2s", name, "--", "true")...)
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, `this run needs readwrite permission on the keys with prefix "`+name+`/" and "`+etcdlock.LockDelayPrefix+name+`/"; 'etcdlock grants --role ROLE --lock-delay -- `+name+`' prints the etcdctl lines`)
	// Of the two, only the records' prefix was refused: a probe found
	// which (issue 40), and the message names that one alone.
	require.Contains(t, r.stderr, `may not write the keys with prefix "`+etcdlock.LockDelayPrefix+name+`/" (`, r.stderr)
	r = runProc(t, nil, cmdline(plain, "run", name, "--", "true")...)
	require.Equal(t, 0, r.code, "without a delay, the lock's own keys suffice: %s", r.stderr)

	// run --min-hold refused names the grants command with --min-hold,
	// whose lines let the same run in (issue 41: the hint named grants
	// without it, whose lines left the run refused).
	r = runProc(t, nil, cmdline(plain, "run", "--min-hold", "100ms", name, "--", "true")...)
	require.Equal(t, exitConnect, r.code, r.stderr)
	_, hint, ok := strings.Cut(r.stderr, "; '")
	require.True(t, ok, r.stderr)
	hint, _, ok = strings.Cut(hint, "' prints the etcdctl lines")
	require.True(t, ok, r.stderr)
	words := etcdtest.ShellWords(hint)
	require.Equal(t, []string{"etcdlock", "grants", "--role", "ROLE", "--min-hold", "--", name}, words, r.stderr)
	words[3] = "plain"
	g := runProc(t, nil, words[1:]...)
	require.Equal(t, 0, g.code, g.stderr)
	admin := c.Client(t, clientv3.Config{Username: "root", Password: "secret"})
	for _, l := range strings.Split(strings.TrimSuffix(g.stdout, "\n"), "\n") {
		w := etcdtest.ShellWords(l)
		require.Len(t, w, 7, l)
		_, err := admin.RoleGrantPermission(t.Context(), w[3], w[6], clientv3.GetPrefixRangeEnd(w[6]), clientv3.PermissionType(clientv3.PermReadWrite))
		require.NoError(t, err, l)
	}
	r = runProc(t, nil, cmdline(plain, "run", "--min-hold", "100ms", name, "--", "true")...)
	require.Equal(t, 0, r.code, "the hint's lines let the run in: %s", r.stderr)
}

func TestGrantsUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"grants"}, "missing lock NAME"},
		{[]string{"grants", "__etcdlock"}, `lock NAME "__etcdlock": "__etcdlock" and the names`},
		{[]string{"grants", "--role", "", "n"}, "empty --role"},
		{[]string{"grants", "--prefix", ""}, "empty --prefix: that is every key"},
		{[]string{"grants", "--prefix", "__etcdlock/delay/"}, `--prefix "__etcdlock/delay/": no lock's name begins with it`},
		// These would grant every team's records under "__etcdlock/".
		{[]string{"grants", "--prefix", "_"}, `--prefix "_" would also grant the records under "__etcdlock/" of every lock`},
		{[]string{"grants", "--prefix", "__etcdlock"}, `--prefix "__etcdlock" would also grant`},
	} {
		r := runProc(t, nil, tc.args...)
		require.Equal(t, exitUsage, r.code, "%q: %s", tc.args, r.stderr)
		requireOneLineError(t, r, tc.want)
	}
	r := runProc(t, nil, "grants", "--role", "ops", "a", "--requests", "it's")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, `etcdctl role grant-permission ops readwrite --prefix a/
etcdctl role grant-permission ops readwrite --prefix __etcdlock/release/a/
etcdctl role grant-permission ops readwrite --prefix 'it'\''s/'
etcdctl role grant-permission ops readwrite --prefix '__etcdlock/release/it'\''s/'
`, r.stdout)
	// A prefix is taken as etcd takes one: no "/" is added. Names and
	// prefixes may be given together, and each flag applies to all.
	r = runProc(t, nil, "grants", "--role", "jobs", "--prefix", "jobs/", "--lock-delay", "--observe-only", "x")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, `etcdctl role grant-permission jobs read --prefix x/
etcdctl role grant-permission jobs read --prefix __etcdlock/delay/x/
etcdctl role grant-permission jobs read --prefix jobs/
etcdctl role grant-permission jobs read --prefix __etcdlock/delay/jobs/
`, r.stdout)
	// A minimum hold keeps its records where a lock delay does.
	r = runProc(t, nil, "grants", "--role", "ops", "--min-hold", "a")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, `etcdctl role grant-permission ops readwrite --prefix a/
etcdctl role grant-permission ops readwrite --prefix __etcdlock/delay/a/
`, r.stdout)
}

// etcdctlEnv names the etcdctl binary TestGrantsRunInEtcdctl runs (else
// it looks for etcdctl on PATH); etcdctlRequireEnv, when set (CI sets
// it), makes a missing etcdctl a failure rather than a skip.
const (
	etcdctlEnv        = "ETCDLOCK_TEST_ETCDCTL"
	etcdctlRequireEnv = "ETCDLOCK_TEST_REQUIRE_ETCDCTL"
)

// etcdctlBinary returns the etcdctl the tests run, or skips the test.
func etcdctlBinary(t *testing.T) string {
	t.Helper()
	return toolBinary(t, "etcdctl", etcdctlEnv, etcdctlRequireEnv, "Debian's etcd-client has one")
}

// TestGrantsRunInEtcdctl: the lines grants prints are run by a shell
// with a real etcdctl, and grant what they say, for names and for
// prefixes, even for a role, a lock name or a prefix that begins with
// "-", which etcdctl would take for flags without the "--" the lines
// then carry.
func TestGrantsRunInEtcdctl(t *testing.T) {
	t.Parallel()
	bin := etcdctlBinary(t)
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	for _, tc := range []struct{ role, name, prefix string }{
		{"ops", "jobs/backup", ""},
		{"-ops", "jobs/backup", ""},
		{"ops2", "-x", ""},
		{"--all", "-x/y z", ""},
		{"team", "", "team/"},
		{"-team", "", "-team x/"},
	} {
		_, err := root.RoleAdd(t.Context(), tc.role)
		require.NoError(t, err)
		args := []string{"grants", "--role", tc.role, "--requests", "--", tc.name}
		want := []string{tc.name + "/", etcdlock.ReleaseRequestPrefix + tc.name + "/"}
		if tc.prefix != "" {
			args = []string{"grants", "--role", tc.role, "--requests", "--prefix", tc.prefix}
			want = []string{tc.prefix, etcdlock.ReleaseRequestPrefix + tc.prefix}
		}
		r := runProc(t, nil, args...)
		require.Equal(t, 0, r.code, r.stderr)
		for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
			cmd := exec.Command("sh", "-c", l)
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"), "ETCDCTL_API=3", "ETCDCTL_ENDPOINTS="+c.Endpoint(0))
			if filepath.Base(bin) != "etcdctl" {
				t.Fatalf("%s: the lines run etcdctl by that name", bin)
			}
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s:\n%s", l, out)
		}
		resp, err := root.RoleGet(t.Context(), tc.role)
		require.NoError(t, err)
		var got []string
		for _, p := range resp.Perm {
			require.Equal(t, clientv3.PermissionType(clientv3.PermReadWrite), clientv3.PermissionType(p.PermType), tc.role)
			require.Equal(t, clientv3.GetPrefixRangeEnd(string(p.Key)), string(p.RangeEnd), "a prefix")
			got = append(got, string(p.Key))
		}
		require.ElementsMatch(t, want, got, tc.role)
	}
}
