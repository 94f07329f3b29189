package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// demoHolderCmd is the hidden command the demo re-executes itself with, to
// run a holder in a process of its own that it can kill.
const demoHolderCmd = "__demo-holder"

const (
	demoLock = "demo/printer"
	// demoTTL is short so that the demo shows a dead holder's handover in
	// seconds; etcd counts lease TTLs in whole seconds.
	demoTTL = 2 * time.Second
	// demoStepTimeout bounds each step of the demo.
	demoStepTimeout = 20 * time.Second
)

const demoHelp = `Usage: etcdlock demo

Starts an etcd of its own in a temporary directory (removed at the end, or
by the next demo if this one is killed) and shows three clients competing
for one lock: who queues, who holds with which fencing token, the queue,
and a holder whose process is killed: the lock passes to the next in line
once the dead holder's 2s lease TTL has run out.
Needs no setup; takes a few seconds.
`

func cmdDemo(args []string, stdout, stderr io.Writer) error {
	fset := newFlagSet("demo")
	_, rest, _, err := parseArgs(fset, args, 0, demoHelp, stdout)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErr("demo", "unexpected argument %q", rest[0])
	}
	// A signal stops the demo, which still cleans up.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, forwardSignals...)
	defer signal.Stop(sigc)
	watched := make(chan struct{})
	defer func() { cancel(nil); <-watched }()
	go func() {
		defer close(watched)
		select {
		case sig := <-sigc:
			cancel(&signalError{sig})
		case <-ctx.Done():
		}
	}()

	dir, release, err := mkdirDemo()
	if err != nil {
		return err
	}
	d := &demo{out: stdout, stderr: stderr, dir: dir}
	err = d.run(ctx)
	if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
		err = rerr
	}
	release()
	if se, ok := context.Cause(ctx).(*signalError); ok {
		return failf(exitSignalBase+signalNumber(se.sig), "demo interrupted by %s; etcd stopped and %s removed", sigName(se.sig), dir)
	}
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	fmt.Fprintf(stdout, "\netcd stopped, %s removed.\n", dir)
	return nil
}

// signalError is the cause of a context's end when a signal ended it: the
// demo's, or the wait of run.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "interrupted by " + sigName(e.sig) }

// demo plays three clients, alice, bob and carol, on one lock. alice runs
// in a child process so that it can really die.
type demo struct {
	out    io.Writer
	stderr io.Writer
	dir    string
	start  time.Time
	labels map[string]string // lock key -> client name
}

// say prints one event: time since the clients started, who, what.
func (d *demo) say(who, format string, args ...any) {
	fmt.Fprintf(d.out, "%5.1fs  %-6s %s\n", time.Since(d.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// more continues the last event on a line of its own.
func (d *demo) more(format string, args ...any) {
	fmt.Fprintf(d.out, "%15s %s\n", "", fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) error {
	fmt.Fprintf(d.out, "etcdlock demo: three clients compete for the lock %q.\n\n", demoLock)
	cluster, err := startEmbedded(d.dir)
	if err != nil {
		return err
	}
	defer cluster.Close()
	ep := cluster.Endpoint()
	fmt.Fprintf(d.out, "etcd started at %s, data in %s.\n", ep, d.dir)
	fmt.Fprintf(d.out, "Lock keys are %s/<lease ID in hex>; a holder's fencing token is its key's create revision.\n\n", demoLock)
	d.start = time.Now()
	d.labels = make(map[string]string)

	// alice: a process of its own, killed while it holds the lock.
	alice, err := d.startHolder(ctx, ep)
	if err != nil {
		return err
	}
	defer alice.stop()
	d.say("alice", "runs as process %d, lease TTL %v, and asks for the lock", alice.cmd.Process.Pid, demoTTL)
	key, token, err := alice.held(ctx)
	if err != nil {
		return err
	}
	d.labels[key] = "alice"
	d.say("alice", "holds the lock      key %s  token %d", key, token)

	// bob and carol: clients of this process, each with a session.
	bob, err := d.newClient(ctx, cluster, "bob")
	if err != nil {
		return err
	}
	defer bob.close()
	carol, err := d.newClient(ctx, cluster, "carol")
	if err != nil {
		return err
	}
	defer carol.close()
	if err := bob.queue(ctx, d, "alice"); err != nil {
		return err
	}
	if err := carol.queue(ctx, d, "bob"); err != nil {
		return err
	}
	if err := d.showQueue(ctx, bob.cli); err != nil {
		return err
	}

	killed := time.Now()
	if err := alice.kill(); err != nil {
		return err
	}
	d.say("alice", "is killed (SIGKILL): it never unlocks, and its lease is no longer renewed.")
	d.more("etcd revokes the lease, deleting the key, once its %v TTL has run out since", demoTTL)
	d.more("the last renewal (etcd looks for expired leases every 500ms).")
	if err := bob.held(ctx); err != nil {
		return err
	}
	d.say("bob", "holds the lock      token %d, %s after alice died", bob.m.Token(), fmtDur(time.Since(killed)))
	if err := d.showQueue(ctx, bob.cli); err != nil {
		return err
	}

	bobToken := bob.m.Token()
	unlocked := time.Now()
	if err := bob.m.Unlock(ctx); err != nil {
		return fmt.Errorf("bob: unlock: %w", err)
	}
	d.say("bob", "unlocks")
	if err := carol.held(ctx); err != nil {
		return err
	}
	d.say("carol", "holds the lock      token %d, %s after bob unlocked", carol.m.Token(), fmtDur(time.Since(unlocked)))
	carolToken := carol.m.Token()
	if err := carol.m.Unlock(ctx); err != nil {
		return fmt.Errorf("carol: unlock: %w", err)
	}
	d.say("carol", "unlocks; the lock is free")

	fmt.Fprintf(d.out, "\nEach holder had a higher token: alice %d < bob %d < carol %d. A resource that\n", token, bobToken, carolToken)
	fmt.Fprintf(d.out, "refuses tokens below the highest it has seen turns away a holder that lost\nthe lock without knowing, such as a paused process that wakes up too late.\n")
	return nil
}

// showQueue prints the lock's queue as status does, indented.
func (d *demo) showQueue(ctx context.Context, cli *clientv3.Client) error {
	st, err := readStatus(ctx, cli, demoLock)
	if err != nil {
		return fmt.Errorf("read queue: %w", err)
	}
	var b bytes.Buffer
	printStatus(&b, st, d.labels, time.Now())
	fmt.Fprintln(d.out)
	for line := range strings.Lines(b.String()) {
		fmt.Fprint(d.out, "        ", line)
	}
	fmt.Fprintln(d.out)
	return nil
}

// demoClient is a client of this process with a session and a Mutex.
type demoClient struct {
	name string
	cli  *clientv3.Client
	s    *etcdlock.Session
	m    *etcdlock.Mutex

	cancel context.CancelFunc
	locked chan error // receives Lock's result
}

func (d *demo) newClient(ctx context.Context, cluster *embeddedEtcd, name string) (*demoClient, error) {
	cli, err := cluster.NewClient()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithTTL(demoTTL))
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c := &demoClient{name: name, cli: cli, s: s, m: etcdlock.NewMutex(s, demoLock), cancel: func() {}}
	d.labels[c.m.Key()] = name
	return c, nil
}

// queue starts Lock, which waits behind ahead, and returns once the
// client's key is in the queue.
func (c *demoClient) queue(ctx context.Context, d *demo, ahead string) error {
	lctx, cancel := context.WithCancel(ctx)
	c.cancel = cancel
	c.locked = make(chan error, 1)
	go func() { c.locked <- c.m.Lock(lctx) }()

	wctx, wcancel := context.WithTimeout(ctx, demoStepTimeout)
	defer wcancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		q, err := readQueue(wctx, c.cli, demoLock, false)
		if err != nil {
			return fmt.Errorf("%s: read queue: %w", c.name, err)
		}
		if pos := position(q, c.m.Key()); pos > 0 {
			d.say(c.name, "queues behind %-5s  key %s  (token %d if it gets the lock)", ahead, c.m.Key(), q.Keys[pos].Token)
			return nil
		}
		select {
		case err := <-c.locked:
			return fmt.Errorf("%s: got the lock out of turn: %v", c.name, err)
		case <-wctx.Done():
			return fmt.Errorf("%s: not in the queue after %v", c.name, demoStepTimeout)
		case <-t.C:
		}
	}
}

// held waits for the Lock started by queue.
func (c *demoClient) held(ctx context.Context) error {
	select {
	case err := <-c.locked:
		c.locked = nil
		if err != nil {
			return fmt.Errorf("%s: lock: %w", c.name, err)
		}
		return nil
	case <-time.After(demoStepTimeout):
		return fmt.Errorf("%s: no lock after %v", c.name, demoStepTimeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// close ends the client: a Lock still waiting is cancelled, the lease
// revoked.
func (c *demoClient) close() {
	c.cancel()
	if c.locked != nil {
		<-c.locked
	}
	c.s.Close()
	c.cli.Close()
}

// demoHolder is alice: this binary, run as demoHolderCmd.
type demoHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser // the holder exits when this is closed
	lines chan string    // the holder's stdout
	dead  bool
}

func (d *demo) startHolder(ctx context.Context, ep string) (*demoHolder, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, demoHolderCmd, ep, demoLock, demoTTL.String())
	cmd.Stderr = d.stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start holder process: %w", err)
	}
	h := &demoHolder{cmd: cmd, stdin: stdin, lines: make(chan string, 1)}
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	return h, nil
}

// held waits for the holder to report the lock's key and token.
func (h *demoHolder) held(ctx context.Context) (key string, token int64, err error) {
	select {
	case line, ok := <-h.lines:
		if !ok {
			return "", 0, errors.New("alice: holder process exited")
		}
		key, tok, _ := strings.Cut(line, " ")
		token, err = strconv.ParseInt(tok, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("alice: bad report %q", line)
		}
		return key, token, nil
	case <-time.After(demoStepTimeout):
		return "", 0, fmt.Errorf("alice: no lock after %v", demoStepTimeout)
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}

// kill kills the holder process with SIGKILL and reaps it.
func (h *demoHolder) kill() error {
	if err := h.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill alice: %w", err)
	}
	h.dead = true
	h.cmd.Wait() // "signal: killed"
	return nil
}

// stop ends the holder process if it still runs: closing its stdin makes
// it unlock and exit.
func (h *demoHolder) stop() {
	h.stdin.Close()
	if !h.dead {
		h.cmd.Wait()
	}
	for range h.lines {
	}
}

// cmdDemoHolder takes the lock for the demo in a process of its own,
// reports "KEY TOKEN" on stdout, and holds the lock until stdin closes.
// Arguments: endpoint, lock name, TTL. Its standard input ends when the
// demo closes it or dies, SIGKILL included: then whatever the holder
// waits for ends too, and it exits within seconds, though the demo's etcd
// died with the demo.
func cmdDemoHolder(args []string, stdout io.Writer) error {
	if len(args) != 3 {
		return failf(exitUsage, "%s: want ENDPOINT NAME TTL", demoHolderCmd)
	}
	ttl, err := time.ParseDuration(args[2])
	if err != nil {
		return failf(exitUsage, "%s: %v", demoHolderCmd, err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{args[0]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdinDone := make(chan struct{})
	go func() {
		defer close(stdinDone)
		io.Copy(io.Discard, os.Stdin) // until the demo closes stdin, or dies
		cancel()
	}()
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s.Close() // waits at most the TTL
	m := etcdlock.NewMutex(s, args[1])
	lctx, lcancel := context.WithTimeout(ctx, demoStepTimeout)
	defer lcancel()
	if err := m.Lock(lctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s %d\n", m.Key(), m.Token())
	<-stdinDone
	uctx, ucancel := context.WithTimeout(context.Background(), ttl)
	defer ucancel()
	return m.Unlock(uctx)
}
