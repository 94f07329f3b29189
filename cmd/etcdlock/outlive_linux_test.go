package main

// Issue 43: CMD never outlives its hold. Each test holds the next
// holder's CMD against the previous CMD's liveness: the next CMD, once it
// runs, reads the pids the previous one wrote and says which still run.
// A zombie (killed, not yet reaped) runs nothing: it counts as gone.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// checkGoneScript is the next holder's CMD: for each pid in the files
// "$D/pids.*", "pid N gone" or "pid N alive (stat)", then "checked".
const checkGoneScript = `for p in $(cat "$D"/pids.*); do
  s=$(cat /proc/$p/stat 2>/dev/null)
  case "${s#*) }" in ""|Z*) echo "pid $p gone";; *) echo "pid $p alive ($s)";; esac
done
echo checked`

// readPIDs reads the pids CMD wrote to files names in dir, and arranges
// that they are killed if the test fails before they are gone. It also
// lists them in dir/pids.<name> for checkGoneScript.
func readPIDs(t *testing.T, dir string, names ...string) []int {
	t.Helper()
	var pids []int
	for _, n := range names {
		path := filepath.Join(dir, n)
		var b []byte
		require.Eventually(t, func() bool {
			var err error
			b, err = os.ReadFile(path)
			return err == nil && strings.HasSuffix(string(b), "\n")
		}, procTimeout, 10*time.Millisecond, "CMD wrote no %s", n)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		pids = append(pids, pid)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "pids."+n), b, 0o600))
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL) // none may outlive a failed test
		}
	})
	return pids
}

// requireGoneAtStart waits for next, a run of checkGoneScript, to check
// pids, and fails if any of them still ran when it did; next must then
// exit 0.
func requireGoneAtStart(t *testing.T, next *proc, pids []int) {
	t.Helper()
	next.stdout.waitFor(t, "checked")
	out := next.stdout.String()
	for _, pid := range pids {
		line := next.stdout.waitFor(t, "pid "+strconv.Itoa(pid)+" ")
		require.True(t, strings.HasSuffix(line, " gone"), "the next holder's CMD started while pid %d of the previous hold ran:\n%s", pid, out)
	}
	require.Equal(t, 0, next.wait(t), next.stderr.String())
}

// cmdScript starts a CMD that ignores SIGTERM, writes its pid to $D/cmd,
// starts a child that writes its pid to $D/child (and, with setsid, a
// grandchild in a session of its own, $D/daemon), says "ready", and runs
// until killed.
const cmdScript = `trap '' TERM
echo $$ >"$D/cmd"
sleep 1000 >/dev/null 2>&1 & echo $! >"$D/child"
setsid sh -c 'echo $$ >"$D/daemon"; exec sleep 1000' >/dev/null 2>&1 &
while [ ! -s "$D/daemon" ]; do sleep 0.01; done
echo ready
while :; do sleep 0.1; done`

// Killing the supervisor alone (SIGKILL) takes CMD and all it started
// along before the lock is released: etcdlock says what happened (not
// "CMD was killed by signal 9") and exits 1, and the next run, which gets
// the lock at once, finds none of them running.
func TestSupervisorKilledTakesCmdAlong(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	dir := t.TempDir()
	env := []string{"D=" + dir}
	first := startProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c", cmdScript)
	first.stdout.waitFor(t, "ready")
	pids := readPIDs(t, dir, "cmd", "child", "daemon")
	supervisor := parentOf(t, pids[0])
	require.NotEqual(t, first.cmd.Process.Pid, supervisor, "CMD runs under a supervisor")
	require.NoError(t, syscall.Kill(supervisor, syscall.SIGKILL))

	require.Equal(t, exitFailure, first.wait(t))
	requireOneLineError(t, result{stderr: first.stderr.String()}, fmt.Sprintf("the supervisor of sh (etcdlock __supervise, pid %d) was killed by SIGKILL: sh and every process it started were killed; lock %q was released", supervisor, name))
	next := startProc(t, env, "run", "--try", "--quiet", ep(), name, "--", "sh", "-c", checkGoneScript)
	requireGoneAtStart(t, next, pids)
}

// SIGKILL to etcdlock and its supervisor at once (pkill -9 -f etcdlock):
// CMD dies of its parent-death signal, before the lease the killed run
// leaves behind lets the next holder in. (Processes CMD started are
// handed to init then, and run on: see diesWithParentHelp.)
func TestRunAndSupervisorKilledTakeCmdAlong(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	dir := t.TempDir()
	env := []string{"D=" + dir}
	first := startProc(t, env, "run", "--quiet", "--ttl", "3", ep(), name, "--", "sh", "-c",
		`trap '' TERM; echo $$ >"$D/cmd"; echo ready; while :; do sleep 0.1; done`)
	first.stdout.waitFor(t, "ready")
	pids := readPIDs(t, dir, "cmd")
	supervisor := parentOf(t, pids[0])
	w := watchQueue(t, newClient(t), name)
	next := startProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c", checkGoneScript)
	w.next(t) // the next holder waits

	require.NoError(t, syscall.Kill(first.cmd.Process.Pid, syscall.SIGKILL))
	require.NoError(t, syscall.Kill(supervisor, syscall.SIGKILL))
	requireGoneAtStart(t, next, pids)
}

// When CMD exits, what it left running (a child in its process group, a
// daemon in a session of its own) is killed before the release: the next
// run finds none of it. Its exit code is CMD's.
func TestLeftoversKilledBeforeRelease(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	dir := t.TempDir()
	env := []string{"D=" + dir}
	r := runProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c",
		`sleep 1000 >/dev/null 2>&1 & echo $! >"$D/child"
setsid sh -c 'echo $$ >"$D/daemon"; exec sleep 1000' >/dev/null 2>&1 &
while [ ! -s "$D/daemon" ]; do sleep 0.01; done
exit 3`)
	require.Equal(t, 3, r.code, r.stderr)
	pids := readPIDs(t, dir, "child", "daemon")
	next := startProc(t, env, "run", "--try", "--quiet", ep(), name, "--", "sh", "-c", checkGoneScript)
	requireGoneAtStart(t, next, pids)
}

// --keep-children leaves them running, outside the lock.
func TestKeepChildren(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	r := runProc(t, []string{"D=" + dir}, "run", "--quiet", "--keep-children", ep(), lockName(t), "--", "sh", "-c",
		`sleep 1000 >/dev/null 2>&1 & echo $! >"$D/child"; exit 0`)
	require.Equal(t, 0, r.code, r.stderr)
	pid := readPIDs(t, dir, "child")[0]
	require.NoError(t, syscall.Kill(pid, 0), "--keep-children killed CMD's child")
}

// parentOf returns pid's parent, from /proc.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	require.NoError(t, err)
	return ppid
}

// A holder paused longer than its TTL (here by SIGSTOP to etcdlock alone)
// cannot stop CMD itself: its supervisor, which keeps the lease's
// deadline, does, before the lease can expire. The next holder's CMD
// finds the paused holder's CMD and CMD's child gone when it starts.
// Resumed, etcdlock finds the lock lost.
func TestPausedHolderStopsCmd(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	dir := t.TempDir()
	env := []string{"D=" + dir}
	script := writeScript(t, dir, "cmd.sh", `trap '' TERM
echo $$ >"$D/cmd"
sleep 1000 >/dev/null 2>&1 &
echo $! >"$D/child"
echo "started $ETCDLOCK_KEY"
while :; do sleep 0.1; done
`)
	// TTL 3s: at 1s a loaded machine could lose the lease before CMD
	// had started (renewals every 333ms, given up at 900ms), and the test
	// is of a pause, which it makes as long as the lease needs.
	p := startProc(t, env, "run", "--ttl", "3s", ep(), name, "--", script)
	p.stdout.waitFor(t, "started")
	pids := readPIDs(t, dir, "cmd", "child")
	w := watchQueue(t, newClient(t), name)
	next := startProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c", checkGoneScript)
	w.next(t) // the next holder waits

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	requireGoneAtStart(t, next, pids)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGCONT))
	require.Equal(t, exitLost, p.wait(t))
	require.Contains(t, p.stderr.String(), "etcdlock __supervise: etcdlock did not renew the lease in time (is it paused?)")
}

// The command's explorer check: under each fault, two runs of one lock
// never run CMD at once, by CMD's own log. The first CMD ignores SIGTERM
// (the worst case: it must be killed in time) and logs a line every 50ms
// by the monotonic clock (/proc/uptime); the second logs its start. The
// faults, on an etcd member of the test's own:
//   - the member paused (SIGSTOP) until the first run's session has
//     ended: the first etcdlock stops CMD in jeopardy, by itself, before;
//   - the first etcdlock paused: its supervisor stops CMD by the
//     deadline etcdlock last gave it;
//   - the first etcdlock cut off from etcd (a proxy cut mid-stream).
//
// Each waits for events, not for time: the second run starts CMD only
// once etcd has let it in. The gap between the first CMD's last line and
// the second's first is logged: it is about the kill margin (500ms at
// --ttl 3) plus how late etcd lets the next holder in.
func TestRunNeverOverlaps(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1) // its own: it is paused
	cli := c.Client(t)
	const first = `trap '' TERM
tick() { read up _ </proc/uptime; echo "$1 $ETCDLOCK_TOKEN $up" >>"$L"; }
tick start; echo ready
while :; do tick run; sleep 0.05; done`
	const second = `read up _ </proc/uptime; echo "start $ETCDLOCK_TOKEN $up" >>"$L"; echo started`
	var worst time.Duration
	for _, fault := range []string{"paused member", "paused etcdlock", "partition"} {
		t.Run(strings.ReplaceAll(fault, " ", "_"), func(t *testing.T) {
			name := lockName(t)
			log := filepath.Join(t.TempDir(), "log")
			env := []string{"L=" + log}
			endpoint := "--endpoints=" + c.Endpoint(0)
			var px *etcdtest.Proxy
			if fault == "partition" {
				px = etcdtest.NewProxy(t, c.Endpoint(0))
				endpoint = "--endpoints=" + px.URL()
			}
			a := startProc(t, env, "run", "--quiet", "--ttl", "3", endpoint, name, "--", "sh", "-c", first)
			a.stdout.waitFor(t, "ready")
			w := watchQueue(t, cli, name)
			b := startProc(t, env, "run", "--quiet", "--ttl", "10", "--endpoints="+c.Endpoint(0), name, "--", "sh", "-c", second)
			w.next(t) // b waits
			w.cancel()

			switch fault {
			case "paused member":
				// Resumed as soon as a's session has ended: etcd then
				// expires a's lease and lets b in at once.
				pid := c.PIDs()[0]
				require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
				a.stderr.waitFor(t, "not renewed within its TTL")
				require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
				require.Equal(t, exitJeopardy, a.wait(t), a.stderr.String())
			case "paused etcdlock":
				require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
				b.stdout.waitFor(t, "started")
				require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
				require.Equal(t, exitLost, a.wait(t), a.stderr.String())
			case "partition":
				px.Cut()
				require.Equal(t, exitJeopardy, a.wait(t), a.stderr.String())
			}
			b.stdout.waitFor(t, "started")
			require.Equal(t, 0, b.wait(t), b.stderr.String())
			gap := overlapGap(t, log)
			t.Logf("%s: the second CMD started %v after the first's last line", fault, gap)
			worst = max(worst, gap)
		})
	}
	t.Logf("worst gap: %v", worst)
}

// overlapGap reads a log of TestRunNeverOverlaps and returns the time from
// the first hold's last line to the second's first; it fails the test if
// they overlap.
func overlapGap(t *testing.T, path string) time.Duration {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	type span struct{ from, to float64 }
	spans := map[string]*span{}
	var order []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 3, "log line %q", line)
		at, err := strconv.ParseFloat(f[2], 64)
		require.NoError(t, err)
		s, ok := spans[f[1]]
		if !ok {
			s = &span{at, at}
			spans[f[1]] = s
			order = append(order, f[1])
		}
		s.to = max(s.to, at)
	}
	require.Len(t, order, 2, "want two holds in the log:\n%s", b)
	a, c := spans[order[0]], spans[order[1]]
	require.Less(t, a.to, c.from, "the two CMDs ran at once:\n%s", b)
	return time.Duration((c.from - a.to) * float64(time.Second))
}

// With --pid-namespace even SIGKILL to etcdlock and its supervisor at
// once takes all that CMD started along: the supervisor is init of CMD's
// PID namespace, and the kernel kills the namespace with it. As root, and
// as an unprivileged user (the namespace then needs a user namespace of
// its own). CMD's pids are its namespace's, so the scripts read the
// host's from /proc/self/stat.
func TestPIDNamespaceTakesAllAlong(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run etcdlock as root and as nobody")
	}
	for _, user := range []string{"root", "nobody"} {
		t.Run(user, func(t *testing.T) {
			t.Parallel()
			name := lockName(t)
			// Not t.TempDir: its parents are root's alone.
			dir, err := os.MkdirTemp("", "etcdlock-pidns-")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(dir) })
			require.NoError(t, os.Chmod(dir, 0o777))
			env := []string{"D=" + dir}
			args := []string{"run", "--quiet", "--ttl", "3", "--pid-namespace", ep(), name, "--", "sh", "-c",
				`read -r p _ </proc/self/stat; echo $p >"$D/cmd"
sh -c 'read -r p _ </proc/self/stat; echo $p >"$D/child"; exec sleep 1000' >/dev/null 2>&1 &
setsid sh -c 'read -r p _ </proc/self/stat; echo $p >"$D/daemon"; exec sleep 1000' >/dev/null 2>&1 &
while [ ! -s "$D/child" ] || [ ! -s "$D/daemon" ]; do sleep 0.01; done
echo "ready $$"
while :; do sleep 0.1; done`}
			cmd := exec.Command(bin, args...)
			if user == "nobody" {
				// The binary, in a directory only root may enter, copied
				// where nobody can run it.
				b, err := os.ReadFile(bin)
				require.NoError(t, err)
				nb := filepath.Join(dir, "etcdlock")
				require.NoError(t, os.WriteFile(nb, b, 0o755))
				cmd = exec.Command("setpriv", append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", nb}, args...)...)
			}
			first := startCmd(t, env, cmd)
			ready := first.stdout.waitFor(t, "ready")
			require.NotEqual(t, "ready", ready)
			pids := readPIDs(t, dir, "cmd", "child", "daemon")
			require.NotEqual(t, "ready "+strconv.Itoa(pids[0]), ready, "CMD sees the host's pid: no PID namespace")
			supervisor := parentOf(t, pids[0])
			w := watchQueue(t, newClient(t), name)
			next := startProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c", checkGoneScript)
			w.next(t) // the next holder waits

			runPID := first.cmd.Process.Pid
			if user == "nobody" {
				runPID = parentOf(t, supervisor) // setpriv execs etcdlock: the same pid
			}
			require.NoError(t, syscall.Kill(runPID, syscall.SIGKILL))
			require.NoError(t, syscall.Kill(supervisor, syscall.SIGKILL))
			requireGoneAtStart(t, next, pids)
		})
	}
}
