package etcdlock_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The requests each path of the library sends, recorded: a change to the
// engine that keeps its promise of "the same Txns" shows none here. Each
// path runs against the shared etcd, and the unary requests of the
// clients under test are written out with the lock's name, the leases
// and the revisions replaced by placeholders, and compared with
// testdata/txn/NAME.txt. After a change that means to change them:
//
//	go test -run TestTxnShapes -txn.update .
var txnUpdate = flag.Bool("txn.update", false, "write testdata/txn/*.txt from what the paths send now")

// txnRecorder writes out the unary requests of clients, in order.
type txnRecorder struct {
	mu     sync.Mutex
	name   string // replaced by NAME
	leases map[int64]string
	revs   map[int64]string
	lines  []string
	on     bool
}

// client returns a client whose unary requests r records while it is on,
// tagged with who.
func (r *txnRecorder) client(t *testing.T, who string) *clientv3.Client {
	in := new(etcdtest.Injector)
	in.Trace(func(rpc etcdtest.RPC) {
		if rpc.Stream {
			return // watches and renewals: their timing is the scheduler's
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.on {
			r.lines = append(r.lines, who+" "+r.format(rpc))
		}
	})
	return cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
}

// record runs f with recording on.
func (r *txnRecorder) record(f func()) {
	r.mu.Lock()
	r.on = true
	r.mu.Unlock()
	f()
	r.mu.Lock()
	r.on = false
	r.mu.Unlock()
}

// lease names lease id in order of appearance: L1, L2, ...
func (r *txnRecorder) lease(id int64) string {
	if id == 0 {
		return "0"
	}
	if r.leases[id] == "" {
		r.leases[id] = "L" + strconv.Itoa(len(r.leases)+1)
	}
	return r.leases[id]
}

// rev names a revision in order of appearance: R1, R2, ... (0 stays 0).
func (r *txnRecorder) rev(n int64) string {
	if n == 0 {
		return "0"
	}
	if r.revs[n] == "" {
		r.revs[n] = "R" + strconv.Itoa(len(r.revs)+1)
	}
	return r.revs[n]
}

var hexLease = regexp.MustCompile(`/([0-9a-f]{8,16})\b`) // %x of a lease ID: up to 16 digits

// key replaces the lock's name and the leases in a key or value.
func (r *txnRecorder) key(b []byte) string {
	s := strings.ReplaceAll(string(b), r.name, "NAME")
	s = hexLease.ReplaceAllStringFunc(s, func(m string) string {
		id, err := strconv.ParseUint(m[1:], 16, 64)
		if err != nil {
			return m
		}
		return "/" + r.lease(int64(id))
	})
	return strconv.Quote(s)
}

// value is key for a value, whose numbers (a delay record's token, a
// request's) are revisions.
func (r *txnRecorder) value(b []byte) string {
	f := strings.Fields(string(b))
	if len(f) > 0 {
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			f[0] = r.rev(n)
			return strconv.Quote(strings.Join(f, " "))
		}
	}
	return r.key(b)
}

func (r *txnRecorder) format(rpc etcdtest.RPC) string {
	short := rpc.Method[strings.LastIndexByte(rpc.Method, '/')+1:]
	switch req := rpc.Req.(type) {
	case *pb.TxnRequest:
		return "Txn " + r.txn(req)
	case *pb.RangeRequest:
		return "Range " + r.rng(req)
	case *pb.PutRequest:
		return fmt.Sprintf("Put %s lease=%s", r.key(req.Key), r.lease(req.Lease))
	case *pb.DeleteRangeRequest:
		return fmt.Sprintf("Delete %s end=%s", r.key(req.Key), r.key(req.RangeEnd))
	case *pb.LeaseGrantRequest:
		return fmt.Sprintf("LeaseGrant ttl=%d", req.TTL)
	case *pb.LeaseRevokeRequest:
		return "LeaseRevoke " + r.lease(req.ID)
	case *pb.LeaseTimeToLiveRequest:
		return fmt.Sprintf("LeaseTimeToLive %s keys=%v", r.lease(req.ID), req.Keys)
	}
	return short
}

func (r *txnRecorder) txn(t *pb.TxnRequest) string {
	var b strings.Builder
	b.WriteString("{if")
	for _, c := range t.Compare {
		fmt.Fprintf(&b, " %s(%s", c.Target, r.key(c.Key))
		if len(c.RangeEnd) > 0 {
			fmt.Fprintf(&b, "..%s", r.key(c.RangeEnd))
		}
		fmt.Fprintf(&b, ")%s", c.Result)
		switch v := c.TargetUnion.(type) {
		case *pb.Compare_CreateRevision:
			b.WriteString(r.rev(v.CreateRevision))
		case *pb.Compare_ModRevision:
			b.WriteString(r.rev(v.ModRevision))
		case *pb.Compare_Version:
			b.WriteString(strconv.FormatInt(v.Version, 10))
		case *pb.Compare_Value:
			b.WriteString(r.value(v.Value))
		case *pb.Compare_Lease:
			b.WriteString(r.lease(v.Lease))
		}
	}
	b.WriteString(" then")
	for _, op := range t.Success {
		b.WriteString(" " + r.op(op))
	}
	b.WriteString(" else")
	for _, op := range t.Failure {
		b.WriteString(" " + r.op(op))
	}
	b.WriteString("}")
	return b.String()
}

func (r *txnRecorder) op(op *pb.RequestOp) string {
	switch v := op.Request.(type) {
	case *pb.RequestOp_RequestRange:
		return "range" + r.rng(v.RequestRange)
	case *pb.RequestOp_RequestPut:
		return fmt.Sprintf("put(%s=%s lease=%s)", r.key(v.RequestPut.Key), r.value(v.RequestPut.Value), r.lease(v.RequestPut.Lease))
	case *pb.RequestOp_RequestDeleteRange:
		return fmt.Sprintf("delete(%s..%s)", r.key(v.RequestDeleteRange.Key), r.key(v.RequestDeleteRange.RangeEnd))
	case *pb.RequestOp_RequestTxn:
		return "txn" + r.txn(v.RequestTxn)
	}
	return "?"
}

func (r *txnRecorder) rng(q *pb.RangeRequest) string {
	s := fmt.Sprintf("(%s", r.key(q.Key))
	if len(q.RangeEnd) > 0 {
		s += ".." + r.key(q.RangeEnd)
	}
	for _, o := range []struct {
		on   bool
		name string
	}{
		{q.Limit != 0, "limit=" + strconv.FormatInt(q.Limit, 10)},
		{q.Revision != 0, "rev=" + r.rev(q.Revision)},
		{q.SortTarget != 0 || q.SortOrder != 0, fmt.Sprintf("sort=%s,%s", q.SortTarget, q.SortOrder)},
		{q.Serializable, "serializable"},
		{q.KeysOnly, "keys"},
		{q.CountOnly, "count"},
		{q.MinCreateRevision != 0, "mincreate=" + r.rev(q.MinCreateRevision)},
		{q.MaxCreateRevision != 0, "maxcreate=" + r.rev(q.MaxCreateRevision)},
	} {
		if o.on {
			s += " " + o.name
		}
	}
	return s + ")"
}

// txnPaths are the paths recorded: each makes its locks on name through
// the recorder's clients, and records what the clients under test send.
var txnPaths = []struct {
	name string
	run  func(t *testing.T, r *txnRecorder, name string)
}{
	{"mutex-uncontended", func(t *testing.T, r *txnRecorder, name string) {
		m := etcdlock.NewMutex(newSession(t, r.client(t, "a")), name)
		r.record(func() {
			require.NoError(t, m.Lock(t.Context()))
			require.NoError(t, m.Unlock(t.Context()))
		})
	}},
	{"mutex-try", func(t *testing.T, r *txnRecorder, name string) {
		a := etcdlock.NewMutex(newSession(t, r.client(t, "a")), name)
		b := etcdlock.NewMutex(newSession(t, r.client(t, "b")), name)
		r.record(func() {
			require.NoError(t, a.TryLock(t.Context()))
			require.ErrorIs(t, b.TryLock(t.Context()), etcdlock.ErrLocked)
			require.NoError(t, a.Unlock(t.Context()))
		})
	}},
	{"mutex-handoff", func(t *testing.T, r *txnRecorder, name string) { handoff(t, r, name) }},
	{"delay-uncontended", func(t *testing.T, r *txnRecorder, name string) {
		m := etcdlock.NewMutex(newSession(t, r.client(t, "a")), name, etcdlock.WithLockDelay(time.Hour))
		r.record(func() {
			require.NoError(t, m.Lock(t.Context()))
			require.NoError(t, m.Unlock(t.Context()))
		})
	}},
	{"delay-try", func(t *testing.T, r *txnRecorder, name string) {
		a := etcdlock.NewMutex(newSession(t, r.client(t, "a")), name, etcdlock.WithLockDelay(time.Hour))
		b := etcdlock.NewMutex(newSession(t, r.client(t, "b")), name, etcdlock.WithLockDelay(time.Hour))
		r.record(func() {
			require.NoError(t, a.TryLock(t.Context()))
			require.ErrorIs(t, b.TryLock(t.Context()), etcdlock.ErrLocked)
			require.NoError(t, a.Unlock(t.Context()))
		})
	}},
	{"delay-handoff", func(t *testing.T, r *txnRecorder, name string) {
		handoff(t, r, name, etcdlock.WithLockDelay(time.Hour))
	}},
	{"rwmutex-read", func(t *testing.T, r *txnRecorder, name string) {
		m := etcdlock.NewRWMutex(newSession(t, r.client(t, "a")), name)
		r.record(func() {
			require.NoError(t, m.RLock(t.Context()))
			require.NoError(t, m.RUnlock(t.Context()))
			require.NoError(t, m.TryRLock(t.Context()))
			require.NoError(t, m.RUnlock(t.Context()))
		})
	}},
	{"semaphore", func(t *testing.T, r *txnRecorder, name string) {
		m := etcdlock.NewSemaphore(newSession(t, r.client(t, "a")), name, 3)
		r.record(func() {
			require.NoError(t, m.Acquire(t.Context(), 2))
			require.NoError(t, m.Release(t.Context()))
			require.NoError(t, m.TryAcquire(t.Context(), 1))
			require.NoError(t, m.Release(t.Context()))
		})
	}},
	{"election", func(t *testing.T, r *txnRecorder, name string) {
		e := etcdlock.NewElection(newSession(t, r.client(t, "a")), name)
		r.record(func() {
			require.NoError(t, e.Campaign(t.Context(), "v1"))
			require.NoError(t, e.Proclaim(t.Context(), "v2"))
			require.NoError(t, e.Resign(t.Context()))
		})
	}},
	{"multimutex", func(t *testing.T, r *txnRecorder, name string) {
		m := etcdlock.NewMultiMutex(newSession(t, r.client(t, "a")), []string{name + "/x", name + "/y"})
		r.record(func() {
			require.NoError(t, m.Lock(t.Context()))
			require.NoError(t, m.Unlock(t.Context()))
			require.NoError(t, m.TryLock(t.Context()))
			require.NoError(t, m.Unlock(t.Context()))
		})
	}},
}

// handoff records a waiter's Lock from its first RPC to its admission,
// when the holder unlocks, and both Unlocks.
func handoff(t *testing.T, r *txnRecorder, name string, opts ...etcdlock.MutexOption) {
	h := etcdlock.NewMutex(newSession(t, r.client(t, "h")), name, opts...)
	w := etcdlock.NewMutex(newSession(t, r.client(t, "w")), name, opts...)
	require.NoError(t, h.Lock(t.Context()))
	r.record(func() {
		q := startWaiter(t.Context(), w)
		q.waitIdle(t)
		require.NoError(t, h.Unlock(t.Context()))
		require.NoError(t, q.result(t, 30*time.Second))
		require.NoError(t, w.Unlock(t.Context()))
	})
}

// fastPath returns the lines without the linearizable read a waiter sends
// again when a member answered its serializable read at a revision older
// than the event it confirms (readIfMine): etcd's timing on a loaded
// machine (seen on etcd 3.5 beside two busy loops), not a change of the
// path's requests. Each one dropped is logged; a path that always fell
// back would show in the benchmarks' RPCs per op, not here.
func fastPath(t *testing.T, lines []string) []string {
	var out []string
	for i, l := range lines {
		if i > 0 && strings.Contains(lines[i-1], " serializable") && l == strings.ReplaceAll(lines[i-1], " serializable", "") {
			t.Logf("a serializable read was sent again linearizably: %s", l)
			continue
		}
		out = append(out, l)
	}
	return out
}

// TestTxnShapes: every path sends the requests recorded in
// testdata/txn. Not parallel: the revisions it records are its own only
// while no other test writes (a waiter reads the gap between its read
// and its watch only when another write came between).
func TestTxnShapes(t *testing.T) {
	for _, p := range txnPaths {
		t.Run(p.name, func(t *testing.T) {
			name := lockName(t)
			r := &txnRecorder{name: name, leases: map[int64]string{}, revs: map[int64]string{}}
			p.run(t, r, name)
			got := strings.Join(fastPath(t, r.lines), "\n") + "\n"
			file := filepath.Join("testdata", "txn", p.name+".txt")
			if *txnUpdate {
				require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
				require.NoError(t, os.WriteFile(file, []byte(got), 0o644))
				return
			}
			want, err := os.ReadFile(file)
			require.NoError(t, err, "no record: run with -txn.update")
			require.Equal(t, string(want), got, "the requests of %s changed", p.name)
		})
	}
}
