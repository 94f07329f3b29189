//go:build unix

package etcdtest

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockFile takes an exclusive lock on path, waiting for it, and returns
// the function that releases it.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// claimPort claims port p for this process among the processes that pick
// ports with FreePort (CI runs test binaries side by side): it takes a
// lock on a file named after the port and keeps it until the process
// exits, when the system releases it, even after a crash. It reports false
// if another live process holds the claim.
func claimPort(p int) bool {
	dir := filepath.Join(os.TempDir(), "etcdlock-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true // no claims possible: the listen check alone
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(p)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	claimed = append(claimed, f) // kept open: the lock lasts as long as the process
	return true
}

// claimed are the files whose locks claim this process's ports.
var claimed []*os.File
