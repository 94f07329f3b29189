package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitLine returns line i (from 0) of what the process wrote, waiting for
// it.
func (l *lines) waitLine(t *testing.T, i int) string {
	t.Helper()
	return l.wait(t, fmt.Sprintf("line %d", i), func(all []string) (string, bool) {
		if i < len(all) {
			return all[i], true
		}
		return "", false
	})
}

// stopWatch interrupts a watching etcdlock as Ctrl-C does, and checks that
// it exits 0 and wrote nothing to stderr.
func stopWatch(t *testing.T, p *proc) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	require.Empty(t, p.stderr.String())
}

// stamp matches the time at the start of a line of the plain watch
// output.
const stamp = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)`

// TestStatusWatch: every change of the queue is a line, in order, with the
// state after it and what changed; a nested lock's keys show nothing;
// Ctrl-C ends it with exit 0.
func TestStatusWatch(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t)
	p := startProc(t, nil, "status", "--watch", ep(), name)
	require.Regexp(t, `^`+stamp+`  rev \d+  free$`, p.stdout.waitLine(t, 0))

	m, _ := holdLock(t, cli, name)
	tok := strconv.FormatInt(m.Token(), 10)
	k := regexp.QuoteMeta(m.Key())
	require.Regexp(t, `^`+stamp+`  rev `+tok+`  held by `+k+` \(token `+tok+`\), 0 waiting  \(`+k+` joined\)$`, p.stdout.waitLine(t, 1))

	holdLock(t, cli, name+"/sub") // another lock: no line
	w := startWaiter(t, cli, name)
	wk := `(` + regexp.QuoteMeta(name) + `/[0-9a-f]+)`
	line := p.stdout.waitLine(t, 2)
	require.Regexp(t, `  held by `+k+` \(token `+tok+`\), 1 waiting  \(`+wk+` joined\)$`, line)
	waiterKey := regexp.MustCompile(wk + ` joined`).FindStringSubmatch(line)[1]

	require.NoError(t, m.Unlock(ctx))
	require.Regexp(t, `  held by `+regexp.QuoteMeta(waiterKey)+` \(token \d+\), 0 waiting  \(`+k+` left\)$`, p.stdout.waitLine(t, 3))
	w.unlock(t)
	require.Regexp(t, `  free  \(`+regexp.QuoteMeta(waiterKey)+` left\)$`, p.stdout.waitLine(t, 4))

	stopWatch(t, p)
	lines := strings.Split(strings.TrimSuffix(p.stdout.String(), "\n"), "\n")
	require.Len(t, lines, 5, "a line for the nested lock?\n%s", p.stdout)
	requireRevisionsRise(t, lines)
}

// requireRevisionsRise checks that each line's "rev N" is above the line
// before's.
func requireRevisionsRise(t *testing.T, lines []string) {
	t.Helper()
	re := regexp.MustCompile(`  rev (\d+)  `)
	last := int64(0)
	for _, l := range lines {
		m := re.FindStringSubmatch(l)
		require.NotNil(t, m, l)
		rev, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		require.Greater(t, rev, last, "revisions out of order:\n%s", strings.Join(lines, "\n"))
		last = rev
	}
}

// TestStatusWatchJSON: with --json each state is a JSON object on a line:
// status --json's fields, the time, and the changes.
func TestStatusWatchJSON(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "status", "--watch", "--json", ep(), name)
	var first, second statusWatchJSON
	require.NoError(t, json.Unmarshal([]byte(p.stdout.waitLine(t, 0)), &first))
	require.Equal(t, name, first.Name)
	require.Nil(t, first.Holder)
	require.Equal(t, []keyChange{}, first.Changes)
	require.WithinDuration(t, time.Now(), first.Time, time.Minute)

	m, _ := holdLock(t, cli, name)
	require.NoError(t, json.Unmarshal([]byte(p.stdout.waitLine(t, 1)), &second))
	require.Equal(t, m.Token(), second.Revision, "the state at the revision of the change")
	require.NotNil(t, second.Holder)
	require.Equal(t, m.Key(), second.Holder.Key)
	require.Equal(t, m.Token(), second.Holder.Token)
	require.Equal(t, []keyChange{{Key: m.Key(), Change: "joined"}}, second.Changes)
	stopWatch(t, p)
}

// TestLsWatch: ls --watch starts with a line per lock, then a line for
// each lock a change touches, nested locks apart.
func TestLsWatch(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	ctx := t.Context()
	pfx := lockName(t) + "/"
	holdLock(t, cli, pfx+"b")
	p := startProc(t, nil, "ls", "--watch", ep(), pfx)
	require.Regexp(t, `^`+stamp+`  rev \d+  `+regexp.QuoteMeta(pfx)+`b  held by `+regexp.QuoteMeta(pfx)+`b/[0-9a-f]+ for \?, 0 waiting$`, p.stdout.waitLine(t, 0))

	a := identityMutex(t, cli, pfx+"a", "billing worker 7")
	require.NoError(t, a.Lock(ctx))
	ak := regexp.QuoteMeta(a.Key())
	require.Regexp(t, `  rev `+strconv.FormatInt(a.Token(), 10)+`  `+regexp.QuoteMeta(pfx)+`a  held by "billing worker 7" for \?, 0 waiting  \(`+ak+` joined\)$`, p.stdout.waitLine(t, 1))
	sub, _ := holdLock(t, cli, pfx+"a/sub")
	require.Regexp(t, `  `+regexp.QuoteMeta(pfx)+`a/sub  held by `+regexp.QuoteMeta(sub.Key())+` for \?, 0 waiting  \(`+regexp.QuoteMeta(sub.Key())+` joined\)$`, p.stdout.waitLine(t, 2))
	require.NoError(t, a.Unlock(ctx))
	require.Regexp(t, `  `+regexp.QuoteMeta(pfx)+`a  free  \(`+ak+` left\)$`, p.stdout.waitLine(t, 3))

	stopWatch(t, p)
	lines := strings.Split(strings.TrimSuffix(p.stdout.String(), "\n"), "\n")
	require.Len(t, lines, 4, p.stdout.String())
	requireRevisionsRise(t, lines[1:])

	// --json: first the state, ls --json's with the time; then a lock of
	// its, with the time, revision and changes.
	p = startProc(t, nil, "ls", "--watch", "--json", ep(), pfx)
	var st lsStateJSON
	require.NoError(t, json.Unmarshal([]byte(p.stdout.waitLine(t, 0)), &st))
	require.Equal(t, pfx, st.Prefix)
	require.WithinDuration(t, time.Now(), st.Time, time.Minute)
	require.Len(t, st.Locks, 2)
	require.Equal(t, pfx+"a/sub", st.Locks[0].Name, "locks by name; a is free")
	require.Equal(t, pfx+"b", st.Locks[1].Name)
	require.NoError(t, sub.Unlock(ctx))
	var l lsWatchJSON
	require.NoError(t, json.Unmarshal([]byte(p.stdout.waitLine(t, 1)), &l))
	require.Equal(t, pfx+"a/sub", l.Name)
	require.Greater(t, l.Revision, st.Revision)
	require.Empty(t, l.Holders)
	require.Equal(t, []keyChange{{Key: sub.Key(), Change: "left"}}, l.Changes)
	stopWatch(t, p)

	// No lock under the prefix: the state says so, as the text does.
	p = startProc(t, nil, "ls", "--watch", "--json", ep(), pfx+"none/")
	line := p.stdout.waitLine(t, 0)
	require.Regexp(t, `^\{"time":"[^"]+","prefix":"`+regexp.QuoteMeta(pfx)+`none/","revision":\d+,"locks":\[\]\}$`, line)
	stopWatch(t, p)
}

// TestLsWatchSkipsLibraryKeys: ls --watch, like ls, lists no lock for the
// library's own keys under "__etcdlock/": a release request's key once
// made it print a lock "__etcdlock/release/NAME" (issue 30).
func TestLsWatchSkipsLibraryKeys(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holdLock(t, cli, name)
	p := startProc(t, nil, "ls", "--watch", ep(), "__")
	p.stdout.waitLine(t, 0) // the state: no lock under "__" but a test's marker
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	resp, err := cli.Get(t.Context(), etcdlock.ReleaseRequestPrefix+name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Count, "the request's key")
	// A lock's change after the request's: its line comes after any the
	// request could have made.
	marker := "__" + name
	holdLock(t, cli, marker)
	p.stdout.waitFor(t, marker+"  held by")
	stopWatch(t, p)
	require.NotContains(t, p.stdout.String(), "__etcdlock")
	require.Empty(t, p.stderr.String())
}

// ptyOutput collects what processes write to a pseudo-terminal.
type ptyOutput struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced when bytes arrive
}

// readPTY reads term until it is closed (at the end of the test).
func readPTY(term *os.File) *ptyOutput {
	o := &ptyOutput{changed: make(chan struct{})}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := term.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			close(o.changed)
			o.changed = make(chan struct{})
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

// waitFor waits until ok holds for the output from byte from on, and
// returns that output.
func (o *ptyOutput) waitFor(t *testing.T, from int, what string, ok func(string) bool) string {
	t.Helper()
	timeout := time.After(procTimeout)
	for {
		o.mu.Lock()
		s, changed := o.buf.String()[from:], o.changed
		o.mu.Unlock()
		if ok(s) {
			return s
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no %s; got %q", what, s)
		}
	}
}

// waitFrame waits until the n-th screen (from 1; each starts by clearing
// the terminal) holds every one of want, and returns it.
func (o *ptyOutput) waitFrame(t *testing.T, n int, want ...string) string {
	t.Helper()
	frame := func(s string) string {
		if f := strings.Split(s, clearScreen); len(f) > n {
			return f[n]
		}
		return ""
	}
	s := o.waitFor(t, 0, fmt.Sprintf("screen %d with %q", n, want), func(s string) bool {
		f := frame(s)
		for _, w := range want {
			if !strings.Contains(f, w) {
				return false
			}
		}
		return f != ""
	})
	return frame(s)
}

// len is how many bytes arrived so far.
func (o *ptyOutput) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Len()
}

// TestWatchTerminal: on a terminal, status --watch and ls --watch redraw
// the screen at each change; with TERM=dumb they write plain lines.
func TestWatchTerminal(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	term, tty := openPTY(t)
	out := readPTY(term)
	start := func(termEnv string, args ...string) *exec.Cmd {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(cleanEnv(), "ETCDCTL_DIAL_TIMEOUT=30s", "TERM="+termEnv)
		cmd.Stdout, cmd.Stderr = tty, tty
		require.NoError(t, cmd.Start())
		return cmd
	}
	stop := func(cmd *exec.Cmd) {
		require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
		require.NoError(t, cmd.Wait())
	}

	cmd := start("xterm", "status", "--watch", ep(), name)
	out.waitFrame(t, 1, "etcdlock status "+name+" --watch", `lock "`+name+`" is free`)
	m, _ := holdLock(t, cli, name)
	out.waitFrame(t, 2, `lock "`+name+`" is held, 0 waiting`, m.Key(), "holder's lease: TTL")
	stop(cmd)

	sub, _ := holdLock(t, cli, name+"/sub")
	cmd = start("xterm", "ls", "--watch", ep(), name+"/")
	s := out.waitFrame(t, 3, "etcdlock ls "+name+"/ --watch", name+"/sub", "WAITERS")
	require.Regexp(t, `NAME +HOLDER +HELD FOR +WAITERS`, s)
	require.NoError(t, sub.Unlock(t.Context()))
	out.waitFrame(t, 4, `no locks under "`+name+`/"`)
	stop(cmd)

	// TERM=dumb: lines, no escape sequences.
	before := out.len()
	cmd = start("dumb", "status", "--watch", ep(), name)
	plain := out.waitFor(t, before, "line", func(s string) bool { return strings.Contains(s, "waiting\r\n") })
	stop(cmd)
	require.Regexp(t, `rev \d+  held by `+regexp.QuoteMeta(m.Key())+` \(token \d+\), 0 waiting\r\n`, plain)
	require.NotContains(t, plain, "\x1b")
}

// TestWatchResumes: the watch outlives the member it reads from going
// down: the changes made meanwhile are shown once it is back, each in
// order, none skipped; and when etcd compacted them meanwhile, it says so
// and shows the queue as it is.
func TestWatchResumes(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 3)
	name := lockName(t)
	// The watch reads from member 0 alone; the locks go through member 1.
	p := startProc(t, nil, "status", "--watch", "--endpoints="+c.Endpoint(0), name)
	require.Regexp(t, `  free$`, p.stdout.waitLine(t, 0))
	cli := c.Client(t, clientv3.Config{Endpoints: []string{c.Endpoint(1)}})
	ctx := t.Context()

	c.StopMember(0)
	m, _ := holdLock(t, cli, name)
	w := startWaiter(t, cli, name)
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, name)) == 2 }, procTimeout, 10*time.Millisecond)
	require.NoError(t, m.Unlock(ctx))
	w.unlock(t)
	require.NoError(t, c.RestartMember(0))
	k := regexp.QuoteMeta(m.Key())
	require.Regexp(t, `  held by `+k+` .*, 0 waiting  \(`+k+` joined\)$`, p.stdout.waitLine(t, 1))
	require.Regexp(t, `, 1 waiting  \(.* joined\)$`, p.stdout.waitLine(t, 2))
	require.Regexp(t, `, 0 waiting  \(`+k+` left\)$`, p.stdout.waitLine(t, 3))
	require.Regexp(t, `  free  \(.* left\)$`, p.stdout.waitLine(t, 4))

	// Member 0 down again; what changes meanwhile is compacted away.
	c.StopMember(0)
	m, _ = holdLock(t, cli, name)
	other, _ := holdLock(t, cli, name+"/other") // a nested lock: a revision to compact to
	_, err := cli.Compact(ctx, other.Token())
	require.NoError(t, err)
	require.NoError(t, c.RestartMember(0))
	p.stderr.waitFor(t, "compacted")
	require.Regexp(t, `  held by `+regexp.QuoteMeta(m.Key())+` .*, 0 waiting$`, p.stdout.waitLine(t, 5))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	requireRevisionsRise(t, strings.Split(strings.TrimSuffix(p.stdout.String(), "\n"), "\n"))
}

// TestStatusWatchElection: an election's leader shows with its value, and
// a Proclaim is a change of its own ("new value").
func TestStatusWatchElection(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t)
	s, err := etcdlock.NewSession(ctx, cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	e := etcdlock.NewElection(s, name)
	require.NoError(t, e.Campaign(ctx, "10.0.0.1:8080"))

	p := startProc(t, nil, "status", "--watch", ep(), name)
	k := regexp.QuoteMeta(e.Key())
	require.Regexp(t, `  held by `+k+` \(token \d+, value "10\.0\.0\.1:8080"\), 0 waiting$`, p.stdout.waitLine(t, 0))
	require.NoError(t, e.Proclaim(ctx, "10.0.0.2:8080"))
	require.Regexp(t, `  held by `+k+` \(token \d+, value "10\.0\.0\.2:8080"\), 0 waiting  \(`+k+` new value\)$`, p.stdout.waitLine(t, 1))
	require.NoError(t, e.Resign(ctx))
	require.Regexp(t, `  free  \(`+k+` left\)$`, p.stdout.waitLine(t, 2))
	stopWatch(t, p)
}
