package etcdlock

import (
	"context"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// The watches of every session of a client, the loss watch of each hold
// whose Done was called, each waiter's watch on its own key and on its
// blockers (the keys ahead that keep it out), share one Watch stream of
// the client, as its leases share one keepalive stream (see keeper). On
// etcd a stream costs goroutines and memory for as long as it is open, so
// a stream per session would make etcd pay for every waiting session.
// Through etcd's client each watch would cost a goroutine of its own in the
// client, and more than a kilobyte of its state; here a watch is an entry
// in a map, and a waiter costs no goroutine but its own.
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
// (waitWatch.broken), reads the queue again and watches anew, as it did
// when each blocker had a watch of etcd's client.

// A watchStream is the Watch stream of one client, shared by the
// lossWatchers of its sessions. It opens the stream when there is a watch
// to make, opens it again, after a pause, when it breaks, and closes it
// when it has had nothing to watch for idleStreamTimeout. Its goroutines
// (two while a stream is open: one receives, one sends; none while idle)
// end at the latest when the last session of the client releases it.
type watchStream struct {
	cli    *clientv3.Client
	wc     pb.WatchClient
	ctx    context.Context // the client's, with WithRequireLeader; ends at the last release
	cancel context.CancelFunc
	refs   int           // sessions using it; guarded by watchStreams.mu
	wake   chan struct{} // tells run, or the open stream's sender, there is a request to send; capacity 1

	mu       sync.Mutex    // guards the fields below, and those of the lossWatchers of the client (see there)
	started  bool          // run is running
	done     chan struct{} // closed when the last run started has returned
	watching int           // the watches not finished, of every session
	queue    []*keyWatch   // to create on the open stream, or the next one; finished ones are skipped
	creating []*keyWatch   // create requests sent on the open stream and not answered, in order
	ids      map[int64]*keyWatch
	cancels  []int64 // watch IDs to cancel on the open stream
	sending  bool    // a stream is open and its sender may send
}

// watchStreams are the watch streams of the process, one per client with
// sessions.
var watchStreams struct {
	mu sync.Mutex
	m  map[*clientv3.Client]*watchStream
}

// acquireWatchStream returns the watch stream of cli for a new session, or
// nil for a client without a gRPC connection of its own
// (clientv3.NewCtxClient): it has no stream to share, and its watches go
// through its Watcher (see watchAlone).
func acquireWatchStream(cli *clientv3.Client) *watchStream {
	conn := cli.ActiveConnection()
	if conn == nil {
		return nil
	}
	watchStreams.mu.Lock()
	defer watchStreams.mu.Unlock()
	if ws := watchStreams.m[cli]; ws != nil {
		ws.refs++
		return ws
	}
	if watchStreams.m == nil {
		watchStreams.m = make(map[*clientv3.Client]*watchStream)
	}
	// WithRequireLeader: a member cut off from its leader ends the
	// stream rather than leave its watches silent.
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(cli.Ctx(), requireLeaderMD))
	ws := &watchStream{
		cli:    cli,
		wc:     pb.NewWatchClient(conn),
		ctx:    ctx,
		cancel: cancel,
		refs:   1,
		wake:   make(chan struct{}, 1),
		ids:    make(map[int64]*keyWatch),
	}
	watchStreams.m[cli] = ws
	return ws
}

// release gives back a stream acquireWatchStream returned, once the
// session's watches have all finished. The last session to release it
// closes it, and waits until its goroutines have ended.
func (ws *watchStream) release() {
	watchStreams.mu.Lock()
	ws.refs--
	last := ws.refs == 0
	if last {
		// A session that starts from now on gets a stream of its own.
		delete(watchStreams.m, ws.cli)
	}
	watchStreams.mu.Unlock()
	if !last {
		return
	}
	ws.cancel()
	ws.mu.Lock()
	started, done := ws.started, ws.done
	ws.mu.Unlock()
	if started {
		<-done
	}
}

// A lossWatcher keeps the key watches of one session, on its client's
// watch stream. When the session ends it ends every watch: each hold is
// lost with it, and each waiter told. It is safe for concurrent use.
type lossWatcher struct {
	s    *Session
	ws   *watchStream // nil: each watch is made through the client's Watcher (see watchAlone)
	busy sync.WaitGroup
	// endDone is closed when the session's end has ended every watch and
	// the goroutines that look into keys (see look), and watchAlone's,
	// have returned.
	endDone chan struct{}

	// mu is ws.mu, or own without a stream. It guards the fields below,
	// the state, id, from and look of every keyWatch, and its waitWatch
	// and blockerWatch (see there).
	mu      *sync.Mutex
	own     sync.Mutex
	ended   bool                             // the session ended: every watch is over, none is made
	watches map[*keyWatch]struct{}           // the watches not finished
	alone   map[*keyWatch]context.CancelFunc // without a stream: ends the watch watchAlone made
}

// A keyWatch watches one key of the session for its deletion: a hold's key
// (h is set: the deletion ends the hold as lost) or a waiting Lock's key
// (ww is set: the waiter is told); or, when b is set, a waiter's blocker
// (see blockerWatch).
type keyWatch struct {
	w     *lossWatcher
	q     *queue
	h     *hold         // the hold it watches, or nil
	ww    *waitWatch    // the waiter it tells, or nil
	b     *blockerWatch // the blocker watch it is, or nil
	rev   int64         // create revision of the key: the incarnation watched
	from  int64         // the first revision at which a deletion is the key's end; 0: read the key first (a blocker's: watch from now)
	id    int64         // the watch's ID on the open stream, in state watchActive
	state watchState
	look  *watchLook  // the last goroutine that looked into the key
	pause *time.Timer // queues the watch again after etcd refused it, in state watchPaused
	// refusals counts etcd's refusals of the watch in a row: the pause
	// before the next attempt doubles with each.
	refusals uint8
}

// A blockerWatch watches a key ahead of a waiter, or the lock's whole
// prefix (key == the queue's pfx), from when etcd created it on: deletions
// only, except for a reader's watch on one key, which sees Puts too (a
// Downgrade turns a write lock into a read lock in place).
type blockerWatch struct {
	kw      keyWatch
	key     string
	mode    KeyMode // the blocker's mode when it was read
	created int64   // the revision at which etcd created the watch; 0 until then; guarded by lossWatcher.mu
}

// A waitWatch is what a waiting Lock's watches, on its own key and on its
// blockers, tell it. The fields but wake and puts are guarded by
// lossWatcher.mu.
type waitWatch struct {
	wake   chan struct{}  // capacity 1: there is news
	puts   bool           // a reader: its watches on single blockers see Puts too
	events []watchedEvent // blockers' events not yet taken (take)
	gone   bool           // the own key is gone, or the session ended
	broken bool           // a blocker's watch ended without its event
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
	if kw.b != nil {
		kw.ww.broken = true
	} else {
		kw.ww.gone = true
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
	watchQueued   watchState = iota // to be created on a stream
	watchCreating                   // its create request was sent
	watchActive                     // created on the open stream, as id
	watchLooking                    // a goroutine looks into the key (see look)
	watchPaused                     // etcd refused it: made again after a pause (see refused)
	watchFinished                   // stopped, its key gone, or the session ended
)

// A watchLook is a goroutine that looks into a watched key: it reads the
// key when its watch cannot resume (compaction), or asks why a held key
// went (holdGone). Both its contexts end with the session.
type watchLook struct {
	done     chan struct{}      // closed when it returned
	waitCtx  context.Context    // its pauses between reads
	stopWait context.CancelFunc // stops its pauses: the watch is no longer wanted
	rpcCtx   context.Context    // its RPCs
	stopRPC  context.CancelFunc // cancels its RPCs
}

// newLossWatcher returns the watcher of s's keys, which ends them all
// when s ends; it starts nothing.
func newLossWatcher(s *Session) *lossWatcher {
	w := &lossWatcher{s: s, ws: acquireWatchStream(s.cli), endDone: make(chan struct{})}
	w.mu = &w.own
	if w.ws != nil {
		w.mu = &w.ws.mu
	}
	context.AfterFunc(s.endCtx, w.end)
	return w
}

// watchHold starts watching h's key, from h's admission on, and returns
// the watch, or nil if the session has ended (then the hold is lost).
// Called with h's queue.mu held.
func (w *lossWatcher) watchHold(q *queue, h *hold) *keyWatch {
	from := int64(0)
	if h.hdr != nil {
		from = h.hdr.Revision + 1
	}
	kw := &keyWatch{w: w, q: q, h: h, rev: h.rev, from: from}
	if !w.add(kw) {
		return nil
	}
	return kw
}

// watchOwn starts watching a waiter's own key, created at rev, and returns
// the watch and what the waiter's watches tell it: gone is set when the
// key is deleted, or the session ends. puts is set for a reader.
func (w *lossWatcher) watchOwn(q *queue, rev int64, puts bool) (*keyWatch, *waitWatch) {
	ww := &waitWatch{wake: make(chan struct{}, 1), puts: puts}
	kw := &keyWatch{w: w, q: q, ww: ww, rev: rev, from: rev + 1}
	if !w.add(kw) {
		w.mu.Lock()
		kw.tell()
		w.mu.Unlock()
	}
	return kw, ww
}

// watchBlocker starts watching key (a blocker of the waiter ww, or q's
// prefix) from now on, and returns the watch. Its created revision is set
// once etcd made it; its events are ww's; if it ends without its event
// (the stream broke, or the session ended), ww.broken is set.
func (w *lossWatcher) watchBlocker(q *queue, ww *waitWatch, key string, mode KeyMode) *blockerWatch {
	b := &blockerWatch{key: key, mode: mode}
	b.kw.w, b.kw.q, b.kw.ww, b.kw.b = w, q, ww, b
	if !w.add(&b.kw) {
		w.mu.Lock()
		b.kw.tell()
		w.mu.Unlock()
	}
	return b
}

// stopBlockers stops the watches of bs.
func (w *lossWatcher) stopBlockers(bs []*blockerWatch) {
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
func (w *lossWatcher) add(kw *keyWatch) bool {
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
	if kw.h != nil && kw.h.limit != nil {
		// The max hold ends the hold whatever the watch is doing, even
		// waiting on a link that is cut.
		kw.h.limit.timer = time.AfterFunc(time.Until(kw.h.maxDeadline().Add(-kw.q.s.expiryMargin())), func() { w.expire(kw) })
	}
	if ws := w.ws; ws != nil {
		ws.watching++
		if !ws.started {
			ws.started = true
			ws.done = make(chan struct{})
			go ws.run(ws.done)
		}
	}
	if kw.from == 0 && kw.b == nil {
		w.look(kw, true)
	} else {
		w.enqueue(kw)
	}
	return true
}

// enqueue has kw created on the open stream, or the next one. Called with
// w.mu held.
func (w *lossWatcher) enqueue(kw *keyWatch) {
	kw.state = watchQueued
	if w.ws == nil {
		w.watchAlone(kw)
		return
	}
	w.ws.queue = append(w.ws.queue, kw)
	w.ws.signal()
}

// signal wakes run, or the open stream's sender.
func (ws *watchStream) signal() {
	select {
	case ws.wake <- struct{}{}:
	default: // woken already
	}
}

// cancelActive has kw's watch cancelled on the open stream if it is
// active there; kw's state is then the caller's to set. Called with w.mu
// held.
func (w *lossWatcher) cancelActive(kw *keyWatch) {
	if kw.state != watchActive {
		return
	}
	delete(w.ws.ids, kw.id)
	w.ws.cancels = append(w.ws.cancels, kw.id)
	w.ws.signal()
}

// stop ends kw: its owner no longer wants it (Unlock, a waiter that
// returns). A look in progress is waited for, unless ctx ends first: then
// its RPC is cancelled. (etcd's client logs every unary call that fails, a
// cancelled one too, as a warning: a program that locks, calls Done and
// unlocks must log nothing.)
func (w *lossWatcher) stop(ctx context.Context, kw *keyWatch) {
	w.mu.Lock()
	w.drop(kw)
	l := kw.look
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
func (w *lossWatcher) drop(kw *keyWatch) bool {
	if kw.state == watchFinished {
		return false
	}
	w.cancelActive(kw)
	if cancel := w.alone[kw]; cancel != nil {
		cancel()
		delete(w.alone, kw)
	}
	if kw.h != nil && kw.h.limit != nil && kw.h.limit.timer != nil {
		kw.h.limit.timer.Stop()
	}
	if kw.pause != nil {
		kw.pause.Stop()
	}
	kw.state = watchFinished
	delete(w.watches, kw)
	if ws := w.ws; ws != nil {
		ws.watching--
		if ws.watching == 0 && ws.sending {
			// The open stream's sender waits without an idle timer
			// while there is a watch: wake it to start one, whatever
			// state the last watch was dropped in.
			ws.signal()
		}
	}
	return true
}

// expire ends kw's hold at its WithMaxHold limit.
func (w *lossWatcher) expire(kw *keyWatch) {
	w.mu.Lock()
	dropped := w.drop(kw)
	l := kw.look
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
// kw.from, or read and found to be another incarnation, or missing; or
// when a blocker's watch ended without its event. A waiter is told at
// once; a hold's loss is looked into first (holdGone).
func (w *lossWatcher) gone(kw *keyWatch) {
	if kw.h == nil {
		if w.drop(kw) {
			kw.tell()
		}
		return
	}
	w.look(kw, false)
}

// look starts a goroutine that looks into kw's key, with w.mu held: it
// reads the key first if read is set (the watch cannot resume from
// kw.from), and, if the key is not the one watched any more, ends the
// watch: a hold is lost, with the reason holdGone finds.
func (w *lossWatcher) look(kw *keyWatch, read bool) {
	w.cancelActive(kw)
	l := &watchLook{done: make(chan struct{})}
	l.waitCtx, l.stopWait = context.WithCancel(w.s.endCtx)
	l.rpcCtx, l.stopRPC = context.WithCancel(w.s.endCtx)
	kw.state, kw.look = watchLooking, l
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
			case kw.state != watchLooking || kw.look != l || from < 0:
				// Stopped, or the session ended.
				w.mu.Unlock()
				return
			case ok:
				kw.from = from
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
func (w *lossWatcher) read(l *watchLook, kw *keyWatch) (from int64, ok bool) {
	backoff := 50 * time.Millisecond
	for {
		gctx, cancel := context.WithTimeout(requireLeader(l.rpcCtx), cleanupTimeout)
		resp, err := w.s.cli.Get(gctx, kw.q.key)
		cancel()
		switch {
		case l.waitCtx.Err() != nil:
			return -1, false
		case err == nil && len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision == kw.rev:
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

// deleted reports whether the events delete kw's key at or after kw.from.
// (A lagging member replaying an older deletion is excluded by the
// watch's start revision already; the check costs nothing.)
func deleted(kw *keyWatch, events []*mvccpb.Event) bool {
	for _, ev := range events {
		if ev.Type == mvccpb.DELETE && ev.Kv.ModRevision >= kw.from {
			return true
		}
	}
	return false
}

// events returns the events of etcd's client as the API's: the same type
// (an alias in newer clients, a defined type in v3.5).
func events(evs []*clientv3.Event) []*mvccpb.Event {
	out := make([]*mvccpb.Event, len(evs))
	for i, ev := range evs {
		out[i] = (*mvccpb.Event)(ev)
	}
	return out
}

// run opens a stream when there is a watch to make, serves it until it
// breaks or is idle, and waits a little before the next one, until the
// last session releases the stream or there is nothing left to watch (add
// starts it again).
func (ws *watchStream) run(done chan struct{}) {
	defer close(done)
	ctx := ws.ctx
	backoff := minStreamBackoff
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-ws.wake:
		}
		if ws.serve(ctx) {
			backoff = minStreamBackoff
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, maxStreamBackoff)
		ws.mu.Lock()
		if ws.watching == 0 && ctx.Err() == nil {
			// Nothing to watch: a client that no longer watches costs
			// neither a goroutine nor a stream.
			ws.started, ws.queue = false, nil
			ws.mu.Unlock()
			return
		}
		left := len(ws.queue) > 0
		ws.mu.Unlock()
		if left {
			ws.signal() // the watches not made go on the next stream
		}
	}
}

// end ends every watch of the session, which has ended: each hold is lost
// with it, and each waiter told. It then waits for the goroutines that
// look into keys, and gives the stream back.
func (w *lossWatcher) end() {
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
	w.busy.Wait()
	if w.ws != nil {
		w.ws.release()
	}
}

// wait waits until end has returned. The session has ended.
func (w *lossWatcher) wait() {
	<-w.endDone
}

// serve opens one stream and serves it until it breaks or ctx ends. It
// reports whether etcd answered anything on it. The watches made on it
// are made again on the next one.
func (ws *watchStream) serve(ctx context.Context) (answered bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// WaitForReady: while the client has no connection, wait for one
	// rather than fail at once (as etcd's client does for its calls).
	stream, err := ws.wc.Watch(ctx, grpc.WaitForReady(true))
	if err != nil {
		return false
	}
	ws.mu.Lock()
	ws.sending = true
	ws.mu.Unlock()
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		ws.send(ctx, stream)
		cancel() // a failed send breaks the stream: Recv returns too
	}()
	for {
		resp, err := stream.Recv()
		if err != nil {
			break
		}
		answered = true
		if !ws.receive(resp) {
			break
		}
	}

	ws.mu.Lock()
	ws.sending = false // from now on the sender sends nothing
	for _, kw := range ws.creating {
		if kw.state == watchCreating {
			kw.state = watchQueued
			ws.queue = append(ws.queue, kw)
		}
	}
	for _, kw := range ws.ids {
		if kw.b != nil {
			// Events may have been missed: the waiter reads again.
			kw.state = watchQueued // not active: nothing to cancel
			kw.w.gone(kw)
			continue
		}
		kw.state = watchQueued
		ws.queue = append(ws.queue, kw)
	}
	ws.creating, ws.cancels = nil, nil
	clear(ws.ids)
	ws.mu.Unlock()
	cancel()
	<-sendDone
	return answered
}

// receive handles one response of the open stream. It reports false when
// the stream must be given up: etcd refused to make a watch.
func (ws *watchStream) receive(resp *pb.WatchResponse) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if resp.Created {
		// etcd answers a stream's create requests in order.
		if len(ws.creating) == 0 {
			return false
		}
		kw := ws.creating[0]
		ws.creating[0] = nil
		ws.creating = ws.creating[1:]
		switch {
		case resp.Canceled:
			if kw.state == watchCreating {
				kw.w.refused(kw)
			}
			return true
		case kw.state != watchCreating:
			// Stopped meanwhile.
			ws.cancels = append(ws.cancels, resp.WatchId)
			ws.signal()
			return true
		}
		kw.state, kw.id, kw.refusals = watchActive, resp.WatchId, 0
		ws.ids[kw.id] = kw
		if kw.b != nil {
			kw.b.created = resp.Header.Revision
			kw.ww.signal()
		}
	}
	kw := ws.ids[resp.WatchId]
	if kw == nil {
		return true // an answer to a cancel, or events of a watch stopped since
	}
	if kw.b != nil {
		switch {
		case resp.CompactRevision != 0 || resp.Canceled:
			// etcd ended the watch: the waiter reads again.
			delete(ws.ids, kw.id)
			kw.state = watchQueued // not active: nothing to cancel
			kw.w.gone(kw)
		case len(resp.Events) > 0:
			kw.b.news(resp.Events)
		}
		return true
	}
	switch {
	case resp.CompactRevision != 0:
		// The revisions the watch was to start from are compacted (etcd
		// has ended the watch): read the key, and start again after
		// the read.
		delete(ws.ids, kw.id)
		kw.state = watchQueued
		kw.w.look(kw, true)
	case resp.Canceled:
		// etcd ended the watch: make it again.
		delete(ws.ids, kw.id)
		kw.w.enqueue(kw)
	case deleted(kw, resp.Events):
		kw.w.gone(kw)
	}
	return true
}

// refused handles etcd's refusal to make kw's watch (a permission denied,
// say: the create request is answered as created and cancelled), with
// w.mu held. One rule for every watch: the stream is fine, and so are the
// other watches on it, so it stays; the refused watch is made again after
// a pause, which doubles with each refusal in a row (25ms to 1s), for as
// long as it is wanted. A blocker's watch is made again by its waiter,
// which is told as when a watch breaks, and reads the queue before it
// watches anew; the others are queued again once the pause is over.
func (w *lossWatcher) refused(kw *keyWatch) {
	if kw.b != nil {
		kw.state = watchQueued // not active: nothing to cancel
		w.gone(kw)
		return
	}
	kw.state = watchPaused
	pause := min(minStreamBackoff<<min(kw.refusals, 8), maxStreamBackoff)
	kw.refusals++
	kw.pause = time.AfterFunc(pause, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if kw.state == watchPaused {
			w.enqueue(kw)
		}
	})
}

// idleStreamTimeout is how long a client keeps its watch stream open with
// nothing to watch: long enough that a program that locks now and then
// reuses it, short enough that clients that stopped watching do not each
// keep a stream on etcd (and two goroutines here).
const idleStreamTimeout = 5 * time.Second

// send sends the queued create and cancel requests on stream, in order,
// until ctx ends, a send fails, serve stops it, or there has been nothing
// to watch for idleStreamTimeout (then serve closes the stream).
func (ws *watchStream) send(ctx context.Context, stream pb.Watch_WatchClient) {
	for {
		for {
			req := ws.next()
			if req == nil {
				break
			}
			if err := stream.Send(req); err != nil {
				return
			}
		}
		var idle *time.Timer
		var idleC <-chan time.Time
		ws.mu.Lock()
		if ws.watching == 0 {
			idle = time.NewTimer(idleStreamTimeout)
			idleC = idle.C
		}
		ws.mu.Unlock()
		fired := false
		select {
		case <-ctx.Done():
			return
		case <-ws.wake:
		case <-idleC:
			fired = true
		}
		if idle != nil {
			idle.Stop()
		}
		ws.mu.Lock()
		sending, watching := ws.sending, ws.watching > 0
		ws.mu.Unlock()
		if !sending || fired && !watching {
			return
		}
	}
}

// next returns the next request to send, or nil.
func (ws *watchStream) next() *pb.WatchRequest {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if !ws.sending {
		return nil
	}
	if len(ws.cancels) > 0 {
		id := ws.cancels[0]
		ws.cancels = ws.cancels[1:]
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
			CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}
	}
	for len(ws.queue) > 0 {
		kw := ws.queue[0]
		ws.queue[0] = nil
		ws.queue = ws.queue[1:]
		if kw.state != watchQueued {
			continue // finished, or queued twice
		}
		kw.state = watchCreating
		ws.creating = append(ws.creating, kw)
		cr := &pb.WatchCreateRequest{Key: []byte(kw.q.key), StartRevision: kw.from, Filters: noPut}
		if b := kw.b; b != nil {
			cr.Key = []byte(b.key)
			switch {
			case b.key == kw.q.pfx:
				cr.RangeEnd, cr.PrevKv = []byte(clientv3.GetPrefixRangeEnd(b.key)), true
			case kw.ww.puts:
				cr.Filters = nil
			}
		}
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}}
	}
	return nil
}

// noPut is the filter of a watch that sees deletions only. (Read-only: the
// requests of every watch share it.)
var noPut = []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}

// news hands evs, events of b's watch, to b's waiter, with w.mu held.
func (b *blockerWatch) news(evs []*mvccpb.Event) {
	ww := b.kw.ww
	for _, ev := range evs {
		ww.events = append(ww.events, watchedEvent{b: b, ev: ev})
	}
	ww.signal()
}

// watchAlone makes kw's watch through the client's Watcher, for a client
// without a connection of its own: a goroutine and etcd's per-watch state
// for each watch, as before the shared stream. Called with w.mu held.
func (w *lossWatcher) watchAlone(kw *keyWatch) {
	ctx, cancel := context.WithCancel(w.s.watchCtx)
	if w.alone == nil {
		w.alone = make(map[*keyWatch]context.CancelFunc)
	}
	w.alone[kw] = cancel
	from := kw.from
	w.busy.Add(1)
	if kw.b != nil {
		go w.blockerAlone(ctx, cancel, kw)
		return
	}
	go func() {
		defer w.busy.Done()
		defer cancel()
		ch := w.s.cli.Watch(ctx, kw.q.key, clientv3.WithRev(from), clientv3.WithFilterPut())
		for wr := range ch {
			w.mu.Lock()
			switch {
			case kw.state != watchQueued || w.alone[kw] == nil:
			case wr.CompactRevision != 0:
				delete(w.alone, kw)
				w.look(kw, true)
			case deleted(kw, events(wr.Events)):
				delete(w.alone, kw)
				w.gone(kw)
			default:
				w.mu.Unlock()
				continue
			}
			w.mu.Unlock()
			return
		}
		// The watch broke (or was stopped): make it again after a pause.
		t := time.NewTimer(minStreamBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		w.mu.Lock()
		if kw.state == watchQueued {
			w.watchAlone(kw)
		}
		w.mu.Unlock()
	}()
}

// blockerAlone is watchAlone's goroutine for a blocker's watch: it hands
// the watch's creation and events to the waiter, and tells it when the
// watch ends without being stopped.
func (w *lossWatcher) blockerAlone(ctx context.Context, cancel context.CancelFunc, kw *keyWatch) {
	defer w.busy.Done()
	defer cancel()
	b := kw.b
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify()}
	switch {
	case b.key == kw.q.pfx:
		opts = append(opts, clientv3.WithFilterPut(), clientv3.WithPrefix(), clientv3.WithPrevKV())
	case !kw.ww.puts:
		opts = append(opts, clientv3.WithFilterPut())
	}
	for wr := range w.s.cli.Watch(ctx, b.key, opts...) {
		w.mu.Lock()
		ok := kw.state == watchQueued && w.alone[kw] != nil && wr.Err() == nil && wr.CompactRevision == 0
		if ok && wr.Created {
			b.created = wr.Header.Revision
			kw.ww.signal()
		}
		if ok && len(wr.Events) > 0 {
			b.news(events(wr.Events))
		}
		w.mu.Unlock()
		if !ok {
			break
		}
	}
	w.mu.Lock()
	if kw.state == watchQueued && w.alone[kw] != nil {
		// Ended without being stopped: the waiter reads again.
		delete(w.alone, kw)
		w.gone(kw)
	}
	w.mu.Unlock()
}
