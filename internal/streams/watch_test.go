package streams_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/streams"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A recorder is a Handler that records what it is told. Its fields are
// guarded by the Watches' Mu, as the Handler's calls are.
type recorder struct {
	created []int64
	events  []*mvccpb.Event
	ended   []streams.End
	news    chan struct{} // capacity 1: something was told
}

func newRecorder() *recorder { return &recorder{news: make(chan struct{}, 1)} }

func (r *recorder) Created(rev int64)          { r.created = append(r.created, rev); r.signal() }
func (r *recorder) Events(evs []*mvccpb.Event) { r.events = append(r.events, evs...); r.signal() }
func (r *recorder) Ended(why streams.End)      { r.ended = append(r.ended, why); r.signal() }

func (r *recorder) signal() {
	select {
	case r.news <- struct{}{}:
	default:
	}
}

// await waits until cond, called with mu held, holds; it fails the test
// if etcd has said nothing that makes it hold within a minute.
func (r *recorder) await(t *testing.T, mu *sync.Mutex, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		mu.Lock()
		ok := cond()
		mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.news:
		case <-deadline.C:
			t.Fatalf("never %s", what)
		}
	}
}

// watchClients returns, for each way a Watches makes its watches, a
// client: one with a connection of its own (the shared stream), and one
// without (clientv3.NewCtxClient: each watch through the Watcher).
func watchClients(t *testing.T, cfg clientv3.Config) map[string]*clientv3.Client {
	real := cluster.Client(t, cfg)
	alone := clientv3.NewCtxClient(t.Context())
	t.Cleanup(func() { alone.Close() })
	alone.KV, alone.Watcher = real.KV, real.Watcher
	return map[string]*clientv3.Client{"Shared": real, "Alone": alone}
}

func put(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Put(t.Context(), key, "v")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func del(t *testing.T, cli *clientv3.Client, key string) int64 {
	t.Helper()
	resp, err := cli.Delete(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestWatchesEvents: a watch from a revision is told that it was created,
// then the deletions of its key from that revision on (and its Puts too
// when it asks), in order, including one made before it was created;
// after Stop its Handler is told nothing more, and the other watches go
// on. Through the shared stream, two Watches of one client use one
// stream.
func TestWatchesEvents(t *testing.T) {
	var rpcs etcdtest.RPCCounter
	for way, cli := range watchClients(t, clientv3.Config{DialOptions: rpcs.DialOptions()}) {
		t.Run(way, func(t *testing.T) {
			key := t.Name() + "/"
			streamsBefore := rpcs.Streams()
			w1, w2 := streams.OpenWatches(t.Context(), cli), streams.OpenWatches(t.Context(), cli)
			from := put(t, cli, key+"a")
			put(t, cli, key+"b")
			gone := del(t, cli, key+"a") // before the watch: it sees it
			r1, r2, r3 := newRecorder(), newRecorder(), newRecorder()
			x1 := &streams.Watch{Key: key + "a", Rev: from + 1, H: r1}
			x2 := &streams.Watch{Key: key + "b", H: r2}
			x3 := &streams.Watch{Key: key, Prefix: true, Puts: true, H: r3}
			w1.Mu.Lock()
			w1.Want()
			w1.Create(x1)
			w1.Mu.Unlock()
			w2.Mu.Lock()
			w2.Want()
			w2.Want()
			w2.Create(x2)
			w2.Create(x3)
			w2.Mu.Unlock()
			r1.await(t, w1.Mu, "told of the deletion before it was made", func() bool { return len(r1.events) == 1 })
			r2.await(t, w2.Mu, "created", func() bool { return len(r2.created) == 1 })
			r3.await(t, w2.Mu, "created", func() bool { return len(r3.created) == 1 })

			w1.Mu.Lock()
			if ev := r1.events[0]; ev.Type != mvccpb.DELETE || ev.Kv.ModRevision != gone {
				t.Errorf("x1 told %v at %d, want the deletion at %d", ev.Type, ev.Kv.ModRevision, gone)
			}
			w1.Stop(x1)
			w1.Unwant()
			w1.Mu.Unlock()
			if way == "Shared" {
				if n := rpcs.Streams() - streamsBefore; n != 1 {
					t.Errorf("two Watches of one client opened %d streams, want 1", n)
				}
			}

			put(t, cli, key+"a")
			put(t, cli, key+"b")
			del(t, cli, key+"a")
			last := del(t, cli, key+"b")
			r2.await(t, w2.Mu, "told of b's deletion", func() bool { return len(r2.events) == 1 })
			r3.await(t, w2.Mu, "told of every change under the prefix", func() bool {
				return len(r3.events) > 0 && r3.events[len(r3.events)-1].Kv.ModRevision == last
			})
			w2.Mu.Lock()
			if ev := r2.events[0]; ev.Type != mvccpb.DELETE || ev.Kv.ModRevision != last {
				t.Errorf("x2 told %v at %d, want the deletion at %d (deletions only)", ev.Type, ev.Kv.ModRevision, last)
			}
			if puts := countType(r3.events, mvccpb.PUT); puts != 2 {
				t.Errorf("the watch with Puts saw %d Puts, want 2", puts)
			}
			w2.Stop(x2)
			w2.Stop(x3)
			w2.Unwant()
			w2.Unwant()
			w2.Mu.Unlock()
			w1.Mu.Lock()
			if len(r1.events) != 1 || len(r1.ended) != 0 {
				t.Errorf("a stopped watch was told %d events and %v", len(r1.events)-1, r1.ended)
			}
			w1.Mu.Unlock()
			w1.Close()
			w2.Close()
		})
	}
}

func countType(evs []*mvccpb.Event, typ mvccpb.Event_EventType) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}

// TestWatchesCompacted: a watch from a compacted revision ends as
// Compacted, and is told no event.
func TestWatchesCompacted(t *testing.T) {
	for way, cli := range watchClients(t, clientv3.Config{}) {
		t.Run(way, func(t *testing.T) {
			key := t.Name()
			from := put(t, cli, key)
			now := put(t, cli, key+"/other")
			if _, err := cli.Compact(t.Context(), now); err != nil {
				t.Fatal(err)
			}
			w := streams.OpenWatches(t.Context(), cli)
			defer w.Close()
			r := newRecorder()
			x := &streams.Watch{Key: key, Rev: from, H: r}
			w.Mu.Lock()
			w.Want()
			w.Create(x)
			w.Mu.Unlock()
			r.await(t, w.Mu, "ended", func() bool { return len(r.ended) > 0 })
			w.Mu.Lock()
			defer w.Mu.Unlock()
			if r.ended[0] != streams.Compacted || len(r.events) != 0 {
				t.Errorf("a watch from a compacted revision ended %v after %d events, want Compacted after none", r.ended[0], len(r.events))
			}
			w.Unwant()
		})
	}
}

// TestWatchesBrokenStream: when the shared stream breaks, a watch it had
// made is told Broken and is idle; made again from its revision, it is
// told the deletion that came while it was idle. A watch whose create
// request was refused is told Refused, and the stream and the other
// watches on it go on.
func TestWatchesBrokenStream(t *testing.T) {
	var in etcdtest.Injector
	cli := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
	key := t.Name()
	w := streams.OpenWatches(t.Context(), cli)
	defer w.Close()
	from := put(t, cli, key)
	r := newRecorder()
	x := &streams.Watch{Key: key, Rev: from + 1, H: r}
	w.Mu.Lock()
	w.Want()
	w.Create(x)
	w.Mu.Unlock()
	r.await(t, w.Mu, "created", func() bool { return len(r.created) == 1 })

	w.BreakStream()
	r.await(t, w.Mu, "ended", func() bool { return len(r.ended) == 1 })
	w.Mu.Lock()
	if r.ended[0] != streams.Broken {
		t.Errorf("a watch on a broken stream ended %v, want Broken", r.ended[0])
	}
	w.Mu.Unlock()
	gone := del(t, cli, key)

	// Refused: etcd answers a create request for an empty range
	// "created, cancelled", as for a permission denied.
	refused := newRecorder()
	y := &streams.Watch{Key: key + "/refused", H: refused}
	in.At(func(rpc etcdtest.RPC) bool {
		req, ok := rpc.Req.(*pb.WatchRequest)
		return ok && string(req.GetCreateRequest().GetKey()) == y.Key
	}, etcdtest.Action{Before: func(rpc etcdtest.RPC) {
		cr := rpc.Req.(*pb.WatchRequest).GetCreateRequest()
		cr.RangeEnd = append([]byte(nil), cr.Key...)
	}})
	w.Mu.Lock()
	w.Want()
	w.Create(y)
	w.Create(x) // again, from its revision
	w.Mu.Unlock()
	refused.await(t, w.Mu, "refused", func() bool { return len(refused.ended) == 1 })
	r.await(t, w.Mu, "told of the deletion while it was idle", func() bool { return len(r.events) == 1 })
	w.Mu.Lock()
	defer w.Mu.Unlock()
	if refused.ended[0] != streams.Refused || len(refused.created) != 0 {
		t.Errorf("a refused watch was told %v, created %v; want Refused, never created", refused.ended, refused.created)
	}
	if ev := r.events[0]; ev.Kv.ModRevision != gone {
		t.Errorf("the watch made again was told a deletion at %d, want %d", ev.Kv.ModRevision, gone)
	}
	w.Stop(x)
	w.Unwant()
	w.Unwant()
}

// TestWatchesCloseEndsAlone: Close, once every watch is stopped, waits for
// the goroutines of the watches made without a stream (TestMain checks
// none is left), even one stopped before etcd answered it.
func TestWatchesCloseEndsAlone(t *testing.T) {
	cli := watchClients(t, clientv3.Config{})["Alone"]
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := streams.OpenWatches(ctx, cli)
	r := newRecorder()
	x := &streams.Watch{Key: t.Name(), H: r}
	w.Mu.Lock()
	w.Want()
	w.Create(x)
	w.Stop(x)
	w.Unwant()
	w.Mu.Unlock()
	w.Close()
	if len(r.created)+len(r.events)+len(r.ended) != 0 {
		t.Errorf("a watch stopped at once was told %v %v %v", r.created, r.events, r.ended)
	}
}
