package etcdlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/streams"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The watches of every session of a client, the loss watch of each hold
// whose Done was called, each waiter's watch on its own key and on its
// blockers (the keys ahead that keep it out), share one Watch stream of
// the client (streams.Watches; see there for why). A waiter costs no
// goroutine but its own.
//
// A watch starts at a revision at which its key was known to be the
// incarnation watched (a hold's admission, a waiter's creation), so a
// deletion after it is this key's end, and no read is needed to close a
// gap (a watch started "now" would leave one). Starting in the past makes
// it an unsynced watcher on the server, whose events come with its next
// resync pass (up to 100ms later): a delay on the loss path only. A
// member that lags behind cannot replay an older deletion: the start is
// explicit. When the stream breaks, each watch is made again on the next
// one from the same revision; when that revision has been compacted, one
// read says whether the key is still the one watched, and the watch starts
// again after that read.
//
// A blocker's watch is the exception: it starts "now", as a synced watcher
// whose events come at once (the handoff waits on them; see watchTurn),
// and the waiter closes the gap before it with one read. It is not made
// again when the stream breaks or etcd ends it: the waiter is told
// (waitWatch.broken), reads the queue again and watches anew.

// A sessionWatcher keeps the key watches of one session on its client's
// watch stream: each hold's loss watch (and its WithMaxHold timer), each
// waiter's watches on its own key and its blockers. It probes a key whose
// watch cannot resume (probe). When the session ends it ends every watch:
// each hold is lost with it, and each waiter told. It is safe for
// concurrent use.
type sessionWatcher struct {
	s    *Session
	ws   *streams.Watches
	busy sync.WaitGroup
	// endDone is closed when the session's end has ended every watch and
	// the goroutines that probe keys (see probe) have returned.
	endDone chan struct{}

	// mu is ws.Mu. It guards the fields below, the state, stream watch
	// and probe of every keyWatch, and its waitWatch and blockerWatch
	// (see there).
	mu      *sync.Mutex
	ended   bool                      // the session ended: every watch is over, none is made
	watches map[*keyWatch]struct{}    // the watches not finished
	paused  map[*keyWatch]*time.Timer // queues a watch again after etcd refused it, in state watchPaused
}

// A keyWatch watches one key of the session for its deletion: a hold's key
// (h is set: the deletion ends the hold as lost) or a waiting Lock's key
// (ww is set: the waiter is told); or, when blocker is set, a waiter's
// blocker (the keyWatch of a blockerWatch). It is its stream watch's
// Handler, but a blocker's, whose Handler is its blockerWatch. It is
// kept small: a waiter has two, and a hold whose Done was asked one.
type keyWatch struct {
	q  *queue
	h  *hold      // the hold it watches, or nil
	ww *waitWatch // the waiter it tells, or nil
	// sw is the watch on the stream. Its Rev is the first revision at
	// which a deletion is the key's end; 0: read the key first (a
	// blocker's: watch from now).
	sw    streams.Watch
	probe *keyProbe // the last goroutine that probed the key
	state watchState
	// refusals counts etcd's refusals of the watch in a row: the pause
	// before the next attempt doubles with each.
	refusals uint8
	// limits: it keeps h's max hold timer. A set's hold has a watch for
	// each key; the one of the set's lead keeps it.
	limits  bool
	blocker bool // the keyWatch of a blockerWatch
}

// watcher returns the session's watcher, whose watch kw is.
func (kw *keyWatch) watcher() *sessionWatcher { return kw.q.s.watcher }

// rev returns the create revision of kw's key, the incarnation watched: a
// hold's token, or the waiter's key's (a set's keys share it). A
// blocker's watch has none.
func (kw *keyWatch) rev() int64 {
	if kw.h != nil {
		return kw.h.rev
	}
	return kw.ww.rev
}

// A blockerWatch watches a key ahead of a waiter, or the lock's whole
// prefix (key == the queue's pfx), from when etcd created it on: deletions
// only, except for a reader's watch on one key, which sees Puts too (a
// Downgrade turns a write lock into a read lock in place).
type blockerWatch struct {
	kw      keyWatch // its key is kw.sw.Key; its Handler is the blockerWatch
	mode    KeyMode  // the blocker's mode when it was read
	created int64    // the revision at which etcd created the watch; 0 until then; guarded by sessionWatcher.mu
}

// A waitWatch is what a waiting Lock's watches, on its own key and on its
// blockers, tell it. The fields but wake and puts are guarded by
// sessionWatcher.mu.
type waitWatch struct {
	rev    int64          // the create revision of the waiter's key (and of its set's others)
	wake   chan struct{}  // capacity 1: there is news
	puts   bool           // a reader: its watches on single blockers see Puts too
	events []watchedEvent // blockers' events not yet taken (take)
	gone   bool           // the own key is gone, or the session ended
	broken bool           // a blocker's watch ended without its event
	lost   *queue         // set with gone: the queue whose key went (a part of a set's, or the waiter's)
}

// A watchedEvent is an event of a blocker's watch.
type watchedEvent struct {
	b  *blockerWatch
	ev *mvccpb.Event
}

// take returns, with w.mu held, the news for ww: the events of blocker
// watches not stopped since, and whether its key is gone or a blocker's
// watch broke.
func (ww *waitWatch) take() (evs []watchedEvent, gone, broken bool) {
	evs, ww.events = ww.events, nil
	evs = slices.DeleteFunc(evs, func(e watchedEvent) bool { return e.b.kw.state == watchFinished })
	return evs, ww.gone, ww.broken
}

// tell wakes kw's waiter, with w.mu held: its key is gone (or the session
// ended), or, for a blocker, the watch ended without its event.
func (kw *keyWatch) tell() {
	if kw.blocker {
		kw.ww.broken = true
	} else if !kw.ww.gone {
		kw.ww.gone, kw.ww.lost = true, kw.q
	}
	kw.ww.signal()
}

// signal wakes the waiter.
func (ww *waitWatch) signal() {
	select {
	case ww.wake <- struct{}{}:
	default: // woken already
	}
}

type watchState uint8

const (
	watchOn       watchState = iota // made, or being made, on the stream (sw)
	watchProbing                    // a goroutine probes the key (see probe)
	watchPaused                     // etcd refused it: made again after a pause (see refused)
	watchFinished                   // stopped, its key gone, or the session ended
)

// A keyProbe is a goroutine that probes a watched key: it reads the
// key when its watch cannot resume (compaction), or asks why a held key
// went (holdGone). Both its contexts end with the session.
type keyProbe struct {
	done     chan struct{}      // closed when it returned
	waitCtx  context.Context    // its pauses between reads
	stopWait context.CancelFunc // stops its pauses: the watch is no longer wanted
	rpcCtx   context.Context    // its RPCs
	stopRPC  context.CancelFunc // cancels its RPCs
}

// newSessionWatcher returns the watcher of s's keys, which ends them all
// when s ends; it starts nothing.
func newSessionWatcher(s *Session) *sessionWatcher {
	w := &sessionWatcher{s: s, ws: streams.OpenWatches(s.watchCtx, s.cli), endDone: make(chan struct{})}
	w.mu = w.ws.Mu
	context.AfterFunc(s.endCtx, w.end)
	return w
}

// watchHold starts watching h's key on q, from h's admission on, and
// returns the watch, or nil if the session has ended (then the hold is
// lost). limits says the watch keeps h's max hold timer (see keyWatch).
// Called with h's queue.mu held.
func (w *sessionWatcher) watchHold(q *queue, h *hold, limits bool) *keyWatch {
	from := int64(0)
	if h.hdr.rev != 0 {
		from = h.hdr.rev + 1
	}
	kw := &keyWatch{q: q, h: h, limits: limits}
	kw.sw.Rev = from
	if !w.add(kw) {
		return nil
	}
	return kw
}

// watchOwn starts watching a waiter's own key, created at rev, and returns
// the watch and what the waiter's watches tell it: gone is set when the
// key is deleted, or the session ends. puts is set for a reader.
func (w *sessionWatcher) watchOwn(q *queue, rev int64, puts bool) (*keyWatch, *waitWatch) {
	ww := &waitWatch{rev: rev, wake: make(chan struct{}, 1), puts: puts}
	kw := &keyWatch{q: q, ww: ww}
	kw.sw.Rev = rev + 1
	if !w.add(kw) {
		w.mu.Lock()
		kw.tell()
		w.mu.Unlock()
	}
	return kw, ww
}

// watchSet starts watching, for a waiter in a part q of a set whose keys
// were created at rev, the keys of the set's other parts, and returns the
// watches: ww is told when one of them is gone, as when its own key is.
// None for a queue not in a set.
func (w *sessionWatcher) watchSet(q *queue, ww *waitWatch, rev int64) []*keyWatch {
	if q.set == nil {
		return nil
	}
	kws := make([]*keyWatch, 0, len(q.set.parts)-1)
	for _, p := range q.set.parts {
		if p == q {
			continue
		}
		kw := &keyWatch{q: p, ww: ww}
		kw.sw.Rev = rev + 1
		if !w.add(kw) {
			w.mu.Lock()
			kw.tell()
			w.mu.Unlock()
		}
		kws = append(kws, kw)
	}
	return kws
}

// watchBlocker starts watching key (a blocker of the waiter ww, or q's
// prefix) from now on, and returns the watch. Its created revision is set
// once etcd made it; its events are ww's; if it ends without its event
// (the stream broke, or the session ended), ww.broken is set.
func (w *sessionWatcher) watchBlocker(q *queue, ww *waitWatch, key string, mode KeyMode) *blockerWatch {
	b := &blockerWatch{mode: mode}
	b.kw.q, b.kw.ww, b.kw.blocker = q, ww, true
	b.kw.sw.Key, b.kw.sw.H = key, b
	switch {
	case key == q.prefix():
		b.kw.sw.Prefix, b.kw.sw.PrevKV = true, true
	case key == q.delayPfx():
		b.kw.sw.Prefix = true
	default:
		b.kw.sw.Puts = ww.puts
	}
	if !w.add(&b.kw) {
		w.mu.Lock()
		b.kw.tell()
		w.mu.Unlock()
	}
	return b
}

// stopBlockers stops the watches of bs.
func (w *sessionWatcher) stopBlockers(bs []*blockerWatch) {
	if len(bs) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range bs {
		w.drop(&b.kw)
	}
}

// add starts kw. It reports false if the session has ended.
func (w *sessionWatcher) add(kw *keyWatch) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		kw.state = watchFinished
		return false
	}
	if w.watches == nil {
		w.watches = make(map[*keyWatch]struct{})
	}
	w.watches[kw] = struct{}{}
	if kw.limits && kw.h.limit != nil {
		// The max hold ends the hold whatever the watch is doing, even
		// waiting on a link that is cut.
		kw.h.limit.timer = time.AfterFunc(time.Until(kw.h.maxDeadline().Add(-kw.q.s.expiryMargin())), func() { w.expire(kw) })
	}
	if !kw.blocker {
		kw.sw.Key, kw.sw.H = kw.q.key, kw
	}
	w.ws.Want()
	if kw.sw.Rev == 0 && !kw.blocker {
		w.probe(kw, true)
	} else {
		w.enqueue(kw)
	}
	return true
}

// enqueue has kw created on the open stream, or the next one. Called with
// w.mu held.
func (w *sessionWatcher) enqueue(kw *keyWatch) {
	kw.state = watchOn
	w.ws.Create(&kw.sw)
}

// stop ends kw: its owner no longer wants it (Unlock, a waiter that
// returns). A probe in progress is waited for, unless ctx ends first: then
// its RPC is cancelled. (etcd's client logs every unary call that fails, a
// cancelled one too, as a warning: a program that locks, calls Done and
// unlocks must log nothing.)
func (w *sessionWatcher) stop(ctx context.Context, kw *keyWatch) {
	w.mu.Lock()
	w.drop(kw)
	l := kw.probe
	w.mu.Unlock()
	if l == nil {
		return
	}
	l.stopWait()
	select {
	case <-l.done:
	case <-ctx.Done():
	}
	l.stopRPC()
	<-l.done
}

// drop finishes kw, and cancels its watch on the stream, unless it is
// finished already. It reports whether it finished it. Called with w.mu
// held.
func (w *sessionWatcher) drop(kw *keyWatch) bool {
	if kw.state == watchFinished {
		return false
	}
	w.ws.Stop(&kw.sw)
	if kw.limits && kw.h.limit != nil && kw.h.limit.timer != nil {
		kw.h.limit.timer.Stop()
	}
	if t := w.paused[kw]; t != nil {
		t.Stop()
		delete(w.paused, kw)
	}
	kw.state = watchFinished
	delete(w.watches, kw)
	w.ws.Unwant()
	return true
}

// expire ends kw's hold at its WithMaxHold limit.
func (w *sessionWatcher) expire(kw *keyWatch) {
	w.mu.Lock()
	dropped := w.drop(kw)
	l := kw.probe
	w.mu.Unlock()
	if !dropped {
		return
	}
	if l != nil {
		l.stopWait()
		l.stopRPC()
	}
	kw.q.lose(kw.h, errMaxHold)
}

// gone is called, with w.mu held, when kw's key was deleted at or after
// kw.sw.Rev, or read and found to be another incarnation, or missing; or
// when a blocker's watch ended without its event. A waiter is told at
// once; a hold's loss is probed first (holdGone).
func (w *sessionWatcher) gone(kw *keyWatch) {
	if kw.h == nil {
		if w.drop(kw) {
			kw.tell()
		}
		return
	}
	w.probe(kw, false)
}

// probe starts a goroutine that probes kw's key, with w.mu held: it
// reads the key first if read is set (the watch cannot resume from
// kw.sw.Rev), and, if the key is not the one watched any more, ends the
// watch: a hold is lost, with the reason holdGone finds.
func (w *sessionWatcher) probe(kw *keyWatch, read bool) {
	w.ws.Stop(&kw.sw)
	l := &keyProbe{done: make(chan struct{})}
	l.waitCtx, l.stopWait = context.WithCancel(w.s.endCtx)
	l.rpcCtx, l.stopRPC = context.WithCancel(w.s.endCtx)
	kw.state, kw.probe = watchProbing, l
	w.busy.Add(1)
	go func() {
		defer w.busy.Done()
		defer close(l.done)
		defer l.stopRPC()
		defer l.stopWait()
		if read {
			from, ok := w.read(l, kw)
			w.mu.Lock()
			switch {
			case kw.state != watchProbing || kw.probe != l || from < 0:
				// Stopped, or the session ended.
				w.mu.Unlock()
				return
			case ok:
				kw.sw.Rev = from
				w.enqueue(kw)
				w.mu.Unlock()
				return
			}
			if kw.h == nil {
				w.gone(kw)
				w.mu.Unlock()
				return
			}
			w.mu.Unlock()
		}
		// Unlock may stop the watch meanwhile; holdGone and lose know
		// what an Unlock under way means.
		kw.q.lose(kw.h, kw.q.holdGone(l.rpcCtx, kw.h))
		w.mu.Lock()
		w.drop(kw)
		w.mu.Unlock()
	}()
}

// read reads kw's key until etcd answers or the watch is stopped. It
// returns the revision after the read and true if the key is still the
// one watched, 0 and false if it is not, or -1 if it was stopped.
func (w *sessionWatcher) read(l *keyProbe, kw *keyWatch) (from int64, ok bool) {
	backoff := 50 * time.Millisecond
	for {
		gctx, cancel := context.WithTimeout(streams.RequireLeader(l.rpcCtx), cleanupTimeout)
		resp, err := w.s.cli.Get(gctx, kw.q.key)
		cancel()
		switch {
		case l.waitCtx.Err() != nil:
			return -1, false
		case err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == kw.rev():
			return resp.Header.Revision + 1, true
		case err == nil:
			return 0, false
		}
		// etcd out of reach, or without a leader: ask again after a
		// pause. If it stays out of reach, the session's deadline ends
		// the hold in time.
		t := time.NewTimer(backoff)
		select {
		case <-l.waitCtx.Done():
			t.Stop()
			return -1, false
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// deleted reports whether the events delete kw's key at or after kw.sw.Rev.
// (A lagging member replaying an older deletion is excluded by the
// watch's start revision already; the check costs nothing.)
func deleted(kw *keyWatch, events []*mvccpb.Event) bool {
	for _, ev := range events {
		if ev.Type == mvccpb.DELETE && ev.Kv.ModRevision >= kw.sw.Rev {
			return true
		}
	}
	return false
}

// end ends every watch of the session, which has ended: each hold is lost
// with it, and each waiter told. It then waits for the goroutines that
// probe keys, and gives the stream back.
func (w *sessionWatcher) end() {
	defer close(w.endDone)
	w.mu.Lock()
	w.ended = true
	var ended []*keyWatch
	for kw := range w.watches {
		if w.drop(kw) && kw.h == nil {
			kw.tell()
		}
		ended = append(ended, kw)
	}
	w.mu.Unlock()
	cause := context.Cause(w.s.endCtx)
	for _, kw := range ended {
		if kw.h != nil {
			kw.q.lose(kw.h, cause)
		}
	}
	// The holds nobody watched (Done was never asked) end with the
	// session too: lose reports each once, as it did the watched ones.
	// One whose max hold had passed ended then (Err said so, and its key
	// went with the max hold's lease): that stays its cause.
	for _, q := range w.s.holders() {
		q.mu.Lock()
		h, why := q.h, cause
		if h != nil && h.intact() && q.maxHoldPassed(h) {
			why = errMaxHold
		}
		q.mu.Unlock()
		if h != nil {
			q.lose(h, why)
		}
	}
	w.busy.Wait()
	w.ws.Close()
}

// wait waits until end has returned. The session has ended.
func (w *sessionWatcher) wait() {
	<-w.endDone
}

// refused handles etcd's refusal to make kw's watch (a permission denied,
// say: the create request is answered as created and cancelled), with
// w.mu held. One rule for every watch: the stream is fine, and so are the
// other watches on it, so it stays; the refused watch is made again after
// a pause, which doubles with each refusal in a row (25ms to 1s), for as
// long as it is wanted. A blocker's watch is made again by its waiter,
// which is told as when a watch breaks, and reads the queue before it
// watches anew; the others are queued again once the pause is over.
func (w *sessionWatcher) refused(kw *keyWatch) {
	kw.state = watchPaused
	pause := min(streams.MinBackoff<<min(kw.refusals, 8), streams.MaxBackoff)
	kw.refusals++
	if w.paused == nil {
		w.paused = make(map[*keyWatch]*time.Timer)
	}
	w.paused[kw] = time.AfterFunc(pause, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if kw.state == watchPaused {
			delete(w.paused, kw)
			w.enqueue(kw)
		}
	})
}

// key returns the key b watches (a prefix when it watches a range).
func (b *blockerWatch) key() string { return b.kw.sw.Key }

// news hands evs, events of b's watch, to b's waiter, with w.mu held.
func (b *blockerWatch) news(evs []*mvccpb.Event) {
	ww := b.kw.ww
	for _, ev := range evs {
		ww.events = append(ww.events, watchedEvent{b: b, ev: ev})
	}
	ww.signal()
}

// Created is told, with w.mu held, that etcd made kw's watch at rev
// (streams.Handler).
func (kw *keyWatch) Created(int64) { kw.refusals = 0 }

// Events is told, with w.mu held, the events of kw's watch: a blocker's
// go to its waiter; a deletion of the key watched ends the key
// (streams.Handler).
func (kw *keyWatch) Events(evs []*mvccpb.Event) {
	if deleted(kw, evs) {
		kw.watcher().gone(kw)
	}
}

// Ended is told, with w.mu held, that kw's watch ended without its event
// (streams.Handler). A blocker's waiter is told, since events may have
// been missed: it reads the queue again. The others are made again from
// the same revision; one whose revision is compacted reads the key
// first, and one etcd refused waits a pause first.
func (kw *keyWatch) Ended(why streams.End) {
	w := kw.watcher()
	switch why {
	case streams.Compacted:
		w.probe(kw, true)
	case streams.Refused:
		w.refused(kw)
	default:
		w.enqueue(kw)
	}
}

// Created is told, with w.mu held, that etcd made b's watch at rev: the
// waiter closes the gap before it with one read (streams.Handler).
func (b *blockerWatch) Created(rev int64) {
	b.created = rev
	b.kw.ww.signal()
}

// Events hands b's events to its waiter (streams.Handler).
func (b *blockerWatch) Events(evs []*mvccpb.Event) { b.news(evs) }

// Ended tells b's waiter that b's watch ended without its event, for any
// reason: events may have been missed, so it reads the queue again and
// watches anew (streams.Handler).
func (b *blockerWatch) Ended(streams.End) { b.kw.watcher().gone(&b.kw) }
