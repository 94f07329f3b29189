//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
)

// forwardSignals are the signals etcdlock passes on to CMD, and that make
// it leave the queue while it waits.
var forwardSignals = []os.Signal{os.Interrupt}

// isTerminal reports whether f is a terminal; here, where that is not
// known, never: progress is shown as plain lines.
func isTerminal(*os.File) bool { return false }

// interactive reports whether CMD should share the terminal with
// etcdlock; here CMD always shares etcdlock's console.
func interactive() bool { return true }

// ownGroup would put c in a process group of its own; not done here.
func ownGroup(*exec.Cmd) {}

// signalCmd stops c's process (process groups are not used here).
// Only Kill is supported on every system, so every signal is Kill.
func signalCmd(c *exec.Cmd, _ os.Signal, _ bool) error {
	return c.Process.Kill()
}

var (
	sigTERM os.Signal = os.Interrupt
	sigKILL os.Signal = os.Kill
)

// signalNumber returns sig's number, for the exit code 128+N.
func signalNumber(os.Signal) int { return 2 }

// exitStatus returns the exit code of a finished process.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }

// sigName names sig the way people know it.
func sigName(sig os.Signal) string { return sig.String() }

// readPassword would read a password from a terminal with echo off; here
// it never does, and ok is false: --user then needs its password given.
func readPassword(*os.File, string, io.Writer) (password string, ok bool, err error) {
	return "", false, nil
}

// isTerminalDevice reports whether f is a terminal; here, where that is
// not checked, never: output is plain lines.
func isTerminalDevice(*os.File) bool { return false }

// parseSignal reads --on-release's SIGNAL: here no signal can be sent to
// CMD but an interrupt.
func parseSignal(v string) (os.Signal, error) {
	if v == "INT" || v == "SIGINT" {
		return os.Interrupt, nil
	}
	return nil, errors.New("--on-release: only INT can be sent on this system")
}
