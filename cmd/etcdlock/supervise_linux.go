package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

// superviseCmd is the hidden command etcdlock runs CMD through on Linux:
// the supervisor starts CMD, signals it for etcdlock, stops it by the
// lease's deadline even if etcdlock cannot, exits with CMD's code once
// CMD and every process CMD started are gone, and kills them all if
// etcdlock dies. Its arguments are MODE (supervise or keep-children),
// GROUP (group or shared), --grace in nanoseconds, CMD's path and CMD's
// argv; file descriptor 3 is the control pipe from etcdlock.
const superviseCmd = "__supervise"

// The supervisor's modes: kill what CMD leaves behind when it exits, or
// leave it running (--keep-children).
const (
	superviseKill = "supervise"
	superviseKeep = "keep-children"
)

// A child is CMD as etcdlock runs it. On Linux that is through the
// supervisor, and each link of etcdlock → supervisor → CMD → CMD's
// processes is tied to the one before:
//   - the supervisor reads a pipe whose only writer is etcdlock: at
//     etcdlock's death, however it dies, the pipe ends and the supervisor
//     kills CMD and everything below it;
//   - the pipe carries the lease's deadline after each renewal: if
//     etcdlock stops sending (it is paused, or starved), the supervisor
//     stops CMD by that deadline itself;
//   - CMD gets SIGKILL from the kernel when the supervisor dies (the
//     parent-death signal, which exec keeps);
//   - the supervisor and etcdlock are child subreapers: a process whose
//     parent dies is handed to the nearest of them, not to init, so that
//     neither a double fork nor a new session or process group takes it
//     out of their reach; each kills every child it has before it exits.
//
// What the chain cannot cover is etcdlock and the supervisor killed
// together while CMD's own children run: CMD dies, and its children are
// handed to init. See diesWithParentHelp.
type child struct {
	cmd *exec.Cmd // the supervisor
	ctl *os.File  // the control pipe's write end
}

// The control messages, each a kind byte and a 64-bit argument.
const (
	ctlSignal   = 's' // pass signal N on to CMD
	ctlStop     = 't' // stop CMD: SIGTERM, unless a stop already sent it
	ctlKill     = 'k' // SIGKILL to CMD
	ctlDeadline = 'd' // CMD must be gone by N (CLOCK_MONOTONIC, ns)
	ctlLen      = 9
)

// startChild starts c under a supervisor, in a process group of its own
// if group, and returns the channel that gets the supervisor's Wait
// result. Unless keep, the supervisor kills what CMD leaves running when
// it exits. Its deadline stops CMD (SIGTERM grace before, SIGKILL at it)
// if etcdlock does not.
func startChild(c *exec.Cmd, group, keep bool, grace time.Duration, pidns bool) (*child, <-chan error, error) {
	// Before the supervisor exists: whatever it leaves behind, if it is
	// killed, comes to etcdlock.
	if err := setSubreaper(); err != nil {
		return nil, nil, err
	}
	r, w, err := os.Pipe() // both ends close on exec: only r is passed on
	if err != nil {
		return nil, nil, err
	}
	mode, grp := superviseKill, "shared"
	if keep {
		mode = superviseKeep
	}
	if group {
		grp = "group"
	}
	sup := &exec.Cmd{
		// This very binary, even if its file was replaced since it started.
		Path:       "/proc/self/exe",
		Args:       append([]string{"etcdlock", superviseCmd, mode, grp, strconv.FormatInt(int64(grace), 10), c.Path}, c.Args...),
		Env:        c.Env,
		Dir:        c.Dir,
		Stdin:      c.Stdin,
		Stdout:     c.Stdout,
		Stderr:     c.Stderr,
		ExtraFiles: []*os.File{r}, // fd 3
		// No parent-death signal: the control pipe tells the supervisor
		// of etcdlock's death, whichever of etcdlock's threads forked it.
		SysProcAttr: &syscall.SysProcAttr{},
	}
	if pidns {
		pidNamespace(sup.SysProcAttr)
	}
	waitc, err := startLocked(sup)
	r.Close()
	if err != nil {
		w.Close()
		return nil, nil, err
	}
	return &child{cmd: sup, ctl: w}, waitc, nil
}

func (c *child) send(kind byte, arg int64) error {
	var m [ctlLen]byte
	m[0] = kind
	binary.LittleEndian.PutUint64(m[1:], uint64(arg))
	_, err := c.ctl.Write(m[:])
	return err
}

// pidNamespace makes the supervisor start as init of a PID namespace of
// its own (--pid-namespace): when it dies, however it dies, the kernel
// kills every process in the namespace, and the supervisor's exit waits
// for them. Without root that takes a user namespace too, in which this
// user and group are mapped to themselves.
func pidNamespace(a *syscall.SysProcAttr) {
	a.Cloneflags = syscall.CLONE_NEWPID
	if os.Geteuid() != 0 {
		a.Cloneflags |= syscall.CLONE_NEWUSER
		a.UidMappings = []syscall.SysProcIDMap{{ContainerID: os.Geteuid(), HostID: os.Geteuid(), Size: 1}}
		a.GidMappings = []syscall.SysProcIDMap{{ContainerID: os.Getegid(), HostID: os.Getegid(), Size: 1}}
	}
}

// signal passes sig on to CMD (to its process group, if it has one).
func (c *child) signal(sig os.Signal) error {
	return c.send(ctlSignal, int64(sig.(syscall.Signal)))
}

// stop sends CMD SIGTERM, unless the supervisor has already begun to
// stop it.
func (c *child) stop() error { return c.send(ctlStop, 0) }

// kill sends CMD SIGKILL.
func (c *child) kill() error { return c.send(ctlKill, 0) }

// deadline tells the supervisor that CMD must be gone by t: it sends CMD
// SIGTERM grace before, and SIGKILL at t, unless told a later deadline.
func (c *child) deadline(t time.Time) error {
	now := monotonic()                                   // read before time.Until:
	return c.send(ctlDeadline, now+int64(time.Until(t))) // the deadline errs early, never late
}

// exited is called once the supervisor has exited, and returns the signal
// that killed it, if one did: then CMD has been killed by its
// parent-death signal, and what CMD started has come to etcdlock, which
// kills it here, before the lock is released. It closes the control pipe.
func (c *child) exited() (killedBy os.Signal) {
	sig := c.closed()
	if sig != nil {
		killChildren()
	}
	return sig
}

// closed is exited for a process that runs several children at once
// (shards): it closes the control pipe and returns the signal that
// killed the supervisor, if one did, and kills nothing. What CMD started
// has then come to etcdlock: the caller kills it with killStrays, which
// spares the other children.
func (c *child) closed() (killedBy os.Signal) {
	defer c.ctl.Close()
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return nil
	}
	return ws.Signal()
}

// killStrays kills, with SIGKILL, every child of this process that keep
// does not claim (its own supervisors), and reaps each, until none is
// left: the processes a killed supervisor's CMD started, handed to
// etcdlock as their subreaper, and what they started in turn. Unlike
// killChildren it waits for those pids only, never for any child: the
// other supervisors' exits are their own goroutines' to collect. keep is
// called with the caller's lock held that also guards starting a
// supervisor, so that none is taken for a stray between its start and
// its record.
func killStrays(keep func(pid int) bool) {
	if !procOurs() {
		return
	}
	self := os.Getpid()
	for {
		var strays []int
		for _, pid := range childrenOf(self) {
			if !keep(pid) {
				strays = append(strays, pid)
			}
		}
		if len(strays) == 0 {
			return
		}
		for _, pid := range strays {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		for _, pid := range strays {
			var ws syscall.WaitStatus
			for {
				_, err := syscall.Wait4(pid, &ws, 0, nil)
				if !errors.Is(err, syscall.EINTR) {
					break
				}
			}
		}
	}
}

// supervisorSignals are the signals the supervisor catches and does not
// act on: those sent to etcdlock's process group (the supervisor is in
// it) or by a terminal; etcdlock passes them on to CMD as it sees fit.
// Caught, not ignored: CMD must start with their default actions, and an
// ignored signal stays ignored across exec.
var supervisorSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH, syscall.SIGALRM,
}

// A supervisor is the state of cmdSupervise.
type supervisor struct {
	cmd      *exec.Cmd
	group    bool          // CMD leads a process group of its own
	grace    time.Duration // between the deadline's SIGTERM and its SIGKILL
	killBy   int64         // CLOCK_MONOTONIC ns; 0: no deadline yet
	stopping bool          // SIGTERM was sent to stop CMD
}

// cmdSupervise is the supervisor: it starts CMD (with SIGKILL as its
// parent-death signal; in a process group of its own with GROUP "group"),
// acts on etcdlock's control messages, and when CMD exits kills what CMD
// left running (unless keep-children) and exits with CMD's code (128+N if
// signal N killed CMD). When the control pipe ends, etcdlock is gone, and
// with it, soon, its lease: it kills CMD and all that CMD started, and
// exits.
func cmdSupervise(args []string) error {
	if len(args) < 5 || (args[0] != superviseKill && args[0] != superviseKeep) || (args[1] != "group" && args[1] != "shared") {
		return failf(exitUsage, "%s: want MODE GROUP GRACE PATH ARGV...", superviseCmd)
	}
	grace, err := strconv.ParseInt(args[2], 10, 64)
	if err != nil {
		return failf(exitUsage, "%s: grace: %v", superviseCmd, err)
	}
	ctl := os.NewFile(3, "control pipe")
	if ctl == nil {
		return failf(exitUsage, "%s: no control pipe", superviseCmd)
	}
	syscall.CloseOnExec(3)
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, supervisorSignals...)
	defer signal.Stop(sigc)
	if err := setSubreaper(); err != nil {
		return failf(exitFailure, "%s: %v", superviseCmd, err)
	}

	sv := &supervisor{group: args[1] == "group", grace: time.Duration(grace)}
	sv.cmd = &exec.Cmd{
		Path: args[3], Args: args[4:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: sv.group, Pdeathsig: syscall.SIGKILL},
	}
	// If etcdlock died before this, the control pipe has ended already:
	// the first read below says so, and CMD is killed.
	waitc, err := startLocked(sv.cmd)
	if err != nil {
		return cmdErr(sv.cmd.Args[0], err)
	}
	ctlc := make(chan [ctlLen]byte)
	go readControl(ctl, ctlc)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case err := <-waitc:
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				return failf(exitFailure, "wait for %s: %v", sv.cmd.Args[0], err)
			}
			if args[0] == superviseKill {
				killChildren()
			}
			return exitWith(exitStatus(sv.cmd.ProcessState))
		case m, ok := <-ctlc:
			if !ok {
				// etcdlock is gone, and its lease with the lock will be
				// too: nothing of this hold may run on.
				killChildren()
				return exitWith(exitFailure)
			}
			sv.control(m[0], int64(binary.LittleEndian.Uint64(m[1:])))
		case <-timer.C:
			sv.enforce()
		case <-sigc:
			// Sent to etcdlock's group or by the terminal: etcdlock
			// passes on what CMD is to get.
			continue
		}
		if sv.killBy != 0 {
			timer.Reset(time.Duration(sv.next() - monotonic()))
		}
	}
}

// control acts on one message from etcdlock.
func (sv *supervisor) control(kind byte, arg int64) {
	switch kind {
	case ctlSignal:
		sv.signal(syscall.Signal(arg))
	case ctlStop:
		if !sv.stopping {
			sv.stopping = true
			sv.signal(syscall.SIGTERM)
		}
	case ctlKill:
		sv.signal(syscall.SIGKILL)
	case ctlDeadline:
		sv.killBy = max(sv.killBy, arg)
	}
}

// next is when the deadline next asks for a signal: SIGTERM grace before
// it, then SIGKILL at it.
func (sv *supervisor) next() int64 {
	if sv.stopping {
		return sv.killBy
	}
	return sv.killBy - int64(sv.grace)
}

// enforce stops CMD when the deadline says so and etcdlock has not: it
// has not renewed the lease in time, and the lock may soon pass on.
func (sv *supervisor) enforce() {
	now := monotonic()
	switch {
	case now >= sv.killBy:
		fmt.Fprintf(os.Stderr, "etcdlock %s: etcdlock did not renew the lease in time (is it paused?), and the lock can pass on: sending %s SIGKILL\n", superviseCmd, sv.cmd.Args[0])
		sv.signal(syscall.SIGKILL)
		sv.killBy = now + int64(time.Hour) // once
	case !sv.stopping && now >= sv.killBy-int64(sv.grace):
		fmt.Fprintf(os.Stderr, "etcdlock %s: etcdlock did not renew the lease in time (is it paused?), and the lock can pass on soon: sending %s SIGTERM, and SIGKILL in %s if it still runs\n", superviseCmd, sv.cmd.Args[0], fmtDur(time.Duration(sv.killBy-now)))
		sv.stopping = true
		sv.signal(syscall.SIGTERM)
	}
}

// signal sends sig to CMD's process group, or to CMD alone when it shares
// etcdlock's.
func (sv *supervisor) signal(sig syscall.Signal) {
	pid := sv.cmd.Process.Pid
	if sv.group {
		pid = -pid
	}
	syscall.Kill(pid, sig)
}

// readControl passes on each message etcdlock writes on ctl, and closes
// msgs when ctl ends: etcdlock has exited or died.
func readControl(ctl io.Reader, msgs chan<- [ctlLen]byte) {
	defer close(msgs)
	var m [ctlLen]byte
	for {
		if _, err := io.ReadFull(ctl, m[:]); err != nil {
			return
		}
		msgs <- m
	}
}

// monotonic reads CLOCK_MONOTONIC, which etcdlock and the supervisor
// share, in nanoseconds.
func monotonic() int64 {
	var ts syscall.Timespec
	const clockMonotonic = 1
	syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0)
	return ts.Nano()
}

// setSubreaper makes this process a child subreaper (prctl
// PR_SET_CHILD_SUBREAPER): orphans below it are handed to it.
func setSubreaper() error {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("become a child subreaper: %w", errno)
	}
	return nil
}

// killChildren kills every child of this process with SIGKILL and reaps
// it, until it has none. A subreaper is handed the children of each
// process it kills, so this ends every process below it, whatever process
// group or session they moved to. It returns once none is left; a process
// that SIGKILL cannot end at once (in uninterruptible sleep) is waited for.
// Where /proc cannot tell its children (procOurs), it reaps what has
// exited and returns.
func killChildren() {
	scan := procOurs()
	self := os.Getpid()
	for {
		if scan {
			for _, pid := range childrenOf(self) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// Reap what has exited. WNOHANG: a process may become a child
		// between the scan and the wait (its parent, further down, exited
		// by itself); it is killed at the next scan.
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.ECHILD):
			return
		case err == nil && pid > 0, errors.Is(err, syscall.EINTR):
			continue
		case !scan:
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// procOurs reports whether /proc is of this process's PID namespace. In a
// container that mounts the host's, its pids would name other processes.
func procOurs() bool {
	self, err := os.Readlink("/proc/self")
	return err == nil && self == strconv.Itoa(os.Getpid())
}

// childrenOf returns the pids of the processes whose parent is pid, read
// from /proc (the kernel may lack /proc/PID/task/TID/children).
func childrenOf(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var kids []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone since
		}
		// "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) >= 2 {
			if ppid, err := strconv.Atoi(string(f[1])); err == nil && ppid == pid {
				kids = append(kids, n)
			}
		}
	}
	return kids
}
