package etcdlock

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock/internal/streams"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A watchStream is the Watch stream of one client, shared by the
// sessionWatchers of its sessions: the registry of their watches on its
// runner's stream. The runner opens the stream when there is a watch to
// make, opens it again, after a pause, when it breaks, and closes it when
// it has had nothing to watch for idleStreamTimeout. Its goroutines (two
// while a stream is open: one receives, one sends; none while idle) end
// at the latest when the last session of the client releases it.
type watchStream struct {
	cli    *clientv3.Client
	wc     pb.WatchClient
	ctx    context.Context // the client's, with WithRequireLeader; ends at the last release
	cancel context.CancelFunc
	r      *streams.Runner[*pb.WatchRequest, *pb.WatchResponse]

	mu       sync.Mutex  // guards the fields below, the runner's, and those of the sessionWatchers of the client (see there)
	watching int         // the watches not finished, of every session
	queue    []*keyWatch // to create on the open stream, or the next one; finished ones are skipped
	creating []*keyWatch // create requests sent on the open stream and not answered, in order
	ids      map[int64]*keyWatch
	cancels  []int64 // watch IDs to cancel on the open stream
}

// idleStreamTimeout is how long a client keeps its watch stream open with
// nothing to watch: long enough that a program that locks now and then
// reuses it, short enough that clients that stopped watching do not each
// keep a stream on etcd (and two goroutines here).
const idleStreamTimeout = 5 * time.Second

// watchStreams are the watch streams of the process, one per client with
// sessions.
var watchStreams streams.Shared[*watchStream]

// acquireWatchStream returns the watch stream of cli for a new session, or
// nil for a client without a gRPC connection of its own
// (clientv3.NewCtxClient): it has no stream to share, and its watches go
// through its Watcher (see watchAlone). The caller must call release once
// its watches have all finished.
func acquireWatchStream(cli *clientv3.Client) *watchStream {
	conn := cli.ActiveConnection()
	if conn == nil {
		return nil
	}
	return watchStreams.Acquire(cli, func() *watchStream {
		// WithRequireLeader: a member cut off from its leader ends the
		// stream rather than leave its watches silent.
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(cli.Ctx(), requireLeaderMD))
		ws := &watchStream{
			cli:    cli,
			wc:     pb.NewWatchClient(conn),
			ctx:    ctx,
			cancel: cancel,
			ids:    make(map[int64]*keyWatch),
		}
		ws.r = streams.NewRunner(ctx, &ws.mu, streams.User[*pb.WatchRequest, *pb.WatchResponse](ws))
		ws.r.IdleAfter = idleStreamTimeout
		return ws
	})
}

// release gives back a stream acquireWatchStream returned. The last
// session to release it closes it, and waits until its goroutines have
// ended.
func (ws *watchStream) release() {
	if !watchStreams.Release(ws.cli) {
		return
	}
	ws.cancel()
	ws.r.Stop()
}

// Open opens a Watch stream (streams.User).
func (ws *watchStream) Open(ctx context.Context) (streams.Bidi[*pb.WatchRequest, *pb.WatchResponse], error) {
	// WaitForReady: while the client has no connection, wait for one
	// rather than fail at once (as etcd's client does for its calls).
	return ws.wc.Watch(ctx, grpc.WaitForReady(true))
}

// Waiting reports, with ws.mu held, whether there are watches to make
// (streams.User).
func (ws *watchStream) Waiting() bool { return len(ws.queue) > 0 }

// Idle reports, with ws.mu held, whether there is nothing to watch
// (streams.User).
func (ws *watchStream) Idle() bool { return ws.watching == 0 }

// Ended makes the watches of the stream that ended again on the next one,
// from the same revision; a blocker's waiter is told instead, since events
// may have been missed: it reads the queue again (streams.User).
func (ws *watchStream) Ended() {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, kw := range ws.creating {
		if kw.state == watchCreating {
			kw.state = watchQueued
			ws.queue = append(ws.queue, kw)
		}
	}
	for _, kw := range ws.ids {
		if kw.b != nil {
			kw.state = watchQueued // not active: nothing to cancel
			kw.w.gone(kw)
			continue
		}
		kw.state = watchQueued
		ws.queue = append(ws.queue, kw)
	}
	ws.creating, ws.cancels = nil, nil
	clear(ws.ids)
	ws.queue = slices.DeleteFunc(ws.queue, func(kw *keyWatch) bool { return kw.state != watchQueued })
}

// Receive handles one response of the open stream. It reports false when
// the stream must be given up: an answer to a create request not sent
// (streams.User).
func (ws *watchStream) Receive(resp *pb.WatchResponse) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if resp.Created {
		if ok, done := ws.created(resp); done {
			return ok
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
		kw.w.probe(kw, true)
	case resp.Canceled:
		// etcd ended the watch: make it again.
		delete(ws.ids, kw.id)
		kw.w.enqueue(kw)
	case deleted(kw, resp.Events):
		kw.w.gone(kw)
	}
	return true
}

// created takes in the answer to a create request, with ws.mu held:
// etcd answers a stream's create requests in order. It reports whether
// the answer is done with (done), and then what receive returns (ok): a
// create refused, or made for a watch stopped meanwhile (which it
// cancels). Otherwise the watch is active, and its events follow.
func (ws *watchStream) created(resp *pb.WatchResponse) (ok, done bool) {
	if len(ws.creating) == 0 {
		return false, true
	}
	kw := ws.creating[0]
	ws.creating[0] = nil
	ws.creating = ws.creating[1:]
	switch {
	case resp.Canceled:
		if kw.state == watchCreating {
			kw.w.refused(kw)
		}
		return true, true
	case kw.state != watchCreating:
		// Stopped meanwhile.
		ws.cancels = append(ws.cancels, resp.WatchId)
		ws.r.Signal()
		return true, true
	}
	kw.state, kw.id, kw.refusals = watchActive, resp.WatchId, 0
	ws.ids[kw.id] = kw
	if kw.b != nil {
		kw.b.created = resp.Header.Revision
		kw.ww.signal()
	}
	return false, false
}

// Next returns the next request to send, with ws.mu held: a cancel first,
// then a create (streams.User).
func (ws *watchStream) Next() (*pb.WatchRequest, bool) {
	if len(ws.cancels) > 0 {
		id := ws.cancels[0]
		ws.cancels = ws.cancels[1:]
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{
			CancelRequest: &pb.WatchCancelRequest{WatchId: id}}}, true
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
		return &pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: kw.createRequest()}}, true
	}
	return nil, false
}

// createRequest returns the request that creates kw's watch.
func (kw *keyWatch) createRequest() *pb.WatchCreateRequest {
	cr := &pb.WatchCreateRequest{Key: []byte(kw.q.key), StartRevision: kw.from, Filters: noPut}
	if b := kw.b; b != nil {
		cr.Key = []byte(b.key)
		switch {
		case b.key == kw.q.prefix():
			cr.RangeEnd, cr.PrevKv = []byte(clientv3.GetPrefixRangeEnd(b.key)), true
		case b.key == kw.q.delayPfx():
			cr.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(b.key))
		case kw.ww.puts:
			cr.Filters = nil
		}
	}
	return cr
}

// noPut is the filter of a watch that sees deletions only. (Read-only: the
// requests of every watch share it.)
var noPut = []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT}
