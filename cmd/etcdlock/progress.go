package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// progressInterval is how often a waiting run reads the queue to show its
// place. The read is one serializable range, keys only, on the side: the
// lock itself waits on watches and never on this.
const progressInterval = 500 * time.Millisecond

// A progress shows, while run waits, its place in the queue and how long
// it has waited: one line rewritten in place on a terminal, else a plain
// line each time the place changes. Nothing is shown while run is first in
// line, so a lock taken at once shows nothing.
type progress struct {
	cli   *clientv3.Client
	name  string // lock name
	what  string // what is waited for, for people: lock "NAME"
	key   string // the waiter's key
	w     io.Writer
	tty   bool
	start time.Time

	cancel context.CancelFunc
	done   chan struct{} // closed when the loop returned
	shown  bool          // written by the loop; read after done
}

// startProgress starts showing the progress of the waiter key of lock (or
// election) name, which what names for people. Call stop when the wait is
// over.
func startProgress(cli *clientv3.Client, name, what, key string, w io.Writer, tty bool, start time.Time) *progress {
	ctx, cancel := context.WithCancel(context.Background())
	p := &progress{cli: cli, name: name, what: what, key: key, w: w, tty: tty, start: start, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.loop(ctx)
	}()
	return p
}

// stop ends the display, clears its line on a terminal, and reports
// whether anything was shown.
func (p *progress) stop() bool {
	p.cancel()
	<-p.done
	return p.shown
}

func (p *progress) loop(ctx context.Context) {
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			if p.tty && p.shown {
				fmt.Fprint(p.w, "\r\x1b[K")
			}
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, progressInterval)
		q, err := readQueue(rctx, p.cli, p.name, true)
		cancel()
		if err != nil {
			continue // only a display: try again at the next tick
		}
		var place string
		switch pos := position(q, p.key); {
		case pos == 0:
			continue // first in line: Lock returns at once
		case pos < 0:
			place = "joining the queue"
		default:
			place = fmt.Sprintf("queue position %d of %d", pos, len(q.Keys)-1)
		}
		if h := q.Holders(); len(h) > 0 {
			// Whom it waits for: the holder, as it recorded itself.
			place += "; held by " + describeKey(h[0])
			if len(h) > 1 {
				place += fmt.Sprintf(" and %d more", len(h)-1)
			}
		}
		line := fmt.Sprintf("etcdlock: waiting for %s: %s, waited %s", p.what, place, fmtDur(time.Since(p.start)))
		if i := strings.Index(place, "; "); i >= 0 {
			// The time waited before whom it waits for.
			line = fmt.Sprintf("etcdlock: waiting for %s: %s, waited %s%s", p.what, place[:i], fmtDur(time.Since(p.start)), place[i:])
		}
		switch {
		case p.tty:
			fmt.Fprint(p.w, "\r\x1b[K"+line)
		case place != last:
			fmt.Fprintln(p.w, line)
		default:
			continue
		}
		p.shown, last = true, place
	}
}

// describeKey says who holds (or waits with) key k, as it recorded itself
// (whoOf), or else its key.
func describeKey(k etcdlock.QueueKey) string {
	if who := whoOf(k); who != "" {
		return who
	}
	return safeText(k.Key)
}

// whoOf is key k's one-line description of itself: etcdlock run's host,
// pid and command, or a WithIdentity as safeText shows it (quoted unless
// it is one plain word, so that it cannot pass for run's record); "" when
// it recorded none.
func whoOf(k etcdlock.QueueKey) string {
	switch rec, ok := parseRunRecord(k.Identity); {
	case ok:
		return rec.who()
	case k.Identity == "":
		return ""
	}
	return safeText(k.Identity)
}
