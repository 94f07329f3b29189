package etcdlock_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// maxLockPathFiles is how many of the package's files a plain Mutex's
// Lock may run code in (TestLockPathFiles). Issue 41 counted 13 by hand;
// a change that makes it more makes a reader jump further to follow one
// Lock.
const maxLockPathFiles = 12

// TestLockPathFiles counts the files of the package in which a plain
// Mutex's Lock runs code: an uncontended Lock, and a Lock that waits
// behind etcd's own Mutex until it unlocks (internal/etcdtest/cmd/lockpath,
// built with coverage). Every file with a block run between the counters'
// clearing and their writing counts, including what the session's own
// goroutines ran meanwhile, which can only add.
func TestLockPathFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "lockpath")
	build := exec.Command("go", "build", "-cover", "-covermode=atomic", "-coverpkg=github.com/etcdlock/etcdlock,github.com/etcdlock/etcdlock/internal/etcdtest/cmd/lockpath", "-o", bin, "./internal/etcdtest/cmd/lockpath")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	counters := filepath.Join(dir, "counters")
	require.NoError(t, os.Mkdir(counters, 0o755))
	run := exec.CommandContext(t.Context(), bin, "-endpoints", strings.Join(endpoints, ","), "-counters", counters, "-name", lockName(t))
	// Without GOCOVERDIR the program keeps no meta-data; what it writes
	// there at exit (the Unlocks, Close) is not counted.
	run.Env = append(os.Environ(), "GOCOVERDIR="+t.TempDir())
	out, err = run.CombinedOutput()
	require.NoError(t, err, "%s", out)
	profile := filepath.Join(dir, "profile.txt")
	out, err = exec.Command("go", "tool", "covdata", "textfmt", "-i", counters, "-o", profile).CombinedOutput()
	require.NoError(t, err, "%s", out)

	if keep := os.Getenv("ETCDLOCK_LOCKPATH_PROFILE"); keep != "" {
		data, err := os.ReadFile(profile)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(keep, data, 0o644))
	}
	files := filesRun(t, profile)
	t.Logf("a plain Mutex's Lock ran code in %d files: %s", len(files), strings.Join(files, " "))
	require.LessOrEqual(t, len(files), maxLockPathFiles, "files a plain Lock runs code in")
	for _, f := range []string{"wait.go", "watcher.go"} {
		require.Contains(t, files, f, "the second Lock did not wait")
	}
}

// filesRun returns the files of the root package with a block run, in a
// text coverage profile.
func filesRun(t *testing.T, profile string) []string {
	f, err := os.Open(profile)
	require.NoError(t, err)
	defer f.Close()
	var files []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		colon := strings.LastIndex(line, ":")
		if colon < 0 || strings.HasPrefix(line, "mode:") || strings.HasSuffix(line, " 0") {
			continue
		}
		file := line[:colon]
		if rel, ok := strings.CutPrefix(file, "github.com/etcdlock/etcdlock/"); ok && !strings.Contains(rel, "/") && !slices.Contains(files, rel) {
			files = append(files, rel)
		}
	}
	require.NoError(t, sc.Err())
	slices.Sort(files)
	return files
}
