package etcdtest

import (
	"context"
	"sync"

	"google.golang.org/grpc"
)

// An Injector runs a test's actions at chosen RPCs of the client it is
// given to (pass DialOptions in clientv3.Config.DialOptions): before a
// request goes out, or once its answer has come, in place of that answer.
// With it a test puts another client's operation, a deletion, a compaction
// or a leader move exactly between two RPCs of the client under test, or
// loses an answer after etcd applied the request: the schedules that
// happy-path tests never reach, made the same on every run.
//
// An action runs in the goroutine of the RPC it is attached to, which
// waits for it: the client under test makes no progress on that call
// meanwhile. An action may use any other client; if it uses the
// client under test, its RPCs are seen (and numbered) like any other.
// An Injector is safe for concurrent use.
type Injector struct {
	mu      sync.Mutex
	n       int64 // RPCs seen
	armed   []*armed
	trace   func(RPC)      // called with every RPC, when set (Trace)
	streams map[string]int // streams opened, by method
}

// An RPC is one request of the client: a unary call, or one message sent
// on a stream.
type RPC struct {
	N      int64  // 1 for the first RPC the Injector saw
	Method string // the gRPC method, such as "/etcdserverpb.KV/Txn"
	Req    any    // the request: *etcdserverpb.TxnRequest, *etcdserverpb.WatchRequest, ...
	Stream bool   // a message sent on a stream (a watch request, a lease renewal)
}

// An Action is what an Injector does at one RPC. Either part may be nil.
type Action struct {
	// Before runs before the request is sent.
	Before func(RPC)
	// Fail, when set, is returned instead of sending a unary call: an
	// error of etcd for a request it did not apply ("request timed out",
	// "raft proposal dropped"). After still runs, with it.
	Fail error
	// After runs once a unary call's answer has come (never for a
	// stream's message), with the call's error, and returns the error
	// the client sees: an error where err is nil loses an answer etcd
	// applied, as a connection that breaks just then would.
	After func(rpc RPC, err error) error
}

type armed struct {
	match func(RPC) bool
	act   Action
	done  chan struct{}
}

// At arms act to run at the first RPC from now on that match accepts, once.
// match is called for every RPC, in order, under the Injector's lock, so it
// may keep state (see Nth) but must not block. The channel returned is
// closed once act has run.
func (in *Injector) At(match func(RPC) bool, act Action) <-chan struct{} {
	a := &armed{match: match, act: act, done: make(chan struct{})}
	in.mu.Lock()
	in.armed = append(in.armed, a)
	in.mu.Unlock()
	return a.done
}

// Disarm removes every action not yet run; their channels stay open.
func (in *Injector) Disarm() {
	in.mu.Lock()
	in.armed = nil
	in.mu.Unlock()
}

// Trace makes the Injector call f with every RPC as it is seen, under its
// lock (f must not block), until Trace(nil).
func (in *Injector) Trace(f func(RPC)) {
	in.mu.Lock()
	in.trace = f
	in.mu.Unlock()
}

// Count returns how many RPCs the Injector has seen.
func (in *Injector) Count() int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.n
}

// Streams returns how many streams of method the client has opened.
func (in *Injector) Streams(method string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.streams[method]
}

// Nth returns a matcher that accepts the k-th RPC (1 for the first) that
// match accepts (every RPC when match is nil), counted from when the
// matcher is armed.
func Nth(k int, match func(RPC) bool) func(RPC) bool {
	seen := 0
	return func(r RPC) bool {
		if match != nil && !match(r) {
			return false
		}
		seen++
		return seen == k
	}
}

// Method returns a matcher of the RPCs of one gRPC method.
func Method(m string) func(RPC) bool {
	return func(r RPC) bool { return r.Method == m }
}

// The etcd methods tests match most.
const (
	MethodTxn       = "/etcdserverpb.KV/Txn"
	MethodRange     = "/etcdserverpb.KV/Range"
	MethodWatch     = "/etcdserverpb.Watch/Watch"
	MethodKeepAlive = "/etcdserverpb.Lease/LeaseKeepAlive"
)

// see numbers an RPC and takes the action armed for it, if any.
func (in *Injector) see(method string, req any, stream bool) (RPC, *armed) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.n++
	r := RPC{N: in.n, Method: method, Req: req, Stream: stream}
	if in.trace != nil {
		in.trace(r)
	}
	for i, a := range in.armed {
		if a.match(r) {
			in.armed = append(in.armed[:i:i], in.armed[i+1:]...)
			return r, a
		}
	}
	return r, nil
}

// DialOptions returns the interceptors through which the Injector sees the
// client's RPCs.
func (in *Injector) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			r, a := in.see(method, req, false)
			if a == nil {
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			defer close(a.done)
			if a.act.Before != nil {
				a.act.Before(r)
			}
			err := a.act.Fail
			if err == nil {
				err = invoker(ctx, method, req, reply, cc, opts...)
			}
			if a.act.After != nil {
				err = a.act.After(r, err)
			}
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return cs, err
			}
			in.mu.Lock()
			if in.streams == nil {
				in.streams = make(map[string]int)
			}
			in.streams[method]++
			in.mu.Unlock()
			return &injectedStream{ClientStream: cs, in: in, method: method}, nil
		}),
	}
}

type injectedStream struct {
	grpc.ClientStream
	in     *Injector
	method string
}

func (s *injectedStream) SendMsg(m any) error {
	r, a := s.in.see(s.method, m, true)
	if a != nil {
		defer close(a.done)
		if a.act.Before != nil {
			a.act.Before(r)
		}
	}
	return s.ClientStream.SendMsg(m)
}
