package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The tests run the etcdlock binary, built once by TestMain (with -race
// when the tests run with -race), against a one-member embedded etcd.
var (
	bin      string            // path of the built binary
	cluster  *etcdtest.Cluster // the shared etcd
	endpoint string            // its client URL
)

// procTimeout bounds every run of the binary: generous, for a loaded
// two-core machine running -race.
const procTimeout = 60 * time.Second

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "etcdlock-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)

	bin = filepath.Join(tmp, "etcdlock")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}

	return etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster, endpoint = c, c.Endpoint(0)
		return m.Run()
	})
}

// lockName returns a lock name no other test uses.
func lockName(t *testing.T) string { return "cmdtest/" + t.Name() }

// newClient returns a client of the shared etcd, closed at the end of the
// test.
func newClient(t *testing.T) *clientv3.Client {
	t.Helper()
	return cluster.Client(t)
}

// holdLock takes lock name through a session of its own, and returns the
// Mutex and the session. Both end at the end of the test.
func holdLock(t *testing.T, cli *clientv3.Client, name string) (*etcdlock.Mutex, *etcdlock.Session) {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	m := etcdlock.NewMutex(s, name)
	require.NoError(t, m.Lock(t.Context()))
	return m, s
}

// queueKeys returns the keys of lock name's queue, oldest first.
func queueKeys(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	q, err := readQueue(t.Context(), cli, name, false)
	require.NoError(t, err)
	var keys []string
	for _, k := range q.Keys {
		keys = append(keys, k.Key)
	}
	return keys
}

// queueWatch reports the keys that join lock name's queue from now on.
type queueWatch struct {
	keys   chan string
	cancel context.CancelFunc
	done   chan struct{}
}

// watchQueue starts watching lock name's queue for new keys.
func watchQueue(t *testing.T, cli *clientv3.Client, name string) *queueWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &queueWatch{keys: make(chan string, 64), cancel: cancel, done: make(chan struct{})}
	wch := cli.Watch(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	select {
	case wr := <-wch:
		require.True(t, wr.Created, "watch not created: %v", wr.Err())
	case <-time.After(procTimeout):
		t.Fatal("watch not created")
	}
	go func() {
		defer close(w.done)
		for wr := range wch {
			for _, ev := range wr.Events {
				if rest, ok := strings.CutPrefix(string(ev.Kv.Key), name+"/"); ev.Kv.Version == 1 && ok && !strings.Contains(rest, "/") {
					w.keys <- string(ev.Kv.Key)
				}
			}
		}
	}()
	t.Cleanup(func() { w.cancel(); <-w.done })
	return w
}

// next returns the next key that joined the queue.
func (w *queueWatch) next(t *testing.T) string {
	t.Helper()
	select {
	case k := <-w.keys:
		return k
	case <-time.After(procTimeout):
		t.Fatal("no key joined the queue")
		return ""
	}
}

// lines collects the lines a process writes to one pipe.
type lines struct {
	mu      sync.Mutex
	all     []string
	eof     bool
	changed chan struct{} // closed and replaced when a line or EOF arrives
}

func readLines(r io.ReadCloser) *lines {
	l := &lines{changed: make(chan struct{})}
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, sc.Text())
			close(l.changed)
			l.changed = make(chan struct{})
			l.mu.Unlock()
		}
		l.mu.Lock()
		l.eof = true
		close(l.changed)
		l.mu.Unlock()
	}()
	return l
}

// waitFor returns the first line that contains s, waiting for it.
func (l *lines) waitFor(t *testing.T, s string) string {
	t.Helper()
	return l.wait(t, fmt.Sprintf("line with %q", s), func(all []string) (string, bool) {
		for _, line := range all {
			if strings.Contains(line, s) {
				return line, true
			}
		}
		return "", false
	})
}

// wait waits until find finds what it looks for in the lines so far, and
// returns it; what names it in the failure.
func (l *lines) wait(t *testing.T, what string, find func(all []string) (string, bool)) string {
	t.Helper()
	timeout := time.After(procTimeout)
	for {
		l.mu.Lock()
		found, ok := find(l.all)
		eof, changed := l.eof, l.changed
		l.mu.Unlock()
		if ok {
			return found
		}
		if eof {
			t.Fatalf("no %s before EOF; got:\n%s", what, l.String())
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no %s; got:\n%s", what, l.String())
		}
	}
}

// waitEOF waits until every writer of the pipe has closed it.
func (l *lines) waitEOF(timeout time.Duration) bool {
	deadline := time.After(timeout)
	for {
		l.mu.Lock()
		eof, changed := l.eof, l.changed
		l.mu.Unlock()
		if eof {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.all) == 0 {
		return ""
	}
	return strings.Join(l.all, "\n") + "\n"
}

// proc is a running etcdlock.
type proc struct {
	cmd    *exec.Cmd
	stdin  *os.File // write end of its standard input
	stdout *lines
	stderr *lines
	start  time.Time
	exited chan struct{} // closed when Wait returned
}

// cleanEnv is the test's environment without variables etcdlock reads or
// sets.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCDCTL_") && !strings.HasPrefix(kv, "ETCDLOCK_") && !strings.HasPrefix(kv, "ETCD_LOCK_") {
			env = append(env, kv)
		}
	}
	return env
}

// startProc starts etcdlock with args and env added to a clean
// environment (a later variable wins). Its standard input is a pipe the
// test holds.
func startProc(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCmd(t, env, exec.Command(bin, args...))
}

// startCmd is startProc for a command that runs etcdlock (through
// setpriv, say).
func startCmd(t *testing.T, env []string, cmd *exec.Cmd) *proc {
	t.Helper()
	// A dial timeout for a loaded machine (etcd's bcrypt makes logins
	// slow under -race); tests of timeouts set their own.
	cmd.Env = append(append(cleanEnv(), "ETCDCTL_DIAL_TIMEOUT=30s"), env...)
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	errR, errW, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	p := &proc{cmd: cmd, stdin: inW, start: time.Now(), exited: make(chan struct{})}
	err = cmd.Start()
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		t.Fatalf("start etcdlock: %v", err)
	}
	p.stdout, p.stderr = readLines(outR), readLines(errR)
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		p.stdout.waitEOF(10 * time.Second)
		p.stderr.waitEOF(10 * time.Second)
	})
	return p
}

// wait waits for etcdlock to exit, and for every process that shares its
// output (CMD and CMD's children) to be gone, and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(procTimeout):
		t.Fatalf("etcdlock %q still runs after %v\nstdout:\n%sstderr:\n%s", p.cmd.Args[1:], procTimeout, p.stdout, p.stderr)
	}
	if !p.stdout.waitEOF(10*time.Second) || !p.stderr.waitEOF(10*time.Second) {
		t.Fatalf("a child of etcdlock %q still holds its output\nstdout:\n%sstderr:\n%s", p.cmd.Args[1:], p.stdout, p.stderr)
	}
	require.NotContains(t, p.stderr.String(), "DATA RACE")
	code := p.cmd.ProcessState.ExitCode()
	if code < 0 {
		t.Fatalf("etcdlock was killed: %v\nstderr:\n%s", p.cmd.ProcessState, p.stderr)
	}
	return code
}

// result is a finished run of etcdlock.
type result struct {
	code    int
	stdout  string
	stderr  string
	elapsed time.Duration
}

// runProc runs etcdlock to the end.
func runProc(t *testing.T, env []string, args ...string) result {
	t.Helper()
	p := startProc(t, env, args...)
	p.stdin.Close()
	code := p.wait(t)
	return result{code: code, stdout: p.stdout.String(), stderr: p.stderr.String(), elapsed: time.Since(p.start)}
}

// ep is the flag that points etcdlock at the shared etcd.
func ep() string { return "--endpoints=" + endpoint }

// writeScript writes an executable shell script into dir and returns its
// path.
func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
	return path
}

// requireOneLineError checks that stderr is one line of etcdlock's, that
// contains want.
func requireOneLineError(t *testing.T, r result, want string) {
	t.Helper()
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "stderr: %q", r.stderr)
	require.True(t, strings.HasPrefix(r.stderr, "etcdlock: "), "stderr: %q", r.stderr)
	require.Contains(t, r.stderr, want)
}

// waiter is a Mutex of a session of its own whose Lock runs in a goroutine.
type waiter struct {
	m        *etcdlock.Mutex
	err      error         // Lock's result, set before finished is closed
	finished chan struct{} // closed when Lock returned
}

// startWaiter starts Lock of lock name in a goroutine; it is cancelled and
// waited for at the end of the test.
func startWaiter(t *testing.T, cli *clientv3.Client, name string) *waiter {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	w := &waiter{m: etcdlock.NewMutex(s, name), finished: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(w.finished)
		w.err = w.m.Lock(ctx)
	}()
	t.Cleanup(func() { cancel(); <-w.finished })
	return w
}

// unlock waits for the waiter to hold the lock, and releases it.
func (w *waiter) unlock(t *testing.T) {
	t.Helper()
	select {
	case <-w.finished:
	case <-time.After(procTimeout):
		t.Fatal("waiter did not get the lock")
	}
	require.NoError(t, w.err)
	require.NoError(t, w.m.Unlock(t.Context()))
}
