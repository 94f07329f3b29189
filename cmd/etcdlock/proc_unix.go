//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"unsafe"
)

// forwardSignals are the signals etcdlock passes on to CMD, and that make
// it leave the queue while it waits.
var forwardSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// ttyForeground returns the foreground process group of the terminal f,
// and false if f is not a terminal that is this process's controlling
// terminal.
func ttyForeground(f *os.File) (int, bool) {
	var pgrp int32
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), uintptr(syscall.TIOCGPGRP), uintptr(unsafe.Pointer(&pgrp)))
	return int(pgrp), errno == 0
}

// isTerminal reports whether f is this process's terminal.
func isTerminal(f *os.File) bool {
	_, ok := ttyForeground(f)
	return ok
}

// interactive reports whether stdin is the terminal and this process is in
// its foreground: then CMD shares etcdlock's process group to use it.
func interactive() bool {
	pgrp, ok := ttyForeground(os.Stdin)
	return ok && pgrp == syscall.Getpgrp()
}

// ownGroup makes c start in a process group of its own, so that signals
// sent to the group reach CMD's children too.
func ownGroup(c *exec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// signalCmd sends sig to c's process group if it has one of its own
// (group), else to c's process.
func signalCmd(c *exec.Cmd, sig os.Signal, group bool) error {
	if group {
		return syscall.Kill(-c.Process.Pid, sig.(syscall.Signal))
	}
	return c.Process.Signal(sig)
}

var (
	sigTERM os.Signal = syscall.SIGTERM
	sigKILL os.Signal = syscall.SIGKILL
)

// signalNumber returns sig's number, for the exit code 128+N.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// exitStatus returns the exit code of a finished process as a shell would:
// 128+N when signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalBase + int(ws.Signal())
	}
	return ps.ExitCode()
}

// sigName names sig the way people know it.
func sigName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	}
	if s, ok := sig.(syscall.Signal); ok {
		return fmt.Sprintf("signal %d (%s)", int(s), s)
	}
	return sig.String()
}

// releaseSignals are the signals --on-release takes, by name.
var releaseSignals = map[string]syscall.Signal{
	"HUP": syscall.SIGHUP, "INT": syscall.SIGINT, "QUIT": syscall.SIGQUIT, "TERM": syscall.SIGTERM,
	"USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "WINCH": syscall.SIGWINCH, "ALRM": syscall.SIGALRM,
}

// parseSignal reads --on-release's SIGNAL: a name, with or without "SIG"
// (TERM, SIGUSR1), or a number from 1 to 31.
func parseSignal(v string) (os.Signal, error) {
	name := strings.TrimPrefix(strings.ToUpper(v), "SIG")
	if sig, ok := releaseSignals[name]; ok {
		return sig, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 1 && n <= 31 {
		return syscall.Signal(n), nil
	}
	return nil, fmt.Errorf("unknown signal %q (HUP, INT, QUIT, TERM, USR1, USR2, WINCH, ALRM, or a number)", v)
}
