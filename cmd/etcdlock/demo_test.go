package main

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The demo runs without setup, shows the handover from a killed holder,
// exits 0, and leaves nothing in the temporary directory.
func TestDemo(t *testing.T) {
	t.Parallel()
	tmp := t.TempDir()
	r := runProc(t, []string{"TMPDIR=" + tmp}, "demo")
	t.Logf("demo output:\n%s", r.stdout)
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stderr)
	for _, want := range []string{
		"alice  runs as process ",
		"alice  holds the lock ",
		"bob    queues behind alice ",
		"carol  queues behind bob ",
		"holder    alice ",
		"1         bob ",
		"2         carol ",
		"alice  is killed (SIGKILL)",
		"after alice died",
		"bob    unlocks",
		"carol  holds the lock ",
		"the lock is free",
		"removed.",
	} {
		require.Contains(t, r.stdout, want)
	}
	m := regexp.MustCompile(`alice (\d+) < bob (\d+) < carol (\d+)`).FindStringSubmatch(r.stdout)
	require.NotNil(t, m, "no token summary")
	var tokens []int
	for _, s := range m[1:] {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		tokens = append(tokens, n)
	}
	require.Less(t, tokens[0], tokens[1])
	require.Less(t, tokens[1], tokens[2])

	entries, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, entries, "the demo left files behind")
}
