//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"os"
	"path/filepath"
	"syscall"
)

// demoLockFile is the file in a demo's directory that the demo holds an
// flock on while it runs: the kernel drops the lock when the process
// dies, SIGKILL included, so a directory whose lock can be taken is one
// that its demo left behind.
const demoLockFile = "demo.lock"

// mkdirDemo makes the demo's temporary directory, with demoLockFile locked
// until release, or until the process dies. First it removes the
// directories that killed demos left behind (they cannot remove their
// own): those whose lock it can take. The lock file only appears once
// locked (it is renamed into place), so a demo that is starting is never
// taken for a dead one.
func mkdirDemo() (dir string, release func(), err error) {
	removeDeadDemoDirs()
	dir, err = os.MkdirTemp("", demoDirPattern)
	if err != nil {
		return "", nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, demoLockFile+".new"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			err = os.Rename(f.Name(), filepath.Join(dir, demoLockFile))
		}
		if err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, func() { f.Close() }, nil
}

// removeDeadDemoDirs removes the directories of demos that died: those
// in the temporary directory whose lock file it can lock. Any it cannot
// open, that has no lock file, or that is not a directory, it leaves.
func removeDeadDemoDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), demoDirPattern))
	for _, dir := range dirs {
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, demoLockFile), os.O_RDWR, 0)
		if err != nil {
			continue
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			os.RemoveAll(dir)
		}
		f.Close()
	}
}
