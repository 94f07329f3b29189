package etcdlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A shardBook records which replica runs each shard's fn, and fails the
// test the moment two run one shard at once, or a shard's token does not
// rise from owner to owner. Two at once are allowed only where the
// promise allows them: the earlier owner's hold had ended in etcd (its
// lease revoked from outside, see revoked), and it learns so by a watch.
type shardBook struct {
	t       *testing.T
	mu      sync.Mutex
	running map[int]string // shard -> replica running its fn
	token   map[int]int64  // shard -> the last owner's token
	starts  int
	startOn map[string]int  // replica -> fns started there
	revoked map[string]bool // replicas whose leases were revoked from outside
	ended   map[int]ending  // shard -> when and where its last fn returned
	gaps    []time.Duration // handovers: a fn returned on one replica -> the shard's next fn started on another
	changed chan struct{}   // capacity 1: someone started or stopped
}

func newShardBook(t *testing.T) *shardBook {
	return &shardBook{t: t, running: map[int]string{}, token: map[int]int64{}, startOn: map[string]int{}, revoked: map[string]bool{}, ended: map[int]ending{}, changed: make(chan struct{}, 1)}
}

// fn is RunShards's fn for replica r: it runs until its ctx ends.
func (b *shardBook) fn(r string) func(context.Context, etcdlock.Shard) error {
	return func(ctx context.Context, sh etcdlock.Shard) error {
		b.mu.Lock()
		if other, ok := b.running[sh.Num]; ok && !b.revoked[other] {
			b.t.Errorf("shard %d started on %s while %s runs it", sh.Num, r, other)
		}
		if last := b.token[sh.Num]; sh.Token <= last {
			b.t.Errorf("shard %d: token %d on %s, not above the last owner's %d", sh.Num, sh.Token, r, last)
		}
		if e, ok := b.ended[sh.Num]; ok && e.on != r {
			b.gaps = append(b.gaps, time.Since(e.at))
			delete(b.ended, sh.Num)
		}
		b.running[sh.Num], b.token[sh.Num] = r, sh.Token
		b.starts++
		b.startOn[r]++
		b.mu.Unlock()
		b.signal()
		<-ctx.Done()
		b.mu.Lock()
		if b.running[sh.Num] == r {
			delete(b.running, sh.Num)
		}
		b.ended[sh.Num] = ending{on: r, at: time.Now()}
		b.mu.Unlock()
		b.signal()
		return nil
	}
}

// revoke ends replica r's holds in etcd, from outside: its lease revoked,
// as an operator or a test does. Its fns may still run until it learns
// so: the next owners may start meanwhile.
func (b *shardBook) revoke(t *testing.T, r *replica) {
	b.mu.Lock()
	b.revoked[r.name] = true
	b.mu.Unlock()
	_, err := newClient(t).Revoke(t.Context(), r.s.Lease())
	require.NoError(t, err)
}

// An ending is when and on which replica a shard's fn returned.
type ending struct {
	on string
	at time.Time
}

// handovers returns, and forgets, the handover gaps since the last call:
// median and max, and how many.
func (b *shardBook) handovers() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	g := b.gaps
	b.gaps = nil
	if len(g) == 0 {
		return "no handover"
	}
	slices.Sort(g)
	return fmt.Sprintf("handover gap (fn returned -> next owner's fn started) median %v, max %v over %d", g[len(g)/2].Round(100*time.Microsecond), g[len(g)-1].Round(100*time.Microsecond), len(g))
}

// startsOn and runningOn are how many fns started on replica r, and the
// shards it runs now; called with b.mu held.
func (b *shardBook) startsOn(r string) int { return b.startOn[r] }

func (b *shardBook) runningOn(r string) []int {
	var out []int
	for i, o := range b.running {
		if o == r {
			out = append(out, i)
		}
	}
	return out
}

func (b *shardBook) signal() {
	select {
	case b.changed <- struct{}{}:
	default:
	}
}

// settled waits until every one of n shards runs, spread over exactly
// replicas, each running ⌊n/m⌋ or ⌈n/m⌉; it returns the owners.
func (b *shardBook) settled(n int, replicas ...string) map[int]string {
	b.t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		own := make(map[int]string, len(b.running))
		for k, v := range b.running {
			own[k] = v
		}
		b.mu.Unlock()
		if balanced(own, n, replicas) {
			return own
		}
		select {
		case <-b.changed:
		case <-deadline.C:
			b.t.Fatalf("%d shards never settled over %v: %v", n, replicas, own)
		}
	}
}

func balanced(own map[int]string, n int, replicas []string) bool {
	if len(own) != n {
		return false
	}
	per := map[string]int{}
	for _, r := range own {
		if !slices.Contains(replicas, r) {
			return false
		}
		per[r]++
	}
	lo, hi := n/len(replicas), (n+len(replicas)-1)/len(replicas)
	for _, r := range replicas {
		if per[r] < lo || per[r] > hi {
			return false
		}
	}
	return true
}

func moved(a, b map[int]string) int {
	n := 0
	for k, v := range a {
		if b[k] != v {
			n++
		}
	}
	return n
}

// A replica is one RunShards, on a session of its own.
type replica struct {
	name   string
	s      *etcdlock.Session
	cancel context.CancelFunc
	done   chan struct{} // closed once RunShards returned err
	err    error
}

// wait waits for RunShards to return, and returns its error.
func (r *replica) wait() error {
	<-r.done
	return r.err
}

func startReplica(t *testing.T, b *shardBook, lock string, n int, name string) *replica {
	return runReplica(t, newSession(t, newClient(t)), lock, n, name, b.fn(name))
}

// runReplica runs RunShards on s, with fn, until the test ends.
func runReplica(t *testing.T, s *etcdlock.Session, lock string, n int, name string, fn func(context.Context, etcdlock.Shard) error, opts ...etcdlock.ShardOption) *replica {
	ctx, cancel := context.WithCancel(t.Context())
	r := &replica{name: name, s: s, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = etcdlock.RunShards(ctx, s, lock, n, fn, opts...)
	}()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

// TestRunShards: 16 shards over replicas that join, leave and crash. At
// no moment do two replicas run one shard, and each shard's token rises
// from owner to owner (shardBook); once settled every shard runs, each
// replica runs its share, and a change moves few shards.
func TestRunShards(t *testing.T) {
	t.Parallel()
	const n = 16
	lock := lockName(t)
	b := newShardBook(t)
	a := startReplica(t, b, lock, n, "a")
	own := b.settled(n, "a")

	startReplica(t, b, lock, n, "b")
	next := b.settled(n, "a", "b")
	t.Logf("b joined: %d shards moved (8 at least); %s", moved(own, next), b.handovers())
	own = next
	c := startReplica(t, b, lock, n, "c")
	next = b.settled(n, "a", "b", "c")
	t.Logf("c joined: %d shards moved (5 at least); %s", moved(own, next), b.handovers())
	own = next

	// a leaves: RunShards returns nil once its shards are released.
	a.cancel()
	require.NoError(t, a.wait())
	next = b.settled(n, "b", "c")
	t.Logf("a left: %d shards moved (its own: %d); %s", moved(own, next), count(own, "a"), b.handovers())
	own = next

	// c's lease is revoked: its holds end in etcd at once.
	b.revoke(t, c)
	require.ErrorIs(t, c.wait(), etcdlock.ErrSessionExpired)
	next = b.settled(n, "b")
	t.Logf("c's lease revoked: %d shards moved (its own: %d)", moved(own, next), count(own, "c"))
}

func count(own map[int]string, r string) int {
	n := 0
	for _, v := range own {
		if v == r {
			n++
		}
	}
	return n
}

// TestRunShardsFnError: a fn's error ends RunShards, which releases every
// shard and returns it.
func TestRunShardsFnError(t *testing.T) {
	t.Parallel()
	s := newSession(t, newClient(t))
	boom := errors.New("boom")
	err := etcdlock.RunShards(t.Context(), s, lockName(t), 4, func(ctx context.Context, sh etcdlock.Shard) error {
		if sh.Num == 2 {
			return boom
		}
		<-ctx.Done()
		return nil
	})
	require.ErrorIs(t, err, boom)
	q, err := etcdlock.InspectLock(t.Context(), newClient(t), lockName(t)+"/2")
	require.NoError(t, err)
	require.Empty(t, q.Keys, "a shard left held")
}

// TestRunShardsInvalid: bad input is refused before anything is written.
func TestRunShardsInvalid(t *testing.T) {
	t.Parallel()
	s := newSession(t, newClient(t))
	fn := func(context.Context, etcdlock.Shard) error { return nil }
	for _, c := range []struct {
		name string
		n    int
		fn   func(context.Context, etcdlock.Shard) error
		want error
	}{
		{lockName(t), 0, fn, etcdlock.ErrInvalidOption},
		{lockName(t), etcdlock.MaxShards + 1, fn, etcdlock.ErrInvalidOption},
		{lockName(t), 3, nil, etcdlock.ErrInvalidOption},
		{"", 3, fn, etcdlock.ErrInvalidName},
	} {
		t.Run(fmt.Sprintf("%q/%d", c.name, c.n), func(t *testing.T) {
			require.ErrorIs(t, etcdlock.RunShards(t.Context(), s, c.name, c.n, c.fn), c.want)
		})
	}
}

// TestRunShardsDrain: a replica drained (SetShardWeight 0) hands its
// shards over and keeps running none while it stays a member; given its
// weight back it takes its share again. InspectShards shows the members,
// their weights, and every shard's owner where the assignment puts it.
func TestRunShardsDrain(t *testing.T) {
	t.Parallel()
	const n = 12
	lock := lockName(t)
	b := newShardBook(t)
	cli := newClient(t)
	startReplica(t, b, lock, n, "a")
	startReplica(t, b, lock, n, "b")
	c := startReplica(t, b, lock, n, "c")
	b.settled(n, "a", "b", "c")

	require.NoError(t, etcdlock.SetShardWeight(t.Context(), cli, lock, c.s.Lease(), 0))
	b.settled(n, "a", "b")
	set := settledSet(t, cli, lock, n)
	cID := fmt.Sprintf("%x", int64(c.s.Lease()))
	require.Len(t, set.Members, 3)
	for _, m := range set.Members {
		if m.ID == cID {
			require.Equal(t, 0, m.Weight)
			require.Equal(t, 0, m.Owns)
		} else {
			require.Equal(t, etcdlock.FullShardWeight, m.Weight)
			require.Equal(t, n/2, m.Owns)
		}
	}

	require.NoError(t, etcdlock.SetShardWeight(t.Context(), cli, lock, c.s.Lease(), etcdlock.FullShardWeight))
	b.settled(n, "a", "b", "c")
	settledSet(t, cli, lock, n)

	// Bad input: a weight out of range, a lease that is no member.
	require.ErrorIs(t, etcdlock.SetShardWeight(t.Context(), cli, lock, c.s.Lease(), 101), etcdlock.ErrInvalidOption)
	require.ErrorIs(t, etcdlock.SetShardWeight(t.Context(), cli, lock, c.s.Lease(), -1), etcdlock.ErrInvalidOption)
	other := newSession(t, cli)
	require.ErrorIs(t, etcdlock.SetShardWeight(t.Context(), cli, lock, other.Lease(), 0), etcdlock.ErrNotInQueue)
	_, err := etcdlock.InspectShards(t.Context(), cli, lock, 0)
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
}

// settledSet reads the shard set until InspectShards agrees with it: every
// shard owned where the assignment puts it (the book saw fns start before
// etcd's view is read, so the first read may still show a hand-over).
func settledSet(t *testing.T, cli *clientv3.Client, lock string, n int) *etcdlock.ShardSet {
	t.Helper()
	var set *etcdlock.ShardSet
	require.Eventually(t, func() bool {
		var err error
		set, err = etcdlock.InspectShards(t.Context(), cli, lock, n)
		require.NoError(t, err)
		for _, sh := range set.Shards {
			if sh.Moving() {
				return false
			}
		}
		return true
	}, time.Minute, 20*time.Millisecond, "shards still moving")
	return set
}

// TestRunShardsRestartKeepsShards: a replica that restarts within its TTL
// on its old lease (WithLease) runs its shards again, each as a new hold
// with a larger token, and none of them moves to another replica
// meanwhile.
func TestRunShardsRestartKeepsShards(t *testing.T) {
	t.Parallel()
	const n = 8
	lock := lockName(t)
	b := newShardBook(t)
	cli := newClient(t)
	a := startReplica(t, b, lock, n, "a")
	startReplica(t, b, lock, n, "b")
	own := b.settled(n, "a", "b")
	b.mu.Lock()
	before := maps.Clone(b.token)
	startsB := b.startsOn("b")
	b.mu.Unlock()

	// a dies: its session is orphaned, its lease left to run out.
	a.s.Orphan()
	require.Error(t, a.wait())
	b.mu.Lock()
	require.Empty(t, b.runningOn("a"), "a's fns still run after its session ended")
	b.mu.Unlock()

	// Its successor adopts the lease within the TTL.
	runReplica(t, newSession(t, cli, etcdlock.WithLease(a.s.Lease())), lock, n, "a", b.fn("a"))
	next := b.settled(n, "a", "b")
	require.Equal(t, 0, moved(own, next), "shards moved across a restart")
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Equal(t, startsB, b.startsOn("b"), "b ran one of a's shards meanwhile")
	for i, r := range own {
		if r == "a" {
			require.Greater(t, b.token[i], before[i], "shard %d: a restart is a new hold", i)
		}
	}
}

// TestRunShardsStubbornFn: a fn that ignores its ctx keeps its shard when
// the shard moves: the next owner waits, InspectShards shows the shard
// moving with its successor waiting, and the shard starts there only once
// fn returned.
func TestRunShardsStubbornFn(t *testing.T) {
	t.Parallel()
	const n = 2
	lock := lockName(t)
	cli := newClient(t)
	b := newShardBook(t)
	release := make(chan struct{})
	sa := newSession(t, cli)
	stubborn := b.fn("a")
	runReplica(t, sa, lock, n, "a", func(ctx context.Context, sh etcdlock.Shard) error {
		// Ignore ctx: run until the test lets go.
		ended, stop := context.WithCancel(context.WithoutCancel(ctx))
		go func() { <-release; stop() }()
		return stubborn(ended, sh)
	})
	b.settled(n, "a")

	startReplica(t, b, lock, n, "b")
	require.NoError(t, etcdlock.SetShardWeight(t.Context(), cli, lock, sa.Lease(), 0))
	// Both shards are b's now; a keeps them while its fns run.
	var set *etcdlock.ShardSet
	require.Eventually(t, func() bool {
		var err error
		set, err = etcdlock.InspectShards(t.Context(), cli, lock, n)
		require.NoError(t, err)
		return set.Shards[0].Waiting == 1 && set.Shards[1].Waiting == 1
	}, time.Minute, 20*time.Millisecond, "b never queued for the shards a keeps")
	aID := fmt.Sprintf("%x", int64(sa.Lease()))
	for _, sh := range set.Shards {
		require.Equal(t, aID, sh.Owner)
		require.True(t, sh.Moving(), "shard %d: a keeps it, b is assigned it", sh.Num)
	}
	b.mu.Lock()
	require.Len(t, b.runningOn("a"), n)
	require.Zero(t, b.startsOn("b"), "b ran a shard a's fn still runs")
	b.mu.Unlock()

	close(release)
	b.settled(n, "b")
}

// TestRunShardsCrash: a replica that dies (its session orphaned: no
// keepalives, no release) stops its fns at once, and its shards start on
// the others only once its lease has ended in etcd, never sooner; with a
// lock delay, only once the delay has passed too.
func TestRunShardsCrash(t *testing.T) {
	t.Parallel()
	for _, delay := range []time.Duration{0, time.Second} {
		t.Run(fmt.Sprintf("delay=%v", delay), func(t *testing.T) {
			t.Parallel()
			testRunShardsCrash(t, delay)
		})
	}
}

func testRunShardsCrash(t *testing.T, delay time.Duration) {
	const n = 6
	lock := lockName(t)
	cli := newClient(t)
	b := newShardBook(t)
	ttl := etcdlock.WithTTL(2 * time.Second)
	var opts []etcdlock.ShardOption
	if delay > 0 {
		opts = append(opts, etcdlock.WithShardMutexOptions(etcdlock.WithLockDelay(delay)))
	}
	a := runReplica(t, newSession(t, cli, ttl), lock, n, "a", b.fn("a"), opts...)
	var early []string // a's shards started while its lease or delay lived
	var mu sync.Mutex
	bfn := b.fn("b")
	runReplica(t, newSession(t, cli, ttl), lock, n, "b", func(ctx context.Context, sh etcdlock.Shard) error {
		if a.s.Err() != nil { // a has died: are its lease and delay gone?
			ttl, err := cli.TimeToLive(ctx, a.s.Lease())
			q, qerr := etcdlock.InspectLock(ctx, cli, sh.Key()[:strings.LastIndexByte(sh.Key(), '/')])
			mu.Lock()
			if err == nil && ttl.TTL > 0 {
				early = append(early, fmt.Sprintf("shard %d: a's lease lives", sh.Num))
			}
			if qerr == nil && len(q.Delays) > 0 {
				early = append(early, fmt.Sprintf("shard %d: a delay is pending", sh.Num))
			}
			mu.Unlock()
		}
		return bfn(ctx, sh)
	}, opts...)
	own := b.settled(n, "a", "b")

	died := time.Now()
	a.s.Orphan()
	require.ErrorIs(t, a.wait(), etcdlock.ErrSessionClosed)
	next := b.settled(n, "b")
	t.Logf("a died: %d shards moved (its own: %d) in %v, its TTL 2s, lock delay %v", moved(own, next), count(own, "a"), time.Since(died).Round(10*time.Millisecond), delay)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, early, "shards of a started on b too soon")
}

// TestRunShardsPartitioned: a replica cut off from etcd keeps running its
// shards while its lease may live, and stops each fn before its lease can
// end in etcd: the holder is told first, so the others start its shards
// only after its fns returned (the book allows no overlap here).
func TestRunShardsPartitioned(t *testing.T) {
	t.Parallel()
	const n = 6
	lock := lockName(t)
	b := newShardBook(t)
	px := etcdtest.NewProxy(t, endpoints[0])
	acli := cluster.Client(t, clientv3.Config{Endpoints: []string{px.URL()}})
	a := runReplica(t, cutSession(t, acli, etcdlock.WithTTL(3*time.Second)), lock, n, "a", b.fn("a"))
	startReplica(t, b, lock, n, "b")
	own := b.settled(n, "a", "b")

	cut := time.Now()
	px.Cut()
	next := b.settled(n, "b")
	t.Logf("a cut off: %d shards moved (its own: %d) in %v, its TTL 3s", moved(own, next), count(own, "a"), time.Since(cut).Round(10*time.Millisecond))
	require.ErrorIs(t, a.wait(), etcdlock.ErrSessionExpired)
}

// TestRunShardsFnAgain: a fn that returns nil while it owns its shard is
// called again, in the same hold (the same token).
func TestRunShardsFnAgain(t *testing.T) {
	t.Parallel()
	s := newSession(t, newClient(t))
	ctx, cancel := context.WithCancel(t.Context())
	var tokens []int64
	err := etcdlock.RunShards(ctx, s, lockName(t), 1, func(ctx context.Context, sh etcdlock.Shard) error {
		tokens = append(tokens, sh.Token)
		if len(tokens) == 3 {
			cancel()
		}
		return nil
	})
	require.NoError(t, err)
	require.Len(t, tokens, 3)
	require.Equal(t, tokens[0], tokens[2], "a new hold between calls")
}

// TestRunShardsLeaveSchedules: a replica's membership key never outlives
// its RunShards while its session lives, whatever becomes of the writes
// that put and delete it: a leftover key would keep its share of the
// shards without an owner.
func TestRunShardsLeaveSchedules(t *testing.T) {
	t.Parallel()
	// touches reports whether an RPC writes lock's membership key.
	touches := func(lock string, del bool) func(etcdtest.RPC) bool {
		pfx := []byte(lock + "/members/")
		return func(r etcdtest.RPC) bool {
			switch req := r.Req.(type) {
			case *pb.PutRequest:
				return !del && bytes.HasPrefix(req.Key, pfx)
			case *pb.TxnRequest:
				for _, op := range req.Success {
					if d := op.GetRequestDeleteRange(); del && d != nil && bytes.HasPrefix(d.Key, pfx) {
						return true
					}
				}
			}
			return false
		}
	}
	failed := etcdtest.Action{Fail: status.Error(codes.Unavailable, "test: the request failed")}
	for _, c := range []struct {
		name string
		del  bool // the leave's delete, else the join's put
		act  func(cancel context.CancelFunc) etcdtest.Action
	}{
		// The leave's delete fails: it is sent again, in the background.
		{"DeleteFails", true, func(context.CancelFunc) etcdtest.Action { return failed }},
		// The delete's answer is lost: sent again, it finds the key gone.
		{"DeleteAnswerLost", true, func(context.CancelFunc) etcdtest.Action { return answerLost }},
		// The replica leaves while its join's put is in flight: the put
		// is awaited, and its key removed.
		{"LeaveDuringJoin", false, func(cancel context.CancelFunc) etcdtest.Action {
			return etcdtest.Action{Before: func(etcdtest.RPC) { cancel() }}
		}},
		// The join's answer is lost, and the replica leaves then: was
		// the key put? The leave reads it, and removes it.
		{"LeaveAfterJoinLost", false, func(cancel context.CancelFunc) etcdtest.Action {
			return etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
				cancel()
				return answerLost.After(etcdtest.RPC{}, err)
			}}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			const n = 4
			lock := lockName(t)
			cli := newClient(t)
			b := newShardBook(t)
			var in etcdtest.Injector
			s := newSession(t, cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()}))
			ctx, cancel := context.WithCancel(t.Context())
			fired := in.At(etcdtest.Nth(1, touches(lock, c.del)), c.act(cancel))
			done := make(chan error, 1)
			go func() { done <- etcdlock.RunShards(ctx, s, lock, n, b.fn("a")) }()
			startReplica(t, b, lock, n, "b")
			if c.del {
				b.settled(n, "a", "b")
				cancel()
			}
			awaitFired(t, fired)
			require.NoError(t, <-done)
			// b takes every shard: a's key is gone, while a's session lives.
			b.settled(n, "b")
			require.NoError(t, s.Err())
			resp, err := cli.Get(t.Context(), lock+"/members/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			require.NoError(t, err)
			require.EqualValues(t, 1, resp.Count, "a member key besides b's")
		})
	}
}

// TestRunShardsInvalidMutexOption: a shard's invalid Mutex option is
// refused before the replica joins, not at each shard's Lock.
func TestRunShardsInvalidMutexOption(t *testing.T) {
	t.Parallel()
	var in etcdtest.Injector
	s := newSession(t, cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()}))
	before := in.Count()
	err := etcdlock.RunShards(t.Context(), s, lockName(t), 2, func(context.Context, etcdlock.Shard) error { return nil },
		etcdlock.WithShardMutexOptions(etcdlock.WithLockDelay(-time.Second)))
	require.ErrorIs(t, err, etcdlock.ErrInvalidOption)
	require.Equal(t, before, in.Count(), "RPCs made for a RunShards refused")
}
