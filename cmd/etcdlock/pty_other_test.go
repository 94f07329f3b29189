//go:build !linux

package main

import (
	"os"
	"testing"
)

// openPTY skips the test: opening a pseudo-terminal is written for Linux
// only.
func openPTY(t *testing.T) (term, tty *os.File) {
	t.Helper()
	t.Skip("pseudo-terminals are opened on Linux only")
	return nil, nil
}
