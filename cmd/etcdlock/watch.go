package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchRetry is how long a broken watch waits before it resumes: etcd
// unreachable, its leader lost, or a read that failed.
const watchRetry = time.Second

// clearScreen moves the cursor home and clears a terminal (ANSI, as
// watch(1) and top do).
const clearScreen = "\x1b[H\x1b[2J"

// A follower shows keys under a prefix as they change, for status --watch
// and ls --watch. It never polls: it reads everything once, then watches
// the prefix from the next revision and reads again only where a watch
// event says something changed.
//
// A break of the watch (etcd unreachable, a member that lost its leader:
// the watch requires one, so a partitioned member cannot leave the view
// silently stale) resumes from the last revision shown, so no change is
// skipped; only when etcd has compacted that history does the follower
// read everything afresh and say so.
type follower struct {
	cli    *clientv3.Client
	prefix string    // the keys watched: NAME/ for status, PREFIX for ls
	what   string    // names them for people: lock "NAME", locks under "PREFIX"
	stderr io.Writer // where breaks are told
	// timeout is --command-timeout: etcd not answering within it is told.
	timeout time.Duration
	// oneRevision makes change see each revision's events apart (the
	// plain output shows every state); else change gets each watch
	// response's events together (the terminal redraws the latest state).
	oneRevision bool

	// resync reads and shows everything as it is now, and returns the
	// revision it read.
	resync func(ctx context.Context) (int64, error)
	// change shows what evs (events of revisions up to rev, oldest first)
	// changed.
	change func(ctx context.Context, rev int64, evs []*clientv3.Event) error

	// broken is what the last break of the watch said, until a watch is
	// created again; "" while the watch works.
	broken string
}

// run shows everything, then every change until ctx ends; it returns
// resync's error if the first read fails, and nil when ctx ends. While it
// runs, a liveness check says when etcd stops answering, and when it
// answers again.
func (f *follower) run(ctx context.Context) error {
	rev, err := f.resync(ctx)
	if err != nil {
		return err
	}
	l := startLiveness(f.cli, f.prefix, f.timeout, f.stderr)
	defer l.stop()
	for {
		rev, err = f.follow(ctx, rev)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue // read afresh after a compaction: watch on at once
		}
		// A break that lasts (no leader) says so once, not at every
		// try, and follow says when the watch is back.
		if msg := detail(err); msg != f.broken {
			fmt.Fprintf(f.stderr, "etcdlock: watching %s: %s; resuming after revision %d\n", f.what, msg, rev)
			f.broken = msg
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(watchRetry):
		}
	}
}

// follow watches from rev+1 and shows each change, until the watch breaks;
// it returns the last revision it showed and why it stopped.
func (f *follower) follow(ctx context.Context, rev int64) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := f.cli.Watch(wctx, f.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithCreatedNotify())
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return rev, ctx.Err()
		case resp, ok = <-wch:
		}
		switch {
		case !ok:
			return rev, errors.New("the watch ended") // the client is closing
		case resp.CompactRevision != 0:
			// The changes after rev are gone from etcd's history: what
			// is shown next is the state now.
			fmt.Fprintf(f.stderr, "etcdlock: etcd compacted its history past revision %d, so changes of %s up to revision %d cannot be shown; reading it afresh\n", rev, f.what, resp.CompactRevision-1)
			r, err := f.resync(ctx)
			if err != nil {
				return rev, err
			}
			return r, nil
		case resp.Err() != nil:
			return rev, resp.Err()
		case resp.Created:
			if f.broken != "" {
				fmt.Fprintf(f.stderr, "etcdlock: watching %s again after revision %d\n", f.what, rev)
				f.broken = ""
			}
			continue
		case resp.IsProgressNotify() || len(resp.Events) == 0:
			continue
		}
		for _, evs := range f.batches(resp.Events) {
			r := evs[len(evs)-1].Kv.ModRevision
			if err := f.change(ctx, r, evs); err != nil {
				return rev, err
			}
			rev = r
		}
	}
}

// batches splits evs into the batches change gets: one per revision, or
// all together.
func (f *follower) batches(evs []*clientv3.Event) [][]*clientv3.Event {
	if !f.oneRevision {
		return [][]*clientv3.Event{evs}
	}
	var out [][]*clientv3.Event
	for i := 0; i < len(evs); {
		j := i + 1
		for j < len(evs) && evs[j].Kv.ModRevision == evs[i].Kv.ModRevision {
			j++
		}
		out = append(out, evs[i:j])
		i = j
	}
	return out
}

// keyChange is what one watch event did to a queue: a key "joined" (put
// at its create revision), "left" (deleted: unlocked, cancelled, or gone
// with its lease; etcd does not tell which), or got a "new value" (an
// election leader's Proclaim).
type keyChange struct {
	Key       string `json:"key"`
	KeyBase64 string `json:"key_base64,omitempty"` // when Key is not UTF-8 (base64IfInvalid)
	Change    string `json:"change"`
}

func newKeyChange(ev *clientv3.Event) keyChange {
	c := keyChange{Key: string(ev.Kv.Key), KeyBase64: base64IfInvalid(string(ev.Kv.Key)), Change: "left"}
	if ev.Type == clientv3.EventTypePut {
		c.Change = "new value"
		if ev.IsCreate() {
			c.Change = "joined"
		}
	}
	return c
}

// changesText tells changes on one line: "(a joined, b left)".
func changesText(changes []keyChange) string {
	s := make([]string, len(changes))
	for i, c := range changes {
		s[i] = safeText(c.Key) + " " + c.Change
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// stampLayout is the time at the start of each line of the plain watch
// output: when etcdlock saw the change (etcd keeps no timestamps).
const stampLayout = "2006-01-02T15:04:05.000Z07:00"

// watchContext returns a context that ends on SIGINT, SIGTERM or SIGHUP:
// how a watch is stopped.
func watchContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), forwardSignals...)
}

// isTTY reports whether w is a terminal that can be redrawn: a terminal
// device, and TERM not "dumb".
func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isTerminalDevice(f) && os.Getenv("TERM") != "dumb"
}

// frame redraws a terminal with a header line and body.
func frame(w io.Writer, header, body string) {
	fmt.Fprintf(w, "%s%s  %s (Ctrl-C stops)\n\n%s", clearScreen, header, time.Now().Format("15:04:05"), body)
}

// selfRecords remembers what holders recorded about themselves
// (readSelfRecord), so that a watch reads each holder's record once:
// a key's record and whether it got the lock at once never change.
type selfRecords map[recordID]recordRead

type recordID struct {
	key   string
	token int64
}

type recordRead struct {
	rec selfRecord
	ok  bool
}

func (c selfRecords) read(ctx context.Context, cli *clientv3.Client, name string, k etcdlock.QueueKey) (selfRecord, bool) {
	id := recordID{k.Key, k.Token}
	if r, seen := c[id]; seen {
		return r.rec, r.ok
	}
	rec, ok := readSelfRecord(ctx, cli, name, k)
	if ctx.Err() == nil {
		c[id] = recordRead{rec, ok}
	}
	return rec, ok
}
