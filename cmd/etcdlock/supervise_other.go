//go:build !linux

package main

import (
	"errors"
	"os"
	"os/exec"
	"time"
)

// superviseCmd is the hidden command etcdlock runs CMD through on Linux;
// elsewhere it is not used.
const superviseCmd = "__supervise"

// A child is CMD as etcdlock runs it: here, where no signal tells a child
// that its parent died, CMD itself, in a process group of its own if
// group. It outlives etcdlock if etcdlock is killed.
type child struct {
	cmd   *exec.Cmd
	group bool
	keep  bool
}

// startChild starts c, in a process group of its own if group, and
// returns the channel that gets its Wait result.
func startChild(c *exec.Cmd, group, keep bool, _ time.Duration, _ bool) (*child, <-chan error, error) {
	if group {
		ownGroup(c)
	}
	waitc, err := startLocked(c)
	if err != nil {
		return nil, nil, err
	}
	return &child{cmd: c, group: group, keep: keep}, waitc, nil
}

// signal sends sig to CMD's process group, or to CMD alone.
func (c *child) signal(sig os.Signal) error { return signalCmd(c.cmd, sig, c.group) }

// stop sends CMD SIGTERM.
func (c *child) stop() error { return c.signal(sigTERM) }

// kill sends CMD SIGKILL.
func (c *child) kill() error { return c.signal(sigKILL) }

// deadline does nothing here: etcdlock alone stops CMD in time.
func (c *child) deadline(time.Time) error { return nil }

// exited is called once CMD has exited: unless keep, what is left of its
// process group gets SIGKILL (processes that left the group run on). It
// returns nil: CMD runs under no supervisor here.
func (c *child) exited() os.Signal {
	if c.group && !c.keep {
		signalCmd(c.cmd, sigKILL, true)
	}
	return nil
}

// closed is exited, for a process that runs several children at once.
func (c *child) closed() os.Signal { return c.exited() }

// killStrays does nothing here: no process is handed to etcdlock.
func killStrays(func(pid int) bool) {}

// cmdSupervise is not used here.
func cmdSupervise([]string) error {
	return errors.New(superviseCmd + " is used on Linux only")
}
