package etcdlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The schedule explorer of RunShards: a few replicas, each a RunShards of
// n shards on one name, on a client, session and proxy of its own. At
// each step one replica joins, leaves (its ctx ends), crashes (its
// session orphaned, its lease revoked, or its client closed), is
// partitioned (its link paused or cut, or its answers delayed), is
// healed, or has its fns fail; and at a chosen RPC of one replica the
// explorer injects a fault: another replica joining or leaving, a
// shard's or a member's key deleted, a lease revoked, a foreign key in a
// shard's queue or among the members, a compaction, a lost answer, a
// failed request, the link paused or cut there, and on three members
// etcd's leader moved. Each fn call is written in a book: its replica,
// shard, key and token, when it started, when its ctx ended and when it
// returned. What is checked, against etcd at one revision where it
// concerns storage, at each fn's start and after every step:
//
//   - never two at once: every fn that has not returned and whose key is
//     in etcd holds its key first in its shard's queue (so no other fn of
//     the shard, whose key would be there too, runs); a fn whose key is
//     gone lost it to its lease's end or to the explorer, never to
//     another replica (that would be a handover too early), and its ctx
//     ends within lossBound;
//   - tokens strictly rise per shard from owner to owner, in the order of
//     their keys' create revisions (the order in which the queue admits
//     them), and stay the same within a hold;
//   - settled: once the faults stop, within settleBound, every shard's fn
//     runs on exactly one replica, the one whose key holds the shard, and
//     each of the m replicas whose membership key exists runs ⌊n/m⌋ or
//     ⌈n/m⌉ shards;
//   - RunShards returns within returnBound once its ctx or its session
//     ends, with nil after its ctx, else the error that ended it (a fn's,
//     the session's), only once every fn it called has returned; it
//     leaves no key of a live session; and no goroutine it started
//     outlives the schedule.
//
// The flags are TestExplore's: -explore.seed, -explore.for,
// -explore.seeds, -explore.members, -explore.log. A failure prints the
// seed, the schedule and the command that replays it.

const (
	// shardTTL is each replica's session TTL.
	shardTTL = 3 * time.Second
	// shardSteps is how many steps a schedule takes.
	shardSteps = 10
	// shardMaxLive is the most replicas a schedule runs at once.
	shardMaxLive = 5
	// lossBound: a fn's ctx ends this long after the checker found its
	// key gone, at the latest. A holder that is cut off learns it by its
	// session's end, within the TTL.
	lossBound = 10*time.Second + 2*shardTTL
	// returnBound: RunShards returns this long after its ctx or its
	// session ended, at the latest (its releases get 5s each).
	returnBound = 30*time.Second + 2*shardTTL
	// settleBound: the shards are spread this long after the faults
	// stopped and the replicas the explorer ended returned, at the latest.
	settleBound = 30*time.Second + 4*shardTTL
)

// errShardFn is what a failing replica's fn returns.
var errShardFn = errors.New("explore: the fn failed")

// shardLabel labels (runtime/pprof) every goroutine a schedule's replicas
// start, with the schedule's name: what is left of them at its end leaked.
const shardLabel = "etcdlock-explore-shards"

// TestExploreShards runs the RunShards explorer on the shared one-member
// etcd and on a three-member one of its own.
func TestExploreShards(t *testing.T) {
	t.Parallel()
	long := *exploreFor > 0
	if *exploreMembers != 3 {
		t.Run("OneMember", func(t *testing.T) {
			t.Parallel()
			exploreShards(t, cluster, 6)
		})
	}
	if long && *exploreMembers != 3 || *exploreMembers == 1 || testing.Short() {
		return
	}
	t.Run("ThreeMembers", func(t *testing.T) {
		t.Parallel()
		exploreShards(t, etcdtest.Start(t, 3), 3)
	})
}

// exploreShards runs schedules on c: the seed given, seeds for as long as
// asked, or short seeds.
func exploreShards(t *testing.T, c *etcdtest.Cluster, short int) {
	var st shardStats
	start := time.Now()
	defer func() { t.Logf("%s in %v", &st, time.Since(start).Round(time.Second)) }()
	h := fnv.New64a()
	fmt.Fprintf(h, "Shards/%d", c.Size())
	base := h.Sum64() % 1e9 * 1000
	switch {
	case *exploreSeed != 0:
		st.add(runShardSchedule(t, c, *exploreSeed))
	case *exploreFor > 0:
		for seed := base + 1; time.Since(start) < *exploreFor && !t.Failed(); seed++ {
			st.add(runShardSchedule(t, c, seed))
		}
	default:
		n := short
		if *exploreSeeds > 0 {
			n = *exploreSeeds
		}
		for i := range n {
			if t.Failed() {
				return
			}
			st.add(runShardSchedule(t, c, base+uint64(i)+1))
		}
	}
}

// shardStats counts what schedules met: a checker is only as good as the
// cases it sees.
type shardStats struct {
	schedules, starts, verified, handovers, lost, faults int
	settled                                              time.Duration // the longest settle
}

func (s *shardStats) add(o shardStats) {
	s.schedules += o.schedules
	s.starts += o.starts
	s.verified += o.verified
	s.handovers += o.handovers
	s.lost += o.lost
	s.faults += o.faults
	s.settled = max(s.settled, o.settled)
}

func (s *shardStats) String() string {
	return fmt.Sprintf("%d schedules: %d fn starts, %d holds checked in etcd, %d handovers, %d holds lost, %d faults injected; longest settle %v",
		s.schedules, s.starts, s.verified, s.handovers, s.lost, s.faults, s.settled.Round(time.Millisecond))
}

// A shardSchedule is one run of the explorer.
type shardSchedule struct {
	t      *testing.T
	c      *etcdtest.Cluster
	seed   uint64
	began  time.Time
	rng    *rand.Rand
	name   string
	n      int
	admin  *clientv3.Client // the explorer's own: checks, faults
	ctx    context.Context
	cancel context.CancelFunc
	px     int // proxies made: the next one's member

	// injecting is read-locked by each injection while it runs, inside
	// a replica's RPC: teardown write-locks it to wait for them.
	injecting sync.RWMutex

	mu       sync.Mutex
	log, bad []string
	spare    *etcdtest.Proxy // the next replica's: a join inside an RPC makes none
	spareTo  int             // the member it leads to
	nextID   int
	reps     []*shardReplica              // every replica, in order of joining
	calls    []*shardCall                 // every fn call, in order of starts
	owners   map[int]map[int64]*shardCall // per shard, the holds checked current, by their key's create revision
	deleted  map[string]bool              // the shard keys the explorer deleted
	foreign  []string                     // foreign keys, in order
	fLease   clientv3.LeaseID             // their lease
	settling bool                         // the faults have stopped: fns run until their ctx ends
	changed  chan struct{}                // capacity 1: a fn started or returned
	version  int                          // counts the book's changes
	st       shardStats
}

// A shardReplica is one RunShards, on a client, session and proxy of its
// own.
type shardReplica struct {
	id     int
	x      *shardSchedule
	in     *etcdtest.Injector
	px     *etcdtest.Proxy
	cli    *clientv3.Client
	s      *etcdlock.Session
	cancel context.CancelFunc
	done   chan struct{} // closed once RunShards returned
	fail   chan struct{} // closed: its fns return errShardFn
	// Guarded by x.mu:
	err      error
	returned time.Time // when RunShards returned
	ended    time.Time // when the explorer ended it (left, crashed, cut), or its session ended
	why      string    // what the explorer did to it, in order
	left     bool      // its ctx was cancelled
	crashed  bool      // orphaned, revoked, client closed or cut: it returns, with any error
	failed   bool      // its fns fail
	unmember bool      // the explorer deleted its membership key
	paused   bool      // its link is paused (a partition that heals)
	cut      bool      // its link is cut, for good
	delayed  bool      // its answers are late
	late     bool      // reported as not returning in time
	calls    map[int]int
}

// A shardCall is one call of a replica's fn: the book's entry.
type shardCall struct {
	rep     *shardReplica
	shard   int
	key     string
	token   int64
	call    int // the replica's how many'th call for the shard
	started time.Time
	// Guarded by x.mu:
	created  int64     // its key's create revision, once read
	lostAt   time.Time // when the checker found its key gone
	lostRev  int64
	ctxEnded time.Time
	done     bool // fn returned (or is returning)
	reported bool // its ctx's late end was reported
	overlap  bool // its key's place in the queue was reported
}

func (x *shardSchedule) logf(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.logLocked(format, args...)
}

// logLocked logs a line, after the time since the schedule began.
func (x *shardSchedule) logLocked(format string, args ...any) {
	x.log = append(x.log, fmt.Sprintf("%6.3f ", time.Since(x.began).Seconds())+fmt.Sprintf(format, args...))
}

// violation records a broken promise.
func (x *shardSchedule) violation(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.violationLocked(format, args...)
}

func (x *shardSchedule) violationLocked(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	x.bad = append(x.bad, msg)
	x.logLocked("VIOLATION: %s", msg)
}

func (x *shardSchedule) signal() {
	select {
	case x.changed <- struct{}{}:
	default:
	}
}

// runShardSchedule runs the schedule of seed.
func runShardSchedule(t *testing.T, c *etcdtest.Cluster, seed uint64) shardStats {
	x := &shardSchedule{
		t: t, c: c, seed: seed, began: time.Now(),
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		name:    fmt.Sprintf("explore/Shards/m%d/%d", c.Size(), seed),
		owners:  map[int]map[int64]*shardCall{},
		deleted: map[string]bool{},
		changed: make(chan struct{}, 1),
	}
	x.n = 4 + x.rng.IntN(9)
	x.ctx, x.cancel = context.WithCancel(context.Background())
	defer x.cancel()
	var err error
	if x.admin, err = c.NewClient(clientv3.Config{}); err != nil {
		t.Fatalf("explorer client: %v", err)
	}
	defer x.admin.Close()
	// On three members another schedule's leader move can drop this
	// Grant: etcd's answer to the explorer, not a finding.
	var g *clientv3.LeaseGrantResponse
	for try := range 8 {
		if g, err = x.admin.Grant(x.ctx, 60); err == nil {
			break
		}
		time.Sleep(time.Duration(50<<try) * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("foreign lease: %v", err)
	}
	x.fLease = g.ID
	x.logf("start: %d shards", x.n)
	for range 2 + x.rng.IntN(2) {
		x.refill()
		x.join("start")
	}
	for step := range shardSteps {
		x.step(step)
		x.check(fmt.Sprintf("after step %d", step))
	}
	x.teardown()

	x.mu.Lock()
	bad, log, st := x.bad, x.log, x.st
	x.mu.Unlock()
	st.schedules = 1
	if len(bad) > 0 || *exploreVerbose {
		report := fmt.Sprintf("schedule Shards (seed %d, %d members, %d shards):\n  %s", seed, c.Size(), x.n, strings.Join(log, "\n  "))
		if len(bad) > 0 {
			t.Errorf("%s\nreplay: go test -run 'TestExploreShards/%s$' -explore.seed=%d -v .", report, shardRunName(c), seed)
		} else {
			t.Log(report)
		}
	}
	return st
}

func shardRunName(c *etcdtest.Cluster) string {
	if c.Size() == 3 {
		return "ThreeMembers"
	}
	return "OneMember"
}

// refill makes the proxy of the next replica, outside any RPC (NewProxy
// may fail the test, which only the test's goroutine may do).
func (x *shardSchedule) refill() {
	x.mu.Lock()
	need := x.spare == nil
	x.mu.Unlock()
	if !need {
		return
	}
	to := x.px % x.c.Size()
	px := etcdtest.NewProxy(x.t, x.c.Endpoint(to))
	x.px++
	x.mu.Lock()
	x.spare, x.spareTo = px, to
	x.mu.Unlock()
}

// join starts a replica, on the spare proxy; it returns nil if there is
// none, or its session could not be made.
func (x *shardSchedule) join(why string) *shardReplica {
	x.mu.Lock()
	px, to := x.spare, x.spareTo
	x.spare = nil
	id := x.nextID
	if px != nil {
		x.nextID++
	}
	x.mu.Unlock()
	if px == nil {
		x.logf("  (no proxy for a replica to join)")
		return nil
	}
	r := &shardReplica{id: id, x: x, in: &etcdtest.Injector{}, px: px, done: make(chan struct{}), fail: make(chan struct{}), calls: map[int]int{}}
	var err error
	// Everything the replica starts carries the schedule's label: a
	// goroutine of it left at the end leaked.
	pprof.Do(x.ctx, pprof.Labels(shardLabel, x.name), func(context.Context) {
		r.cli, err = x.c.NewClient(clientv3.Config{Endpoints: []string{px.URL()}, DialOptions: r.in.DialOptions()})
		if err != nil {
			return
		}
		for try := range 5 {
			ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
			r.s, err = etcdlock.NewSession(ctx, r.cli, etcdlock.WithTTL(shardTTL))
			cancel()
			if err == nil {
				break
			}
			time.Sleep(time.Duration(50<<try) * time.Millisecond)
		}
		if err != nil {
			r.cli.Close()
			return
		}
		ctx, cancel := context.WithCancel(x.ctx)
		r.cancel = cancel
		go r.run(ctx)
		go func() {
			select {
			case <-r.s.Done():
				x.mu.Lock()
				if r.ended.IsZero() {
					r.ended = time.Now()
				}
				x.mu.Unlock()
			case <-r.done:
			}
		}()
	})
	if err != nil {
		x.logf("  (%s: a replica could not join: %v)", why, err)
		px.Close()
		return nil
	}
	x.mu.Lock()
	x.reps = append(x.reps, r)
	x.mu.Unlock()
	x.logf("  %s: r%d joins, lease %x, through a proxy to m%d", why, r.id, int64(r.s.Lease()), to)
	return r
}

// run is the replica's RunShards.
func (r *shardReplica) run(ctx context.Context) {
	err := etcdlock.RunShards(ctx, r.s, r.x.name, r.x.n, r.fn)
	r.x.runReturned(r, err)
	close(r.done)
}

// fn is the replica's fn: it runs until its ctx ends, mostly. Some calls
// return nil early (RunShards calls fn again), some return late after
// their ctx ended (the shard stays theirs until then), and once the
// replica fails, they return errShardFn.
func (r *shardReplica) fn(ctx context.Context, sh etcdlock.Shard) error {
	x := r.x
	c := x.started(r, sh)
	stop := context.AfterFunc(ctx, func() {
		x.mu.Lock()
		c.ctxEnded = time.Now()
		x.mu.Unlock()
	})
	defer stop()
	x.checkStart(c, sh)
	draw := x.callDraw(r.id, sh.Num, c.call)
	var early <-chan time.Time
	x.mu.Lock()
	settling := x.settling
	x.mu.Unlock()
	if draw%5 == 0 && !settling {
		tm := time.NewTimer(time.Duration(20+draw%200) * time.Millisecond)
		defer tm.Stop()
		early = tm.C
	}
	err := error(nil)
	select {
	case <-ctx.Done():
		if draw%7 == 3 {
			time.Sleep(time.Duration(300+draw%1200) * time.Millisecond)
		}
	case <-early:
	case <-r.fail:
		err = errShardFn
	}
	x.mu.Lock()
	c.done = true
	x.version++
	x.mu.Unlock()
	x.logf("  r%d: fn of shard %d returns %v (token %d, call %d)", r.id, sh.Num, err, sh.Token, c.call)
	x.signal()
	return err
}

// callDraw draws a fn call's behaviour from the seed, the replica, the
// shard and the call's number: the same on every run of the seed.
func (x *shardSchedule) callDraw(rep, shard, call int) int {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d/%d", x.seed, rep, shard, call)
	return int(h.Sum64() % 1000)
}

// started writes a fn call in the book.
func (x *shardSchedule) started(r *shardReplica, sh etcdlock.Shard) *shardCall {
	x.mu.Lock()
	r.calls[sh.Num]++
	c := &shardCall{rep: r, shard: sh.Num, key: sh.Key(), token: sh.Token, call: r.calls[sh.Num], started: time.Now()}
	x.calls = append(x.calls, c)
	x.version++
	x.st.starts++
	x.logLocked("  r%d: fn of shard %d starts: key %s, token %d, call %d", r.id, sh.Num, suffix(c.key), c.token, c.call)
	x.mu.Unlock()
	x.signal()
	return c
}

func suffix(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }

// running returns the fn calls that have not returned, of shard (all
// shards if shard < 0).
func (x *shardSchedule) running(shard int) []*shardCall {
	x.mu.Lock()
	defer x.mu.Unlock()
	var cs []*shardCall
	for _, c := range x.calls {
		if !c.done && (shard < 0 || c.shard == shard) {
			cs = append(cs, c)
		}
	}
	return cs
}

// checkStart checks a fn's start against etcd: its shard's queue, with
// the shard's IsOwner, at one revision.
func (x *shardSchedule) checkStart(c *shardCall, sh etcdlock.Shard) {
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	// The calls running now, this one among them: those still running
	// once etcd answered were running at the revision read.
	running := x.running(c.shard)
	get := clientv3.OpGet(shardName(x.name, c.shard)+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	resp, err := x.admin.Txn(ctx).If(sh.IsOwner()).Then(get).Else(get).Commit()
	if err != nil {
		x.logf("  (check of r%d's start of shard %d failed: %v)", c.rep.id, c.shard, err)
		return
	}
	x.judge(ctx, fmt.Sprintf("r%d's fn start of shard %d", c.rep.id, c.shard), resp.Header.Revision, resp.Responses[0].GetResponseRange().Kvs, running, c, resp.Succeeded)
}

func shardName(name string, i int) string { return name + "/" + strconv.Itoa(i) }

// shardOf returns the shard whose queue key is key, or -1.
func (x *shardSchedule) shardOf(key string) int {
	name, ok := etcdlock.LockOfKey(key)
	if !ok {
		return -1
	}
	rest, ok := strings.CutPrefix(name, x.name+"/")
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= x.n {
		return -1
	}
	return i
}

// judge checks the calls running (taken before the read) against the
// keys read at rev (oldest first): each whose key is in etcd, with the
// create revision it had, must be the oldest key of its shard's queue
// (which no other call's key then is); one whose key
// is gone lost it, to its lease's end or to the explorer. start is the
// call whose start is checked, and owner whether its IsOwner held.
func (x *shardSchedule) judge(ctx context.Context, where string, rev int64, kvs []*mvccpb.KeyValue, running []*shardCall, start *shardCall, owner bool) {
	queues := map[int][]*mvccpb.KeyValue{}
	for _, kv := range kvs {
		if i := x.shardOf(string(kv.Key)); i >= 0 {
			queues[i] = append(queues[i], kv)
		}
	}
	var gone []*shardCall
	x.mu.Lock()
	for _, c := range running {
		if c.done {
			continue // it may have released since
		}
		q := queues[c.shard]
		at := slices.IndexFunc(q, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == c.key })
		if at >= 0 && (c.created == 0 || c.created == q[at].CreateRevision) {
			c.created = q[at].CreateRevision
			if at > 0 {
				if c.overlap {
					continue // reported
				}
				c.overlap = true
				x.violationLocked("%s (rev %d): r%d's fn of shard %d runs (key %s created at %d, token %d, call %d), but its key is not the oldest of the shard's queue %s",
					where, rev, c.rep.id, c.shard, suffix(c.key), c.created, c.token, c.call, queueOf(q))
				continue
			}
			x.owned(where, c, rev)
			if c == start && !owner {
				x.violationLocked("%s (rev %d): r%d holds shard %d (key %s created at %d), but the Shard's IsOwner fails", where, rev, c.rep.id, c.shard, suffix(c.key), c.created)
			}
			continue
		}
		if c.lostAt.IsZero() {
			c.lostAt, c.lostRev = time.Now(), rev
			x.st.lost++
			x.logLocked("  %s: r%d's key %s of shard %d (token %d) is gone at rev %d", where, c.rep.id, suffix(c.key), c.shard, c.token, rev)
			gone = append(gone, c)
		}
	}
	x.mu.Unlock()
	for _, c := range gone {
		x.explainGone(ctx, where, c)
	}
}

// queueOf writes a queue's keys: suffix@create revision, oldest first.
func queueOf(q []*mvccpb.KeyValue) string {
	var b strings.Builder
	for _, kv := range q {
		fmt.Fprintf(&b, " %s@%d", suffix(string(kv.Key)), kv.CreateRevision)
	}
	return "[" + strings.TrimSpace(b.String()) + "]"
}

// owned takes in a hold checked current in etcd at rev: its token must be
// above those of every hold of the shard with an older key, below those
// with a newer one, and the same as before within the hold.
func (x *shardSchedule) owned(where string, c *shardCall, rev int64) {
	hs := x.owners[c.shard]
	if hs == nil {
		hs = map[int64]*shardCall{}
		x.owners[c.shard] = hs
	}
	if o, ok := hs[c.created]; ok {
		if o.token != c.token {
			x.violationLocked("%s (rev %d): shard %d: r%d's hold (key %s created at %d) had token %d, now %d", where, rev, c.shard, c.rep.id, suffix(c.key), c.created, o.token, c.token)
		}
		return
	}
	x.st.verified++
	newest := int64(0)
	for created, o := range hs {
		if created < c.created && o.token >= c.token || created > c.created && o.token <= c.token {
			x.violationLocked("%s (rev %d): shard %d: r%d's hold (key created at %d) has token %d, r%d's (key created at %d) token %d: tokens do not rise from owner to owner",
				where, rev, c.shard, c.rep.id, c.created, c.token, o.rep.id, created, o.token)
		}
		if created < c.created && created > newest {
			newest = created
		}
	}
	if o := hs[newest]; o != nil && o.rep != c.rep {
		x.st.handovers++
	}
	hs[c.created] = c
}

// explainGone checks that c's key, found gone while c's fn runs, went by
// its lease's end or by the explorer: nothing else deletes the key of a
// hold whose fn has not returned (its release comes after). Another
// replica that deleted it would have taken the shard too early.
func (x *shardSchedule) explainGone(ctx context.Context, where string, c *shardCall) {
	x.mu.Lock()
	deleted := x.deleted[c.key]
	x.mu.Unlock()
	if deleted {
		return
	}
	resp, err := x.admin.TimeToLive(ctx, c.rep.s.Lease())
	if err != nil {
		x.logf("  (could not read r%d's lease: %v)", c.rep.id, err)
		return
	}
	if resp.TTL == -1 {
		return // the lease ended (its keys went with it), or was revoked
	}
	x.violation("%s: r%d's key %s of shard %d (token %d) is gone at rev %d while its fn runs, and its lease %x lives (TTL %ds): neither the lease's end nor the explorer removed it",
		where, c.rep.id, suffix(c.key), c.shard, c.token, c.lostRev, int64(c.rep.s.Lease()), resp.TTL)
}

// check checks every fn running against etcd at one revision, and the
// bounds on losses and returns.
func (x *shardSchedule) check(where string) {
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	running := x.running(-1)
	resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		x.logf("  (check %s failed: %v)", where, err)
	} else {
		x.judge(ctx, where, resp.Header.Revision, resp.Kvs, running, nil, true)
	}
	x.checkLost(lossBound)
	x.checkReturns()
}

// checkLost reports a fn whose key the checker found gone more than bound
// ago and whose ctx has not ended.
func (x *shardSchedule) checkLost(bound time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, c := range x.calls {
		if c.lostAt.IsZero() || !c.ctxEnded.IsZero() || c.done || c.reported || time.Since(c.lostAt) <= bound {
			continue
		}
		c.reported = true
		x.violationLocked("r%d's fn of shard %d (key %s, token %d): its key is gone since %v (rev %d), and its ctx has not ended",
			c.rep.id, c.shard, suffix(c.key), c.token, time.Since(c.lostAt).Round(time.Millisecond), c.lostRev)
	}
}

// checkReturns reports a RunShards that has not returned returnBound
// after its ctx or its session ended.
func (x *shardSchedule) checkReturns() {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, r := range x.reps {
		if r.ended.IsZero() || !r.returned.IsZero() || r.late || time.Since(r.ended) <= returnBound {
			continue
		}
		r.late = true
		x.violationLocked("r%d's RunShards has not returned %v after %s\n%s", r.id, time.Since(r.ended).Round(time.Millisecond), r.endedWhy(), shardStacks(x.name))
	}
}

func (r *shardReplica) endedWhy() string {
	switch {
	case r.why != "":
		return "it was " + strings.TrimPrefix(r.why, ", ")
	case r.s.Err() != nil:
		return "its session ended: " + r.s.Err().Error()
	}
	return "nothing ended it"
}

// runReturned checks what RunShards returned: only once every fn it
// called has returned, nil after its ctx ended, else the error that
// ended it.
func (x *shardSchedule) runReturned(r *shardReplica, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r.err, r.returned = err, time.Now()
	x.version++
	if r.ended.IsZero() {
		r.ended = r.returned
	}
	x.logLocked("  r%d: RunShards returned %v", r.id, err)
	for _, c := range x.calls {
		if c.rep == r && !c.done {
			x.violationLocked("r%d's RunShards returned (%v) while its fn of shard %d (token %d, call %d) runs", r.id, err, c.shard, c.token, c.call)
		}
	}
	// An error is explained by a cause the explorer made: a fn that
	// failed, a crash, the session's end, the membership key deleted.
	// The loop may meet one before the ctx ends and return it after.
	serr := r.s.Err()
	explained := r.failed && errors.Is(err, errShardFn) || r.crashed || serr != nil ||
		r.unmember && errors.Is(err, etcdlock.ErrLockLost)
	switch {
	case err == nil && !r.left:
		x.violationLocked("r%d's RunShards returned nil while its ctx lasts", r.id)
	case err != nil && !explained && r.left:
		x.violationLocked("r%d's RunShards returned %v after its ctx ended: want nil", r.id, err)
	case err != nil && !explained:
		x.violationLocked("r%d's RunShards returned %v, while its ctx, session and fns were fine (done to it: %q)", r.id, err, r.why)
	}
	x.signal()
}

// The draws of one step: made in full whatever happens, so that a seed
// makes the same choices on every run.
type shardDraws struct {
	act, pick, pick2, dur int
	inject                bool
	target, k, kind       int
	ipick, ipick2         int
}

func (x *shardSchedule) draw() shardDraws {
	r := x.rng
	return shardDraws{
		act: r.IntN(100), pick: r.IntN(1000), pick2: r.IntN(1000), dur: r.IntN(1000),
		// Early RPCs most: a replica that reacts to a change makes a few.
		inject: r.IntN(10) < 7, target: r.IntN(1000), k: []int{1, 1, 2, 2, 3, 4}[r.IntN(6)], kind: r.IntN(100),
		ipick: r.IntN(1000), ipick2: r.IntN(1000),
	}
}

// live returns the replicas that run and that the explorer has not ended.
func (x *shardSchedule) live() []*shardReplica {
	x.mu.Lock()
	defer x.mu.Unlock()
	var rs []*shardReplica
	for _, r := range x.reps {
		if r.returned.IsZero() && !r.left && !r.crashed {
			rs = append(rs, r)
		}
	}
	return rs
}

// mark records what the explorer did to r.
func (x *shardSchedule) mark(r *shardReplica, what string, set func()) {
	x.mu.Lock()
	defer x.mu.Unlock()
	set()
	r.why += ", " + what
	if (r.left || r.crashed) && r.ended.IsZero() {
		r.ended = time.Now()
	}
}

// step runs one step: something happens to one replica, with a fault
// armed at a chosen RPC of one.
func (x *shardSchedule) step(step int) {
	x.refill()
	d := x.draw()
	live := x.live()
	if len(live) == 0 {
		x.logf("step %d: nobody runs", step)
		x.join(fmt.Sprintf("step %d", step))
		x.quiet()
		return
	}
	r := live[d.pick%len(live)]
	if d.inject {
		target := live[d.target%len(live)]
		x.arm(step, target, d)
	}
	switch {
	case d.act < 22:
		if len(live) >= shardMaxLive {
			x.logf("step %d: (%d replicas run: none joins)", step, len(live))
			break
		}
		x.logf("step %d: a replica joins", step)
		x.join(fmt.Sprintf("step %d", step))
	case d.act < 36:
		x.logf("step %d: r%d leaves", step, r.id)
		x.leave(r)
	case d.act < 41:
		x.logf("step %d: r%d crashes: its session orphaned", step, r.id)
		x.mark(r, "orphaned", func() { r.crashed = true })
		r.s.Orphan()
	case d.act < 46:
		x.mark(r, "revoked", func() { r.crashed = true })
		ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
		_, err := x.admin.Revoke(ctx, r.s.Lease())
		cancel()
		x.logf("step %d: r%d crashes: its lease revoked: %v", step, r.id, err)
	case d.act < 50:
		x.logf("step %d: r%d crashes: its client closed", step, r.id)
		x.mark(r, "closed", func() { r.crashed = true })
		r.cli.Close()
	case d.act < 58:
		x.logf("step %d: r%d is cut off: its link paused", step, r.id)
		x.pause(r)
	case d.act < 61:
		x.logf("step %d: r%d is cut off for good", step, r.id)
		x.cutOff(r)
	case d.act < 68:
		late := time.Duration(100+d.dur) * time.Millisecond
		x.logf("step %d: r%d's answers come %v late", step, r.id, late)
		x.mark(r, "delayed", func() { r.delayed = true })
		r.px.DelayAnswers(late)
	case d.act < 80:
		x.heal(step, d.pick2)
	case d.act < 84:
		x.logf("step %d: r%d's fns fail", step, r.id)
		x.mark(r, "failing", func() {
			if !r.failed {
				r.failed = true
				close(r.fail)
			}
		})
	default:
		x.logf("step %d: a TTL passes", step)
		time.Sleep(shardTTL)
	}
	x.quiet()
	for _, r := range x.reps {
		r.in.Disarm()
	}
}

func (x *shardSchedule) leave(r *shardReplica) {
	x.mark(r, "left", func() { r.left = true })
	r.cancel()
}

func (x *shardSchedule) pause(r *shardReplica) {
	x.mark(r, "paused", func() { r.paused = true })
	r.px.PauseTx()
	r.px.PauseRx()
}

func (x *shardSchedule) cutOff(r *shardReplica) {
	x.mark(r, "cut", func() { r.cut, r.crashed = true, true })
	r.px.Cut()
}

// heal heals the link of a replica partitioned or late (not cut): the
// pick'th such, in order.
func (x *shardSchedule) heal(step, pick int) {
	x.mu.Lock()
	var rs []*shardReplica
	for _, r := range x.reps {
		if (r.paused || r.delayed) && !r.cut && r.returned.IsZero() {
			rs = append(rs, r)
		}
	}
	x.mu.Unlock()
	if len(rs) == 0 {
		x.logf("step %d: (nothing to heal)", step)
		return
	}
	r := rs[pick%len(rs)]
	x.logf("step %d: r%d's link heals", step, r.id)
	x.healLink(r)
}

func (x *shardSchedule) healLink(r *shardReplica) {
	x.mu.Lock()
	paused, delayed := r.paused, r.delayed
	r.paused, r.delayed = false, false
	x.mu.Unlock()
	if paused {
		r.px.UnpauseTx()
		r.px.UnpauseRx()
	}
	if delayed {
		r.px.DelayAnswers(0)
	}
}

// quiet waits until no replica has made an RPC and no fn has started or
// returned for 100ms, or 3s.
func (x *shardSchedule) quiet() {
	count := func() int64 {
		x.mu.Lock()
		defer x.mu.Unlock()
		n := int64(x.version)
		for _, r := range x.reps {
			n += r.in.Count()
		}
		return n
	}
	deadline := time.Now().Add(3 * time.Second)
	last, still := count(), 0
	for time.Now().Before(deadline) && still < 10 {
		time.Sleep(10 * time.Millisecond)
		if n := count(); n != last {
			last, still = n, 0
			continue
		}
		still++
	}
}

// An injection kind: what the explorer does at the chosen RPC.
const (
	shInjJoin      = iota // another replica joins
	shInjLeave            // a replica leaves
	shInjDelKey           // a shard's key deleted: mostly the target's own
	shInjDelMember        // a membership key deleted: mostly the target's own
	shInjRevoke           // a replica's lease revoked
	shInjForeign          // a foreign key in a shard's queue, or among the members
	shInjUnforeign        // a foreign key removed
	shInjCompact          // a compaction
	shInjDrop             // the answer lost, once etcd applied the request
	shInjFail             // the request failed, not applied
	shInjPause            // the target's link paused, its request held
	shInjCut              // the target's link cut for good
	shInjMove             // etcd's leader moved (three members)
)

var shInjNames = []string{"a replica joining", "a replica leaving", "a shard's key deleted", "a member's key deleted", "a lease revoked",
	"a foreign key", "a foreign key removed", "a compaction", "the answer lost", "the request failed", "the link paused", "the link cut",
	"the leader moved"}

// shInjKind maps a draw to a kind: weights out of 100.
func (x *shardSchedule) shInjKind(draw int) int {
	table := []struct{ kind, weight int }{
		{shInjJoin, 10}, {shInjLeave, 8}, {shInjDelKey, 14}, {shInjDelMember, 5}, {shInjRevoke, 5}, {shInjForeign, 7},
		{shInjUnforeign, 6}, {shInjCompact, 6}, {shInjDrop, 14}, {shInjFail, 12}, {shInjPause, 6}, {shInjCut, 2}, {shInjMove, 5},
	}
	for _, e := range table {
		if draw < e.weight {
			if e.kind == shInjMove && x.c.Size() < 3 {
				return shInjDrop
			}
			return e.kind
		}
		draw -= e.weight
	}
	return shInjDrop
}

// arm arms a fault at target's k-th RPC (unary calls and watch requests;
// lease renewals do not count).
func (x *shardSchedule) arm(step int, target *shardReplica, d shardDraws) {
	kind := x.shInjKind(d.kind)
	x.logf("step %d: inject %s at r%d's RPC %d", step, shInjNames[kind], target.id, d.k)
	match := etcdtest.Nth(d.k, injectable)
	act := etcdtest.Action{}
	switch kind {
	case shInjDrop:
		act = lostAnswer(func(m string) { x.fault("  at r%d's %s: its answer lost", target.id, m) })
	case shInjFail:
		act = failedCall(d.ipick2, func(m string) { x.fault("  at r%d's %s: it fails", target.id, m) })
	default:
		act.Before = func(r etcdtest.RPC) {
			x.fault("  at r%d's %s:", target.id, short(r.Method))
			x.inject(kind, target, d)
		}
	}
	target.in.At(match, act)
}

// fault logs a fault as it is injected, and counts it.
func (x *shardSchedule) fault(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.st.faults++
	x.logLocked(format, args...)
}

// inject does kind, at target's RPC.
func (x *shardSchedule) inject(kind int, target *shardReplica, d shardDraws) {
	x.injecting.RLock()
	defer x.injecting.RUnlock()
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	switch kind {
	case shInjJoin:
		if len(x.live()) >= shardMaxLive {
			x.logf("    (%d replicas run: none joins)", shardMaxLive)
			return
		}
		if r := x.join("    injected"); r != nil {
			x.awaitMember(ctx, r)
		}
	case shInjLeave:
		live := x.live()
		if len(live) == 0 {
			x.logf("    (no replica runs)")
			return
		}
		r := live[d.ipick%len(live)]
		x.logf("    r%d leaves", r.id)
		x.leave(r)
	case shInjDelKey:
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			x.logf("    (read: %v)", err)
			return
		}
		var own, all []string
		for _, kv := range resp.Kvs {
			if x.shardOf(string(kv.Key)) >= 0 {
				all = append(all, string(kv.Key))
				if kv.Lease == int64(target.s.Lease()) {
					own = append(own, string(kv.Key))
				}
			}
		}
		if d.ipick%3 != 0 && len(own) > 0 {
			all = own
		}
		if len(all) == 0 {
			x.logf("    (no shard key to delete)")
			return
		}
		key := all[d.ipick2%len(all)]
		x.mu.Lock()
		x.deleted[key] = true
		x.mu.Unlock()
		_, err = x.admin.Delete(ctx, key)
		x.logf("    delete %s: %v", strings.TrimPrefix(key, x.name+"/"), err)
	case shInjDelMember:
		resp, err := x.admin.Get(ctx, x.name+"/members/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) == 0 {
			x.logf("    (no member key to delete: %v)", err)
			return
		}
		kv := resp.Kvs[d.ipick2%len(resp.Kvs)]
		if d.ipick%3 != 0 {
			if i := slices.IndexFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return kv.Lease == int64(target.s.Lease()) }); i >= 0 {
				kv = resp.Kvs[i]
			}
		}
		for _, r := range x.snapshot() {
			if int64(r.s.Lease()) == kv.Lease {
				x.mark(r, "unmembered", func() { r.unmember = true })
			}
		}
		_, err = x.admin.Delete(ctx, string(kv.Key))
		x.logf("    delete %s: %v", strings.TrimPrefix(string(kv.Key), x.name+"/"), err)
	case shInjRevoke:
		live := x.live()
		if len(live) == 0 {
			x.logf("    (no replica runs)")
			return
		}
		r := live[d.ipick%len(live)]
		x.mark(r, "revoked", func() { r.crashed = true })
		_, err := x.admin.Revoke(ctx, r.s.Lease())
		x.logf("    revoke r%d's lease %x: %v", r.id, int64(r.s.Lease()), err)
	case shInjForeign:
		x.mu.Lock()
		var key, val string
		switch {
		case d.ipick%4 != 0:
			key = fmt.Sprintf("%s/f%d", shardName(x.name, d.ipick2%x.n), len(x.foreign))
		case d.ipick%8 == 0:
			key = fmt.Sprintf("%s/members/f%d", x.name, len(x.foreign)) // a writer: joiners wait behind it
		default:
			key, val = fmt.Sprintf("%s/members/f%d", x.name, len(x.foreign)), "etcdlock/1 shared" // a member nobody runs
		}
		x.foreign = append(x.foreign, key)
		x.mu.Unlock()
		_, err := x.admin.Put(ctx, key, val, clientv3.WithLease(x.fLease))
		x.logf("    put foreign %s %q: %v", strings.TrimPrefix(key, x.name+"/"), val, err)
	case shInjUnforeign:
		x.mu.Lock()
		var key string
		if len(x.foreign) > 0 {
			i := d.ipick2 % len(x.foreign)
			key = x.foreign[i]
			x.foreign = append(x.foreign[:i:i], x.foreign[i+1:]...)
		}
		x.mu.Unlock()
		if key != "" {
			_, err := x.admin.Delete(ctx, key)
			x.logf("    delete foreign %s: %v", strings.TrimPrefix(key, x.name+"/"), err)
		}
	case shInjCompact:
		resp, err := x.admin.Get(ctx, "explore-probe")
		if err != nil {
			x.logf("    (read: %v)", err)
			return
		}
		_, err = x.admin.Compact(ctx, resp.Header.Revision)
		x.logf("    compact at %d: %v", resp.Header.Revision, err)
	case shInjPause:
		x.logf("    r%d's link paused", target.id)
		x.pause(target)
	case shInjCut:
		x.logf("    r%d's link cut for good", target.id)
		x.cutOff(target)
	case shInjMove:
		to := d.ipick2 % x.c.Size()
		err := x.c.MoveLeader(ctx, to)
		x.logf("    move etcd's leader to m%d: %v", to, err)
	}
}

// snapshot returns every replica made so far.
func (x *shardSchedule) snapshot() []*shardReplica {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.reps)
}

// awaitMember waits until r's membership key is in etcd (or r returned),
// so that the fault a join injects is there when the RPC goes on.
func (x *shardSchedule) awaitMember(ctx context.Context, r *shardReplica) {
	for ctx.Err() == nil {
		resp, err := x.admin.Get(ctx, x.name+"/members/", clientv3.WithPrefix())
		if err == nil && slices.ContainsFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return kv.Lease == int64(r.s.Lease()) }) {
			return
		}
		select {
		case <-r.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// teardown stops the faults, waits for the shards to settle and checks
// their spread, then has every replica leave and checks that RunShards
// returns, leaving nothing held and no goroutine behind.
func (x *shardSchedule) teardown() {
	for _, r := range x.snapshot() {
		r.in.Disarm()
	}
	injected := make(chan struct{})
	go func() {
		x.injecting.Lock()
		x.injecting.Unlock()
		close(injected)
	}()
	select {
	case <-injected:
	case <-time.After(2 * time.Minute):
		x.violation("an injection did not finish within 2 minutes\n%s", shardStacks(""))
	}
	for _, r := range x.snapshot() {
		r.in.Disarm()
		x.healLink(r)
	}
	ctx, cancel := context.WithTimeout(x.ctx, 20*time.Second)
	defer cancel()
	x.mu.Lock()
	x.foreign = nil
	x.settling = true
	x.mu.Unlock()
	_, err := x.admin.Revoke(ctx, x.fLease)
	x.logf("end: faults stopped, links healed, foreign keys removed: %v", err)

	x.settle()
	x.check("settled")

	for _, r := range x.live() {
		x.leave(r)
	}
	for _, r := range x.snapshot() {
		x.mu.Lock()
		ended := r.ended
		x.mu.Unlock()
		select {
		case <-r.done:
		case <-time.After(time.Until(ended.Add(returnBound))):
			x.checkReturns()
			r.cli.Close() // a Get that waits for a link cut for good
			<-r.done
		}
	}
	x.check("at the end")
	x.checkLost(0)

	// RunShards returned, and released what it held: no key of a
	// session that lives is left.
	live := map[int64]int{}
	for _, r := range x.snapshot() {
		if r.s.Err() == nil {
			live[int64(r.s.Lease())] = r.id
		}
	}
	var left []string
	for ctx.Err() == nil {
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix())
		left = left[:0]
		if err == nil {
			for _, kv := range resp.Kvs {
				if id, ok := live[kv.Lease]; ok {
					left = append(left, fmt.Sprintf("%s (r%d)", strings.TrimPrefix(string(kv.Key), x.name+"/"), id))
				}
			}
			if len(left) == 0 {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) > 0 {
		x.violation("20s after every RunShards returned, keys of live sessions are left: %v", left)
	}

	for _, r := range x.snapshot() {
		r.s.Orphan()
		rctx, rcancel := context.WithTimeout(x.ctx, 5*time.Second)
		x.admin.Revoke(rctx, r.s.Lease())
		rcancel()
		r.cli.Close()
		r.px.Close()
	}
	x.mu.Lock()
	if x.spare != nil {
		x.spare.Close()
		x.spare = nil
	}
	x.mu.Unlock()
	x.cancel()
	x.admin.Delete(context.Background(), x.name+"/", clientv3.WithPrefix())
	x.admin.Close() // its connection may have been made in a replica's goroutine
	// Nothing a replica started outlives it.
	for i := 0; ; i++ {
		st := shardStacks(x.name)
		if st == "" {
			break
		}
		if i == 400 {
			x.violation("goroutines of the schedule's replicas left 20s after every RunShards returned and its client closed:\n%s", st)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// settle waits for the replicas the explorer ended to return, then for
// the shards to spread over the rest, and reports it if they do not.
func (x *shardSchedule) settle() {
	start := time.Now()
	for _, r := range x.snapshot() {
		x.mu.Lock()
		ended := r.ended
		x.mu.Unlock()
		if ended.IsZero() {
			continue
		}
		select {
		case <-r.done:
		case <-time.After(time.Until(ended.Add(returnBound))):
			x.checkReturns()
		}
	}
	start2 := time.Now()
	deadline := start2.Add(settleBound)
	for {
		// A replica whose fns fail ends once it gets a shard: with
		// nobody left, one joins, as a deployment would start one.
		if !slices.ContainsFunc(x.snapshot(), func(r *shardReplica) bool { return !closed(r.done) && r.s.Err() == nil }) {
			x.refill()
			x.join("end: nobody runs")
		}
		ok, state := x.spread()
		if ok {
			x.logf("end: settled in %v (%v since the replicas ended returned): %s", time.Since(start).Round(time.Millisecond), time.Since(start2).Round(time.Millisecond), state)
			x.mu.Lock()
			x.st.settled = time.Since(start2)
			x.mu.Unlock()
			return
		}
		if time.Now().After(deadline) {
			x.violation("the shards did not settle within %v of the faults' end: %s", settleBound, state)
			return
		}
		select {
		case <-x.changed:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// spread reports whether the shards are spread as promised: each member
// (a key under name/members) is a replica that runs, each replica that
// runs is a member, each shard's key first in line is a member's and its
// fn runs there alone, and each member runs ⌊n/m⌋ or ⌈n/m⌉ shards. It
// says what it saw.
func (x *shardSchedule) spread() (bool, string) {
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return false, err.Error()
	}
	running := x.running(-1)
	// The replicas that run: RunShards has not returned, and the session
	// lives (one whose session ended and that has not returned is
	// reported by checkReturns, not here).
	byLease := map[int64]*shardReplica{}
	for _, r := range x.snapshot() {
		select {
		case <-r.done:
		default:
			if r.s.Err() == nil {
				byLease[int64(r.s.Lease())] = r
			}
		}
	}
	members := map[*shardReplica]int{}
	queues := map[int][]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		if name, _ := etcdlock.LockOfKey(string(kv.Key)); name == x.name+"/members" {
			r := byLease[kv.Lease]
			if r == nil {
				return false, fmt.Sprintf("rev %d: member key %s is no running replica's", resp.Header.Revision, suffix(string(kv.Key)))
			}
			members[r] = 0
		} else if i := x.shardOf(string(kv.Key)); i >= 0 {
			queues[i] = append(queues[i], kv)
		}
	}
	for _, r := range byLease {
		if _, ok := members[r]; !ok {
			return false, fmt.Sprintf("rev %d: r%d runs but has no member key", resp.Header.Revision, r.id)
		}
	}
	for i := range x.n {
		q := queues[i]
		if len(q) == 0 {
			return false, fmt.Sprintf("rev %d: shard %d has no key", resp.Header.Revision, i)
		}
		r := byLease[q[0].Lease]
		if _, ok := members[r]; !ok {
			return false, fmt.Sprintf("rev %d: shard %d's first key %s is no member's", resp.Header.Revision, i, suffix(string(q[0].Key)))
		}
		var on []string
		for _, c := range running {
			if c.shard == i {
				on = append(on, fmt.Sprintf("r%d", c.rep.id))
			}
		}
		if len(on) != 1 || on[0] != fmt.Sprintf("r%d", r.id) {
			return false, fmt.Sprintf("rev %d: shard %d is held by r%d, its fn runs on %v", resp.Header.Revision, i, r.id, on)
		}
		members[r]++
	}
	m := len(members)
	lo, hi := x.n/m, (x.n+m-1)/m
	var b strings.Builder
	ok := true
	for _, r := range x.snapshot() {
		if k, member := members[r]; member {
			fmt.Fprintf(&b, " r%d:%d", r.id, k)
			ok = ok && k >= lo && k <= hi
		}
	}
	return ok, fmt.Sprintf("rev %d: %d shards over %d members (%d to %d each):%s", resp.Header.Revision, x.n, m, lo, hi, b.String())
}

// shardStacks returns the stacks of the goroutines labelled with the
// schedule name (every goroutine, when name is empty).
func shardStacks(name string) string {
	if name == "" {
		return stacks()
	}
	var buf bytes.Buffer
	pprof.Lookup("goroutine").WriteTo(&buf, 1)
	want := fmt.Sprintf("%q:%q", shardLabel, name)
	var out []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, want) {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
