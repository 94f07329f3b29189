package main

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

// superviseCmd is the hidden command etcdlock runs CMD through on Linux,
// when CMD has a process group of its own: the supervisor leads that
// group, starts CMD in it, and exits with CMD's code. Its arguments are
// the pid of the etcdlock that started it, CMD's path, and CMD's argv.
const superviseCmd = "__supervise"

// supervised returns the command that runs c and dies with etcdlock, on
// Linux by the parent-death signal (prctl PR_SET_PDEATHSIG), which the
// kernel sends to a child when the thread that forked it exits: start it
// with startLocked. Pdeathsig reaches the child alone, not the processes
// it starts, so when c is to have a process group of its own (group), it
// runs under a supervisor (this binary as superviseCmd) that leads the
// group, gets the signal, and kills the group. Otherwise c shares
// etcdlock's group with the terminal and whoever else is in it: c alone
// gets SIGKILL.
func supervised(c *exec.Cmd, group bool) *exec.Cmd {
	if !group {
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return c
	}
	args := append([]string{"etcdlock", superviseCmd, strconv.Itoa(os.Getpid()), c.Path}, c.Args...)
	return &exec.Cmd{
		// This very binary, even if its file was replaced since it started.
		Path:   "/proc/self/exe",
		Args:   args,
		Env:    c.Env,
		Dir:    c.Dir,
		Stdin:  c.Stdin,
		Stdout: c.Stdout,
		Stderr: c.Stderr,
		// SIGTERM, not SIGKILL: the supervisor must live to kill the
		// group. Before it catches the signal it has started nothing, so
		// dying of it then leaves nothing behind.
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM},
	}
}

// cmdSupervise is the supervisor: it starts CMD in its own process group
// (which it leads), exits with CMD's code (128+N if signal N killed CMD),
// and kills the whole group with SIGKILL, itself included, once the
// etcdlock that started it has died. Signals etcdlock sends to the group
// reach CMD directly; the supervisor ignores them.
func cmdSupervise(args []string) error {
	if len(args) < 3 {
		return failf(exitUsage, "%s: want PARENT-PID PATH ARGV...", superviseCmd)
	}
	parent, err := strconv.Atoi(args[0])
	if err != nil {
		return failf(exitUsage, "%s: %v", superviseCmd, err)
	}
	// The parent-death signal is SIGTERM, which etcdlock also forwards:
	// whether the parent is gone tells the two apart (an orphan has a new
	// parent), and keeps a signal sent when a thread of etcdlock's, not
	// etcdlock, ended from killing anything.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	// Checked after Notify: from here on the parent's death is a signal
	// in sigc. If it died before, CMD is not started at all.
	if os.Getppid() != parent {
		return failf(exitFailure, "%s: etcdlock exited before CMD started", superviseCmd)
	}
	cmd := &exec.Cmd{Path: args[1], Args: args[2:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	if err := cmd.Start(); err != nil {
		return cmdErr(cmd.Args[0], err)
	}
	// Ends when CMD exits: this process exits no sooner.
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()
	for {
		select {
		case err := <-waitc:
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				return failf(exitFailure, "wait for %s: %v", cmd.Args[0], err)
			}
			return exitWith(exitStatus(cmd.ProcessState))
		case <-sigc:
			if os.Getppid() != parent {
				// etcdlock is gone, and its lease with the lock will
				// be too: nothing of this hold may run on.
				syscall.Kill(-os.Getpid(), syscall.SIGKILL)
			}
		}
	}
}
