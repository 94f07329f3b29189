//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// termios reads (req ioctlGetTermios) or sets (ioctlSetTermios) the
// attributes of the terminal f.
func termios(f *os.File, req uintptr, t *syscall.Termios) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(unsafe.Pointer(t)))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// readPassword prints prompt to w and reads a line from the terminal f
// with echo off, as etcdctl does for --user without a password. ok is
// false, with nothing printed or read, when f is not a terminal.
//
// The terminal's settings are restored before it returns, also when
// SIGINT, SIGTERM or SIGHUP arrive meanwhile: then it returns an
// exitError 128+N at once and leaves the read behind, blocked on f, to end
// with the process, which is about to exit.
func readPassword(f *os.File, prompt string, w io.Writer) (password string, ok bool, err error) {
	var old syscall.Termios
	if termios(f, ioctlGetTermios, &old) != nil {
		return "", false, nil
	}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)

	noEcho := old
	noEcho.Lflag &^= syscall.ECHO
	noEcho.Lflag |= syscall.ICANON | syscall.ISIG
	if err := termios(f, ioctlSetTermios, &noEcho); err != nil {
		return "", true, fmt.Errorf("turn off echo on the terminal: %w", err)
	}
	defer termios(f, ioctlSetTermios, &old)
	fmt.Fprint(w, prompt)

	type line struct {
		s   string
		err error
	}
	read := make(chan line, 1)
	go func() {
		// The terminal hands over at most a line per read: nothing after
		// the password is consumed, it is left for CMD.
		var buf []byte
		b := make([]byte, 256)
		for {
			n, err := f.Read(b)
			buf = append(buf, b[:n]...)
			if i := bytes.IndexByte(buf, '\n'); i >= 0 {
				read <- line{s: string(bytes.TrimSuffix(buf[:i], []byte("\r")))}
				return
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("no password given (end of input)")
				}
				read <- line{err: err}
				return
			}
		}
	}()
	select {
	case l := <-read:
		fmt.Fprintln(w) // the Enter the terminal did not echo
		return l.s, true, l.err
	case sig := <-sigc:
		fmt.Fprintln(w)
		return "", true, failf(exitSignalBase+signalNumber(sig), "interrupted by %s at the password prompt", sigName(sig))
	}
}

// isTerminalDevice reports whether f is a terminal, whether or not it is
// this process's controlling terminal.
func isTerminalDevice(f *os.File) bool {
	var t syscall.Termios
	return termios(f, ioctlGetTermios, &t) == nil
}
