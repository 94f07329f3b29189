package streams

import (
	"context"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// The watches of every session of a client share one Watch stream: etcd's
// client would give each watch a goroutine of its own and more than a
// kilobyte of state; here a watch is an entry in a map. A Watches is one
// owner's view of that stream (a session's): it makes and stops Watch
// values, each a key or a range from a revision, and tells each one's
// Handler what etcd says of it. The owner shares the stream's mutex (Mu),
// so its own bookkeeping and the stream's change together.
//
// A client without a gRPC connection of its own (clientv3.NewCtxClient)
// has no stream to share: its Watches makes each watch through the
// client's Watcher, a goroutine for each, and tells the Handler the same
// things.

// A Watch is one watch made through a Watches. Its fields are the owner's,
// set before Create and not changed while the watch is made (Rev may
// change between the Handler's Ended and the next Create).
type Watch struct {
	Key    string
	Rev    int64 // the first revision watched; 0: from now
	H      Handler
	Prefix bool // watch every key that starts with Key
	Puts   bool // see Puts too; otherwise deletions only
	PrevKV bool // deletions carry the key's last value

	state watchState // guarded by Mu
	id    int64      // the watch's ID on the open stream, while active
}

// A Handler is told, with the Watches' Mu held, what etcd says of a Watch.
// It is never told of a Watch after Stop.
type Handler interface {
	// Created: etcd made the watch at revision rev.
	Created(rev int64)
	// Events: events of the watch, in order.
	Events(evs []*mvccpb.Event)
	// Ended: the watch is over for the reason given, and idle: Create
	// makes it again (from Rev).
	Ended(why End)
}

// End is why a watch ended without being stopped.
type End uint8

const (
	// Broken: the stream broke. Events after the last ones told may have
	// been missed; from Rev, none are.
	Broken End = iota
	// Compacted: etcd has compacted Rev.
	Compacted
	// Canceled: etcd ended a watch it had made.
	Canceled
	// Refused: etcd refused to make the watch (a permission denied). The
	// stream is fine, and so are the other watches on it.
	Refused
)

type watchState uint8

const (
	idle     watchState = iota // not made, or stopped
	queued                     // to be created on the open stream, or the next one
	creating                   // its create request was sent
	active                     // created: on the open stream as id, or alone
	ending                     // its stream broke: its Handler is to be told
)

// A Watches makes an owner's watches on a client's shared Watch stream.
// Its methods but Close are called with Mu held.
type Watches struct {
	Mu *sync.Mutex // the shared stream's; guards the Watch values made

	s *watchStream // nil: each watch alone, through the client's Watcher

	cli   *clientv3.Client
	ctx   context.Context        // of the watches made alone
	alone map[*Watch]*aloneWatch // the watches made alone, while active
	busy  sync.WaitGroup         // their goroutines
}

// OpenWatches returns a Watches of cli's shared stream. Without one (a
// client with no connection of its own), each watch is made through the
// client's Watcher with ctx, and ends with it. The caller must Close it.
func OpenWatches(ctx context.Context, cli *clientv3.Client) *Watches {
	w := &Watches{cli: cli, ctx: ctx, Mu: &sync.Mutex{}}
	if s := acquireWatchStream(cli); s != nil {
		w.s, w.Mu = s, &s.mu
	}
	return w
}

// Want counts a watch its owner wants, made or not (it may be probing a
// key between two watches, say): the shared stream stays open while any is
// counted. Unwant counts one less.
func (w *Watches) Want() {
	if w.s != nil {
		w.s.watching++
		w.s.r.Start()
	}
}

// Unwant undoes one Want.
func (w *Watches) Unwant() {
	if s := w.s; s != nil {
		s.watching--
		if s.watching == 0 && s.r.Sending() {
			// The open stream's sender waits without an idle timer
			// while there is a watch: wake it to start one.
			s.r.Signal()
		}
	}
}

// Create makes x, which is idle: on the open stream, or the next one.
func (w *Watches) Create(x *Watch) {
	if w.s == nil {
		w.makeAlone(x)
		return
	}
	x.state = queued
	w.s.queue = append(w.s.queue, x)
	w.s.r.Signal()
}

// Stop stops x, made or being made; its Handler is told nothing more. x
// is idle after it.
func (w *Watches) Stop(x *Watch) {
	switch a := w.alone[x]; {
	case a != nil:
		a.cancel()
		delete(w.alone, x)
	case x.state == active:
		delete(w.s.ids, x.id)
		w.s.cancels = append(w.s.cancels, x.id)
		w.s.r.Signal()
	}
	// Queued: skipped when its turn comes. Creating: cancelled when its
	// answer comes (created).
	x.state = idle
}

// Close gives the stream back, once every watch is stopped, and waits for
// the goroutines of the watches made alone.
func (w *Watches) Close() {
	w.busy.Wait()
	if w.s != nil {
		w.s.release()
	}
}

// An aloneWatch is a watch made through the client's Watcher.
type aloneWatch struct {
	cancel context.CancelFunc
}

// makeAlone makes x through the client's Watcher, with Mu held.
func (w *Watches) makeAlone(x *Watch) {
	ctx, cancel := context.WithCancel(w.ctx)
	a := &aloneWatch{cancel: cancel}
	if w.alone == nil {
		w.alone = make(map[*Watch]*aloneWatch)
	}
	x.state, w.alone[x] = active, a
	opts := []clientv3.OpOption{clientv3.WithCreatedNotify(), clientv3.WithRev(x.Rev)}
	if x.Prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	if !x.Puts {
		opts = append(opts, clientv3.WithFilterPut())
	}
	if x.PrevKV {
		opts = append(opts, clientv3.WithPrevKV())
	}
	w.busy.Add(1)
	go func() {
		defer w.busy.Done()
		defer cancel()
		why, created := Broken, false
		for wr := range w.cli.Watch(ctx, x.Key, opts...) {
			w.Mu.Lock()
			if w.alone[x] != a {
				w.Mu.Unlock()
				return // stopped
			}
			switch {
			case wr.CompactRevision != 0:
				why = Compacted
			case wr.Canceled && created:
				why = Canceled
			case wr.Canceled:
				why = Refused
			case wr.Created:
				created = true
				x.H.Created(wr.Header.Revision)
			}
			if len(wr.Events) > 0 && !wr.Canceled {
				x.H.Events(events(wr.Events))
			}
			w.Mu.Unlock()
			if wr.Canceled || wr.CompactRevision != 0 {
				break
			}
		}
		// Ended: by etcd, or the client is closing. A pause first, so that
		// a watch made again at once does not spin on a closed client.
		t := time.NewTimer(MinBackoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		w.Mu.Lock()
		defer w.Mu.Unlock()
		if w.alone[x] == a {
			x.state = idle
			delete(w.alone, x)
			x.H.Ended(why)
		}
	}()
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

// A watchStream is the Watch stream of one client, shared by the Watches
// of its sessions: the registry of their watches on its runner's stream.
// The runner opens the stream when there is a watch to make, opens it
// again, after a pause, when it breaks, and closes it when it has had
// nothing to watch for idleStreamTimeout. Its goroutines (two while a
// stream is open: one receives, one sends; none while idle) end at the
// latest when the last session of the client releases it.
type watchStream struct {
	cli    *clientv3.Client
	wc     pb.WatchClient
	cancel context.CancelFunc
	r      *Runner[*pb.WatchRequest, *pb.WatchResponse]

	mu       sync.Mutex // guards the fields below, the runner's, and the Watch values made on the stream
	watching int        // the watches wanted (Want), of every session
	queue    []*Watch   // to create on the open stream, or the next one; idle ones are skipped
	creating []*Watch   // create requests sent on the open stream and not answered, in order
	ids      map[int64]*Watch
	cancels  []int64 // watch IDs to cancel on the open stream
}

// idleStreamTimeout is how long a client keeps its watch stream open with
// nothing to watch: long enough that a program that locks now and then
// reuses it, short enough that clients that stopped watching do not each
// keep a stream on etcd (and two goroutines here).
const idleStreamTimeout = 5 * time.Second

// watchStreams are the watch streams of the process, one per client with
// sessions.
var watchStreams Shared[*watchStream]

// acquireWatchStream returns the watch stream of cli, or nil for a client
// without a gRPC connection of its own. The caller must call release.
func acquireWatchStream(cli *clientv3.Client) *watchStream {
	conn := cli.ActiveConnection()
	if conn == nil {
		return nil
	}
	return watchStreams.Acquire(cli, func() *watchStream {
		// RequireLeader: a member cut off from its leader ends the
		// stream rather than leave its watches silent.
		ctx, cancel := context.WithCancel(RequireLeader(cli.Ctx()))
		s := &watchStream{
			cli:    cli,
			wc:     pb.NewWatchClient(conn),
			cancel: cancel,
			ids:    make(map[int64]*Watch),
		}
		s.r = NewRunner(ctx, &s.mu, User[*pb.WatchRequest, *pb.WatchResponse](s))
		s.r.IdleAfter = idleStreamTimeout
		return s
	})
}

// release gives back a stream acquireWatchStream returned. The last
// session to release it closes it, and waits until its goroutines have
// ended.
func (s *watchStream) release() {
	if !watchStreams.Release(s.cli) {
		return
	}
	s.cancel()
	s.r.Stop()
}

// Open opens a Watch stream (User).
func (s *watchStream) Open(ctx context.Context) (Bidi[*pb.WatchRequest, *pb.WatchResponse], error) {
	// WaitForReady: while the client has no connection, wait for one
	// rather than fail at once (as etcd's client does for its calls).
	return s.wc.Watch(ctx, grpc.WaitForReady(true))
}

// Waiting reports, with s.mu held, whether there are watches to make
// (User).
func (s *watchStream) Waiting() bool { return len(s.queue) > 0 }

// Idle reports, with s.mu held, whether there is nothing to watch (User).
func (s *watchStream) Idle() bool { return s.watching == 0 }

// Ended makes the watches of the stream that ended again on the next
// one: those not yet created, itself; those created, by their Handlers,
// which are told (User).
func (s *watchStream) Ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range s.creating {
		if x.state == creating {
			x.state = queued
			s.queue = append(s.queue, x)
		}
	}
	broken := make([]*Watch, 0, len(s.ids))
	for _, x := range s.ids {
		x.state = ending
		broken = append(broken, x)
	}
	s.creating, s.cancels = nil, nil
	clear(s.ids)
	s.queue = slices.DeleteFunc(s.queue, func(x *Watch) bool { return x.state != queued })
	for _, x := range broken {
		if x.state == ending { // not stopped by another's Handler
			x.state = idle
			x.H.Ended(Broken)
		}
	}
}

// Receive handles one response of the open stream. It reports false when
// the stream must be given up: an answer to a create request not sent
// (User).
func (s *watchStream) Receive(resp *pb.WatchResponse) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if resp.Created {
		if ok, done := s.created(resp); done {
			return ok
		}
	}
	x := s.ids[resp.WatchId]
	if x == nil {
		return true // an answer to a cancel, or events of a watch stopped since
	}
	switch {
	case resp.CompactRevision != 0:
		delete(s.ids, x.id)
		x.state = idle
		x.H.Ended(Compacted)
	case resp.Canceled:
		delete(s.ids, x.id)
		x.state = idle
		x.H.Ended(Canceled)
	case len(resp.Events) > 0:
		x.H.Events(resp.Events)
	}
	return true
}

// created takes in the answer to a create request, with s.mu held: etcd
// answers a stream's create requests in order. It reports whether the
// answer is done with (done), and then what Receive returns (ok): a create
// refused, or made for a watch stopped meanwhile (which it cancels).
// Otherwise the watch is active, and its events follow.
func (s *watchStream) created(resp *pb.WatchResponse) (ok, done bool) {
	if len(s.creating) == 0 {
		return false, true
	}
	x := s.creating[0]
	s.creating[0] = nil
	s.creating = s.creating[1:]
	switch {
	case resp.Canceled:
		if x.state == creating {
			x.state = idle
			x.H.Ended(Refused)
		}
		return true, true
	case x.state != creating:
		// Stopped meanwhile.
		s.cancels = append(s.cancels, resp.WatchId)
		s.r.Signal()
		return true, true
	}
	x.state, x.id = active, resp.WatchId
	s.ids[x.id] = x
	x.H.Created(resp.Header.Revision)
	return false, false
}

// Next returns the next request to send, with s.mu held: a cancel first,
// then a create (User).
func (s *watchStream) Next() (*pb.WatchRequest, bool) {
	if len(s.cancels) > 0 {
		id := s.cancels[0]
		s.cancels = s.cancels[1:]
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
			CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}, true
	}
	for len(s.queue) > 0 {
		x := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		if x.state != queued {
			continue // stopped, or queued twice
		}
		x.state = creating
		s.creating = append(s.creating, x)
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: x.createRequest()}}, true
	}
	return nil, false
}

// createRequest returns the request that creates x.
func (x *Watch) createRequest() *pb.WatchCreateRequest {
	cr := &pb.WatchCreateRequest{Key: []byte(x.Key), StartRevision: x.Rev, PrevKv: x.PrevKV}
	if x.Prefix {
		cr.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(x.Key))
	}
	if !x.Puts {
		cr.Filters = noPut
	}
	return cr
}

// noPut is the filter of a watch that sees deletions only. (Read-only: the
// requests of every watch share it.)
var noPut = []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}
