//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// TestWatchSaysUnreachable: while etcd does not answer (here its only
// member is paused with SIGSTOP: connections stay open, and the watch
// waits without an error), status --watch and elect --listen say so on
// stderr, and say when it answers again; the changes made meanwhile
// follow.
func TestWatchSaysUnreachable(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	name := lockName(t)
	st := startProc(t, nil, "status", "--watch", "--command-timeout", "2s", "--endpoints="+c.Endpoint(0), name)
	el := startProc(t, nil, "elect", "--listen", "--command-timeout", "2s", "--endpoints="+c.Endpoint(0), name+"-election")
	require.Regexp(t, `  free$`, st.stdout.waitLine(t, 0))
	require.Regexp(t, `^no leader `, el.stdout.waitLine(t, 0))

	pid := c.PIDs()[0]
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	for _, p := range []*proc{st, el} {
		line := p.stderr.waitFor(t, "etcd does not answer")
		require.Regexp(t, `^etcdlock: etcd does not answer since `+stamp+` \(no answer within 2s, --command-timeout\); what is shown may be stale until it does$`, line)
	}
	require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	resumed = true
	for _, p := range []*proc{st, el} {
		require.Regexp(t, `^etcdlock: etcd answers again at `+stamp+`, after \S+ without an answer$`, p.stderr.waitFor(t, "etcd answers again"))
	}
	cli := c.Client(t)
	m, _ := holdLock(t, cli, name)
	require.Regexp(t, `  held by `+regexp.QuoteMeta(m.Key())+` .*, 0 waiting  \(`+regexp.QuoteMeta(m.Key())+` joined\)$`, st.stdout.waitLine(t, 1))
	campaign(t, cli, name+"-election", "back")
	require.Regexp(t, `^leader "back" `, el.stdout.waitLine(t, 1))

	for _, p := range []*proc{st, el} {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
		require.Equal(t, 0, p.wait(t), p.stderr.String())
		// One line each way per outage, down first, up last: a busy
		// machine may make a question miss its timeout once more.
		var kinds []string
		for _, line := range strings.Split(strings.TrimSuffix(p.stderr.String(), "\n"), "\n") {
			switch {
			case strings.Contains(line, "etcd does not answer since"):
				kinds = append(kinds, "down")
			case strings.Contains(line, "etcd answers again"):
				kinds = append(kinds, "up")
			default:
				t.Fatalf("unexpected line on stderr: %q", line)
			}
		}
		require.Equal(t, 0, len(kinds)%2, p.stderr.String())
		for i, k := range kinds {
			require.Equal(t, []string{"down", "up"}[i%2], k, p.stderr.String())
		}
	}
}
