//go:build !linux

package main

import (
	"errors"
	"os/exec"
)

// superviseCmd is the hidden command etcdlock runs CMD through on Linux;
// elsewhere it is not used.
const superviseCmd = "__supervise"

// supervised returns the command that runs c; here, where no signal tells
// a child that its parent died, c itself, in a process group of its own
// if group, and it outlives etcdlock.
func supervised(c *exec.Cmd, group bool) *exec.Cmd {
	if group {
		ownGroup(c)
	}
	return c
}

// cmdSupervise is not used here.
func cmdSupervise([]string) error {
	return errors.New(superviseCmd + " is used on Linux only")
}
