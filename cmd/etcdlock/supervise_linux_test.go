package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A SIGKILLed etcdlock run takes CMD with it, and what CMD started: the
// next waiter, which gets the lock once the killed run's lease expires,
// finds none of those processes running when its own CMD starts. (The
// lease bars it until then: the supervisor has the whole TTL to kill the
// group, which is what the design promises, not a race the test wins.)
func TestKilledRunTakesCmdAlong(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	dir := t.TempDir()
	env := []string{"D=" + dir}
	first := startProc(t, env, "run", "--quiet", "--ttl", "6s", ep(), name, "--", "sh", "-c",
		`sleep 1000 & echo $! >"$D/child"; echo $$ >"$D/cmd"; echo $PPID >"$D/parent"; echo ready; wait`)
	first.stdout.waitFor(t, "ready")
	var pids []int // CMD's parent (the supervisor), CMD, CMD's child
	for _, f := range []string{"parent", "cmd", "child"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL) // if the test failed: none of them may outlive it
		}
	})
	require.NotEqual(t, first.cmd.Process.Pid, pids[0], "CMD runs under a supervisor")

	w := watchQueue(t, cli, name)
	// The next holder's CMD tells, for each pid, its /proc/PID/stat, or
	// "gone". A process killed but not yet reaped by init is a zombie
	// (state Z): gone too.
	second := startProc(t, env, "run", "--quiet", ep(), name, "--", "sh", "-c",
		`for p in $(cat "$D/parent" "$D/cmd" "$D/child"); do s=$(cat /proc/$p/stat 2>/dev/null); echo "pid $p ${s:-gone}"; done; echo checked`)
	w.next(t) // the second run waits
	require.NoError(t, first.cmd.Process.Kill())
	<-first.exited

	second.stdout.waitFor(t, "checked")
	require.Equal(t, 0, second.wait(t), second.stderr.String())
	out := second.stdout.String()
	for _, pid := range pids {
		line := second.stdout.waitFor(t, "pid "+strconv.Itoa(pid)+" ")
		if strings.HasSuffix(line, " gone") {
			continue
		}
		// stat is "PID (COMM) STATE ...", COMM may hold spaces.
		_, rest, ok := strings.Cut(line, ") ")
		require.True(t, ok, "stat line %q", line)
		require.True(t, strings.HasPrefix(rest, "Z "), "pid %d still ran when the next holder's CMD started:\n%s", pid, out)
	}
}

// With the terminal as standard input, CMD shares etcdlock's process group
// (to use the terminal), and a SIGKILLed etcdlock takes CMD alone along.
// etcdlock leads the terminal's session here, so its death also sends
// SIGHUP to the group: CMD ignores it, and only the parent-death signal
// can end it. A FIFO tells when CMD is gone: its read end sees EOF once
// its only writer, CMD, has died.
func TestKilledRunOnTerminalTakesCmdAlong(t *testing.T) {
	t.Parallel()
	term, tty := openPTY(t)
	out := readPTY(term)
	fifo := filepath.Join(t.TempDir(), "fifo")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	// Opened now, so that CMD's open for writing does not block; read
	// only once CMD holds it open.
	r, err := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })

	cmd := exec.Command(bin, "run", "--quiet", ep(), lockName(t), "--", "sh", "-c",
		`trap "" HUP; exec 3>"$F"; echo "ready $$"; exec sleep 1000`)
	cmd.Env = append(cleanEnv(), "ETCDCTL_DIAL_TIMEOUT=30s", "F="+fifo)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// A session of its own with the terminal as its controlling one:
	// etcdlock is in the terminal's foreground, as in a shell.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })

	s := out.waitFor(t, 0, "ready line", func(s string) bool { return strings.Contains(s, "\n") && strings.Contains(s, "ready ") })
	f := strings.Fields(s[strings.Index(s, "ready "):])
	pid, err := strconv.Atoi(f[1])
	require.NoError(t, err, s)
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // if the test failed
	require.NoError(t, cmd.Process.Kill())
	<-exited

	require.NoError(t, r.SetReadDeadline(time.Now().Add(procTimeout)))
	_, err = r.Read(make([]byte, 1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("CMD (pid %d) still runs %v after etcdlock was killed", pid, procTimeout)
	}
	require.ErrorIs(t, err, io.EOF)
}
