//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// A demo killed with SIGKILL leaves little behind (its etcd preallocates
// small WAL segments, and its holder process exits), and the next demo
// removes it (issue 43: 123 MB stayed in the temporary directory).
func TestDemoKilled(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	p := startProc(t, []string{"TMPDIR=" + tmp}, "demo")
	line := p.stdout.waitFor(t, ", data in ")
	dir := strings.TrimSuffix(line[strings.Index(line, ", data in ")+len(", data in "):], ".")
	// Killed as its holder process starts, which then finds no etcd.
	p.stdout.waitFor(t, "alice  runs as process ")
	require.NoError(t, p.cmd.Process.Kill())
	<-p.exited
	// Its lock holder, a child that writes to the same stderr, exits too.
	require.True(t, p.stderr.waitEOF(procTimeout), "a child of the killed demo still runs")

	var used int64 // bytes on disk, as du counts them: the WAL is preallocated
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		used += info.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	}))
	require.Less(t, used, int64(8<<20), "a killed demo left %d bytes in %s", used, dir)

	r := runProc(t, []string{"TMPDIR=" + tmp}, "demo")
	require.Equal(t, 0, r.code, r.stderr)
	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries, "the killed demo's directory is still there")
}
