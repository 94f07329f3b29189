//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import "os"

// mkdirDemo makes the demo's temporary directory. A killed demo's
// directory stays behind here: without flock, nothing tells it from a
// running demo's.
func mkdirDemo() (dir string, release func(), err error) {
	dir, err = os.MkdirTemp("", demoDirPattern)
	return dir, func() {}, err
}
