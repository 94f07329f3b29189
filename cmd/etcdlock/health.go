package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// livenessInterval is how often a follower of etcd (status --watch, ls
// --watch, elect --listen) asks etcd a question of its own: it waits on a
// watch, and etcd's client keeps a watch waiting without a word while etcd
// is out of reach (its member down or paused, no leader). A question
// not answered within --command-timeout is said on stderr, so within that
// and livenessInterval of etcd's going away; the next answer is said too.
const livenessInterval = 2 * time.Second

// livenessHelp tells the commands' help what the liveness check says.
const livenessHelp = `If etcd stops answering (its member down or paused, no leader), a line
on standard error says so within --command-timeout and 2s more (7s by
default): "etcdlock: etcd does not answer since TIME (...)", TIME being
its last answer; when it answers again, another line says so, and the
changes made meanwhile follow.`

// A liveness checks that etcd answers, for one follower.
type liveness struct {
	cli     *clientv3.Client
	key     string        // read, count only: a key the command may read
	timeout time.Duration // --command-timeout: no answer within it is none
	stderr  io.Writer     // where the changes are said
	cancel  context.CancelFunc
	done    chan struct{} // closed when the loop returned
}

// startLiveness starts checking that etcd answers reads of key within
// timeout; stop ends it.
func startLiveness(cli *clientv3.Client, key string, timeout time.Duration, stderr io.Writer) *liveness {
	if key == "" {
		key = "\x00" // etcd has no empty key
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &liveness{cli: cli, key: key, timeout: timeout, stderr: stderr, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		l.loop(ctx)
	}()
	return l
}

// stop ends the check and waits for it.
func (l *liveness) stop() {
	l.cancel()
	<-l.done
}

func (l *liveness) loop(ctx context.Context) {
	t := time.NewTicker(livenessInterval)
	defer t.Stop()
	lastAnswer := time.Now() // the follower read etcd just before
	var down bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Linearizable, and asking for a leader: a member cut off from
		// the others, which could still answer from its own copy, does
		// not count as etcd answering.
		rctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), l.timeout)
		_, err := l.cli.Get(rctx, l.key, clientv3.WithCountOnly())
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !down:
			down = true
			why := detail(err)
			if errors.Is(err, context.DeadlineExceeded) {
				why = fmt.Sprintf("no answer within %v, --command-timeout", l.timeout)
			}
			fmt.Fprintf(l.stderr, "etcdlock: etcd does not answer since %s (%s); what is shown may be stale until it does\n", lastAnswer.Format(stampLayout), why)
		case err == nil && down:
			down = false
			fmt.Fprintf(l.stderr, "etcdlock: etcd answers again at %s, after %s without an answer\n", time.Now().Format(stampLayout), fmtDur(time.Since(lastAnswer)))
		}
		if err == nil {
			lastAnswer = time.Now()
		}
	}
}
