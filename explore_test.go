package etcdlock_test

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The schedule explorer: a few actors, each with a client and session of
// its own, run random operations of one primitive on one lock, and at a
// random RPC of a random actor the explorer injects a fault: another
// actor's operation, a foreign key under the name (direct or nested,
// alone or several in one Txn), the deletion of a queue key, a revoked
// lease, a compaction, a lost answer or a failed request, and on three
// members a leader moved or stopped. After every step it checks what the
// actors believe against etcd itself, at one revision:
//
//   - every hold an actor believes it has (its acquisition returned nil,
//     it has not released it, its Done is open) whose key still exists is
//     one that etcd's queue admits (Holders), in one Txn with all their
//     IsOwner comparisons: no two exclusive holders, no reader with a
//     writer, no permits above the capacity, no two believers of one key;
//   - a hold whose key is gone has its Done closed within 10s;
//   - a failed acquisition leaves no key of the actor's session;
//   - every Leader that Observe yields was the election's state at its
//     revision, in increasing revisions;
//   - at the end, once every actor has released what it believed it held,
//     ignoring release errors as a careless caller would, no key of a live
//     session is left: nothing stays held for good.
//
// A schedule is drawn from its seed: the same seed makes the same
// choices (how etcd and the Go scheduler interleave them still varies).
// A failure prints the seed and the schedule; run it again with
//
//	go test -run 'TestExplore/Mutex$' -explore.seed=SEED -v .
//
// The short mode runs a fixed set of seeds per primitive; -explore.for
// runs seed after seed for as long as asked (before a release: an hour,
// with -explore.members=3 too).
var (
	exploreSeeds   = flag.Int("explore.seeds", 0, "schedules per primitive (0: the short mode's count)")
	exploreSeed    = flag.Uint64("explore.seed", 0, "explore this seed only")
	exploreFor     = flag.Duration("explore.for", 0, "long mode: explore each primitive for this long")
	exploreSteps   = flag.Int("explore.steps", 24, "steps per schedule")
	exploreMembers = flag.Int("explore.members", 0, "long mode: cluster size (1 or 3; 0: both in short mode, 1 in long)")
	exploreVerbose = flag.Bool("explore.log", false, "log every schedule, not only failing ones")
)

// prim is what every primitive has.
type prim interface {
	etcdlock.Hooked
	Key() string
	Token() int64
	Done() <-chan struct{}
	Err() error
	ReleaseRequested() <-chan struct{}
}

// primKeys returns every key of p's holds: a MultiMutex's keys, or its Key.
func primKeys(p prim) []string {
	if m, ok := p.(interface{ Keys() []string }); ok {
		return m.Keys()
	}
	return []string{p.Key()}
}

// explMulti is a MultiMutex as a prim: its Key is its first.
type explMulti struct{ *etcdlock.MultiMutex }

func (m explMulti) Key() string { return m.Keys()[0] }

// setLocker is what the MultiMutex schedules' actors run: a MultiMutex,
// or a Mutex on one of its names.
type setLocker interface {
	Lock(ctx context.Context) error
	TryLock(ctx context.Context) error
	Unlock(ctx context.Context) error
	Do(ctx context.Context, fn func(ctx context.Context) error) error
}

// An exploreOp is one operation an actor can run. arg is drawn for it: a
// weight, a value, a timeout.
type exploreOp struct {
	name    string
	acquire bool // takes a hold: nil makes the actor a believer
	release bool // gives the hold up: the actor stops believing as it calls
	run     func(ctx context.Context, a *actor, arg int) error
}

// An exploreKind is a primitive as the explorer drives it.
type exploreKind struct {
	name string
	// mk makes actor id's lock on name (whose names are names(name)).
	mk  func(s *etcdlock.Session, name string, id int) prim
	ops []exploreOp
	// names are the lock names of a schedule on name, whose queues the
	// checker reads: name alone, or a MultiMutex's names.
	names func(name string) []string
	// quick is what another actor runs inside an injection: a Try form,
	// or a release.
	quick []string
	// delay says that every actor's lock has a lock delay (WithLockDelay):
	// the schedule checks what a delay promises (see checkAdmitted).
	delay bool
	// minHold, if not nil, is the minimum hold (WithMinHold) of actor
	// id's lock: the schedule checks what it promises (checkMinHold).
	minHold func(id int) time.Duration
	// maxHold, if not nil, is the max hold (WithMaxHold) of actor id's
	// lock: each hold returned is checked to be bound to a lease of its
	// own no longer than it (checkMaxHold).
	maxHold func(id int) time.Duration
	// short is how many schedules the short mode runs on one member, when
	// not 12: a kind whose schedules wait out lock delays (a second or
	// two each) runs fewer, so that it takes no longer than the others.
	short int
}

const semCapacity = 3

// mutexOps are what a Mutex's actors run, with a lock delay or without.
var mutexOps = []exploreOp{
	{"Lock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.Mutex).Lock(ctx) }},
	{"TryLock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.Mutex).TryLock(ctx) }},
	{"Unlock", false, true, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.Mutex).Unlock(ctx) }},
	{"Do", false, false, func(ctx context.Context, a *actor, _ int) error {
		return a.p.(*etcdlock.Mutex).Do(ctx, a.doFn)
	}},
}

// unlockClose is the shutdown after SIGTERM, across two features: Unlock
// with a ctx that has already ended (the release goes to the background),
// then Session.Close at once. Close sends what Unlock left before it ends
// the session, so the release is clean and leaves no pending delay, unless
// the hold was lost meanwhile (a fault) or etcd did not confirm the
// release within Close's bound (checkCleanRelease).
var unlockClose = exploreOp{"UnlockClose", false, true, func(ctx context.Context, a *actor, _ int) error {
	m := a.p.(*etcdlock.Mutex)
	a.mu.Lock()
	s := a.s
	a.mu.Unlock()
	key, token, lost := m.Key(), m.Token(), m.Err()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	err := m.Unlock(ended)
	start := time.Now()
	cerr := s.Close()
	if token != 0 && lost == nil && time.Since(start) < 4*time.Second {
		a.x.checkCleanRelease(key, token, a.x.k.minHold != nil)
	}
	if errors.Is(err, context.Canceled) {
		err = nil // the release went to the background: Close sent it
	}
	return errors.Join(err, cerr)
}}

// outlast keeps the hold until its max hold ends it (Done closes), 2.5s
// pass, or the op is cancelled: without it holds last a few steps, and
// the loss a max hold causes would not meet the faults nor the other
// actors' waits (MutexMaxHold). A deadline drawn for the op does not end
// it (most are far shorter than a max hold); the schedule's end does.
var outlast = exploreOp{"Outlast", false, false, func(ctx context.Context, a *actor, _ int) error {
	t := time.NewTimer(2500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-a.p.Done():
			return a.p.Err() // why it ended, if it was held
		case <-t.C:
			return nil
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil
			}
			ctx = a.x.ctx
		}
	}
}}

// checkCleanRelease reports a pending lock delay left by the hold of key
// created at token, which Unlock then Close released cleanly, unless a
// fault made it pending (its end was noted) or the key was gone before
// the release.
//
// With a minimum hold, Close leaves the rest of one that has not passed
// on a lease of its own (leased): such a record is no delay.
func (x *schedule) checkCleanRelease(key string, token int64, leased bool) {
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	pending, err := x.pendingAt(ctx, 0)
	if err != nil {
		return
	}
	r, ok := pending[etcdlock.LockDelayPrefix+key]
	if !ok || r.token != token || leased && r.lease != 0 {
		return
	}
	// A fault that ended the hold notes its delay just after it: look
	// for a moment.
	for range 20 {
		x.mu.Lock()
		noted := slices.ContainsFunc(x.pending, func(n *noted) bool { return n.key == key && n.token == token })
		x.mu.Unlock()
		if noted {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	x.violation("Unlock with an ended ctx, then Close, left the lock delay of %s (token %d) pending: no fault ended it", key, token)
}

// lockDelays are the lock delays of the MutexDelay actors' locks, actor
// id's the id%3-th: mostly the least that etcd's test cluster allows (its
// least lease TTL), which keeps a waiter out for 1 to 1.5s (etcd looks for
// ended leases every 500ms), and one longer, so that a waiter with one
// delay must wait out a hold's other one.
var lockDelays = []time.Duration{time.Second, time.Second, 2 * time.Second}

// minHolds are the minimum holds of the MutexMinHold actors' locks, actor
// id's the id%3-th: under a second, so that Session.Close leaves the rest
// to etcd's least lease TTL, and one longer than the others.
var minHolds = []time.Duration{time.Second, time.Second, 1500 * time.Millisecond}

// maxHolds are the max holds of the MutexMaxHold actors' locks, actor
// id's the id%3-th: shorter than the sessions' TTL (5s), so that a
// check tells the two leases apart, and short enough that a hold in Do
// kept over a few turns runs out, and its loss meets the faults too.
var maxHolds = []time.Duration{time.Second, time.Second, 2 * time.Second}

var exploreKinds = []*exploreKind{
	{
		name:  "Mutex",
		mk:    func(s *etcdlock.Session, name string, _ int) prim { return etcdlock.NewMutex(s, name) },
		ops:   mutexOps,
		quick: []string{"TryLock", "TryLock", "Unlock"},
	},
	{
		// A lock delay on every actor's Mutex, the delays of lockDelays.
		name: "MutexDelay",
		mk: func(s *etcdlock.Session, name string, id int) prim {
			return etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(lockDelays[id%len(lockDelays)]))
		},
		ops:   append(mutexOps[:len(mutexOps):len(mutexOps)], unlockClose),
		quick: []string{"TryLock", "TryLock", "Unlock"},
		delay: true,
		short: 6,
	},
	{
		// A minimum hold on every actor's Mutex, those of minHolds, and
		// on one a lock delay too: both keep their records, and a
		// schedule checks what each promises.
		name: "MutexMinHold",
		mk: func(s *etcdlock.Session, name string, id int) prim {
			opts := []etcdlock.MutexOption{etcdlock.WithMinHold(minHolds[id%len(minHolds)])}
			if id%3 == 1 {
				opts = append(opts, etcdlock.WithLockDelay(time.Second))
			}
			return etcdlock.NewMutex(s, name, opts...)
		},
		ops:     append(mutexOps[:len(mutexOps):len(mutexOps)], unlockClose),
		quick:   []string{"TryLock", "TryLock", "Unlock"},
		delay:   true,
		minHold: func(id int) time.Duration { return minHolds[id%len(minHolds)] },
		short:   6,
	},
	{
		// A max hold on every actor's Mutex, those of maxHolds.
		name: "MutexMaxHold",
		mk: func(s *etcdlock.Session, name string, id int) prim {
			return etcdlock.NewMutex(s, name, etcdlock.WithMaxHold(maxHolds[id%len(maxHolds)]))
		},
		ops:     append(mutexOps[:len(mutexOps):len(mutexOps)], unlockClose, outlast),
		quick:   []string{"TryLock", "TryLock", "Unlock"},
		maxHold: func(id int) time.Duration { return maxHolds[id%len(maxHolds)] },
	},
	{
		name: "RWMutex",
		mk:   func(s *etcdlock.Session, name string, _ int) prim { return etcdlock.NewRWMutex(s, name) },
		ops: []exploreOp{
			{"Lock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).Lock(ctx) }},
			{"TryLock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).TryLock(ctx) }},
			{"RLock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).RLock(ctx) }},
			{"TryRLock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).TryRLock(ctx) }},
			{"Unlock", false, true, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).Unlock(ctx) }},
			{"RUnlock", false, true, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.RWMutex).RUnlock(ctx) }},
			{"Downgrade", false, false, func(ctx context.Context, a *actor, _ int) error {
				return a.p.(*etcdlock.RWMutex).Downgrade(ctx)
			}},
		},
		quick: []string{"TryLock", "TryRLock", "Unlock", "RUnlock"},
	},
	{
		name: "Semaphore",
		mk:   func(s *etcdlock.Session, name string, _ int) prim { return etcdlock.NewSemaphore(s, name, semCapacity) },
		ops: []exploreOp{
			{"Acquire", true, false, func(ctx context.Context, a *actor, n int) error {
				return a.p.(*etcdlock.Semaphore).Acquire(ctx, int64(1+n%semCapacity))
			}},
			{"TryAcquire", true, false, func(ctx context.Context, a *actor, n int) error {
				return a.p.(*etcdlock.Semaphore).TryAcquire(ctx, int64(1+n%semCapacity))
			}},
			{"Release", false, true, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.Semaphore).Release(ctx) }},
		},
		quick: []string{"TryAcquire", "TryAcquire", "Release"},
	},
	{
		name: "Election",
		mk:   func(s *etcdlock.Session, name string, _ int) prim { return etcdlock.NewElection(s, name) },
		ops: []exploreOp{
			{"Campaign", true, false, func(ctx context.Context, a *actor, n int) error {
				return a.p.(*etcdlock.Election).Campaign(ctx, fmt.Sprintf("a%d-v%d", a.id, n%5))
			}},
			{"Resign", false, true, func(ctx context.Context, a *actor, _ int) error { return a.p.(*etcdlock.Election).Resign(ctx) }},
			{"Proclaim", false, false, func(ctx context.Context, a *actor, n int) error {
				return a.p.(*etcdlock.Election).Proclaim(ctx, fmt.Sprintf("a%d-p%d", a.id, n%5))
			}},
		},
		quick: []string{"Campaign", "Resign", "Proclaim"},
	},
	{
		// Three names, the lock and two locks nested in it (so that a
		// set's keys share a create revision in the lock's range): two
		// sets that overlap, in different orders, and a Mutex on the
		// name both share.
		name:  "MultiMutex",
		names: setNames,
		mk: func(s *etcdlock.Session, name string, id int) prim {
			if id%3 == 2 {
				return etcdlock.NewMutex(s, name+"/m")
			}
			return multiMk(s, name, id)
		},
		ops:   multiOps,
		quick: []string{"TryLock", "TryLock", "Unlock"},
	},
	{
		// Sets over names one of which has a lock delay: the MultiMutex
		// schedules' sets, and a Mutex with a delay on the lock (a name
		// both sets share). The sets honour no delay (they take none):
		// they hold while the Mutex's delay is pending, and the readers
		// must say so (heldAt, checkRequested).
		name:  "MultiMutexDelay",
		names: setNames,
		mk: func(s *etcdlock.Session, name string, id int) prim {
			if id%3 != 0 {
				return etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(time.Second))
			}
			return multiMk(s, name, id)
		},
		ops:   multiOps,
		quick: []string{"TryLock", "TryLock", "Unlock"},
		delay: true,
		short: 6,
	},
}

// setNames are the names of a MultiMutex schedule on name.
func setNames(name string) []string { return []string{name, name + "/m", name + "/n"} }

// multiMk makes the set of actor id (id%3 is 0 or 1) in a MultiMutex
// schedule on name: two sets that overlap, naming their names in
// different orders.
func multiMk(s *etcdlock.Session, name string, id int) prim {
	if id%3 == 0 {
		return explMulti{etcdlock.NewMultiMutex(s, []string{name, name + "/m"})}
	}
	return explMulti{etcdlock.NewMultiMutex(s, []string{name + "/m", name + "/n", name})}
}

// multiOps are what a MultiMutex schedule's actors run.
var multiOps = []exploreOp{
	{"Lock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.set().Lock(ctx) }},
	{"TryLock", true, false, func(ctx context.Context, a *actor, _ int) error { return a.set().TryLock(ctx) }},
	{"Unlock", false, true, func(ctx context.Context, a *actor, _ int) error { return a.set().Unlock(ctx) }},
	{"Do", false, false, func(ctx context.Context, a *actor, _ int) error { return a.set().Do(ctx, a.doFn) }},
}

// set returns a's lock in a MultiMutex schedule.
func (a *actor) set() setLocker {
	if m, ok := a.p.(explMulti); ok {
		return m.MultiMutex
	}
	return a.p.(*etcdlock.Mutex)
}

// TestExplore runs the schedule explorer on each primitive, on the shared
// one-member etcd and on a three-member one of its own.
func TestExplore(t *testing.T) {
	long := *exploreFor > 0
	for _, k := range exploreKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			if *exploreMembers != 3 {
				explore(t, cluster, k, cmp.Or(k.short, 12))
			}
		})
	}
	if long && *exploreMembers != 3 || *exploreMembers == 1 || testing.Short() {
		return
	}
	t.Run("ThreeMembers", func(t *testing.T) {
		t.Parallel()
		c := etcdtest.Start(t, 3)
		for _, k := range exploreKinds {
			t.Run(k.name, func(t *testing.T) {
				t.Parallel()
				explore(t, c, k, 3)
			})
		}
	})
}

// explore runs schedules of k on c: the seed given, seeds for as long as
// asked, or short seeds.
func explore(t *testing.T, c *etcdtest.Cluster, k *exploreKind, short int) {
	var met delayMet
	if k.delay || k.maxHold != nil {
		defer func() { t.Logf("lock delay and hold limits: %s", &met) }()
	}
	switch {
	case *exploreSeed != 0:
		met.add(runSchedule(t, c, k, *exploreSeed))
	case *exploreFor > 0:
		start, n := time.Now(), 0
		for seed := seedBase(k, c) + 1; time.Since(start) < *exploreFor && !t.Failed(); seed++ {
			met.add(runSchedule(t, c, k, seed))
			n++
		}
		t.Logf("%d schedules in %v", n, time.Since(start).Round(time.Second))
	default:
		n := short
		if *exploreSeeds > 0 {
			n = *exploreSeeds
		}
		for i := range n {
			if t.Failed() {
				return
			}
			met.add(runSchedule(t, c, k, seedBase(k, c)+uint64(i)+1))
		}
	}
}

// seedBase makes the seeds of each primitive and cluster size their own.
func seedBase(k *exploreKind, c *etcdtest.Cluster) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", k.name, c.Size())
	return h.Sum64() % 1e9 * 1000
}

// A schedule is one run of the explorer: its seed's choices, its actors,
// and what it has found.
type schedule struct {
	t      *testing.T
	c      *etcdtest.Cluster
	k      *exploreKind
	seed   uint64
	rng    *rand.Rand
	name   string
	names  []string         // the lock names whose queues are checked: name, or a MultiMutex's
	admin  *clientv3.Client // the explorer's own: checks, foreign keys, compactions
	actors []*actor
	ctx    context.Context
	cancel context.CancelFunc

	// injecting is read-locked by each injection while it runs, inside
	// an actor's RPC: teardown write-locks it to wait for them.
	injecting sync.RWMutex

	mu      sync.Mutex
	log     []string
	bad     []string
	foreign []string                  // foreign keys under name, in order
	fLease  clientv3.LeaseID          // their lease
	nested  int                       // nested keys put so far
	lost    map[*belief]time.Time     // holds whose key the checker found gone
	leaders []etcdlock.Leader         // what Observe yielded
	obsDone chan struct{}             // closed when the observer returned
	adopted map[clientv3.LeaseID]bool // leases an actor adopted (a violation of its own)
	// restarted is, by lease, the revision at which an actor restarted
	// with it (restart): keys created up to it are the old holds'.
	restarted map[int64]int64
	// requests counts the release requests begun (RequestRelease), and
	// requestsDone those that returned; asks are the holds current
	// throughout one, which must be told.
	requests     int
	requestsDone int
	asks         map[*belief]time.Time
	// The lock delay, in a kind with one: pending are the delays that a
	// fault made pending, running the records of the delays started and
	// not ended (watchDelays), returned the tokens of the holds that an
	// acquisition returned, and met what the schedule met of delays.
	pending   []*noted
	running   map[string]bool
	returned  map[int64]bool
	minHolds  []minHoldHold // the holds returned, in a kind with a minimum hold
	met       delayMet
	delayDone chan struct{} // closed when watchDelays returned
}

// An actor is one client and session and its lock.
type actor struct {
	id  int
	x   *schedule
	in  *etcdtest.Injector
	cli *clientv3.Client

	mu       sync.Mutex
	s        *etcdlock.Session
	sessions []*etcdlock.Session
	p        prim
	held     *belief // guarded by mu
	// resumes is the hold a had when it last restarted (restart), until
	// it takes a new one.
	resumes *belief
	op      *inflight
	turn    chan struct{} // Do's fn returns when it is closed
}

// A belief is a hold an actor believes it has.
type belief struct {
	keys  []string // its key; a MultiMutex's keys
	token int64
	done  <-chan struct{}
	asked <-chan struct{} // ReleaseRequested
	// reqs is how many release requests had returned when the
	// operation that took the hold began: ReleaseRequested may close
	// only if one began since, or was under way then (more have begun
	// than reqs).
	reqs int
	by   string // the operation that took it
}

// inflight is an operation an actor runs.
type inflight struct {
	name   string
	op     exploreOp
	cancel context.CancelFunc
	done   chan error
	rev    int64 // etcd's revision when it began
	reqs   int   // release requests that had returned when it began
	began  time.Time
}

func (x *schedule) logf(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.log = append(x.log, fmt.Sprintf(format, args...))
}

// violation records a broken invariant.
func (x *schedule) violation(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	x.mu.Lock()
	defer x.mu.Unlock()
	x.bad = append(x.bad, msg)
	x.log = append(x.log, "VIOLATION: "+msg)
}

// runSchedule runs the schedule of seed, and returns what it met of the
// lock delay.
func runSchedule(t *testing.T, c *etcdtest.Cluster, k *exploreKind, seed uint64) delayMet {
	x := &schedule{
		t: t, c: c, k: k, seed: seed,
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		name:      fmt.Sprintf("explore/%s/m%d/%d", k.name, c.Size(), seed),
		lost:      make(map[*belief]time.Time),
		asks:      make(map[*belief]time.Time),
		adopted:   make(map[clientv3.LeaseID]bool),
		returned:  make(map[int64]bool),
		restarted: make(map[int64]int64),
		running:   make(map[string]bool),
	}
	x.names = []string{x.name}
	if k.names != nil {
		x.names = k.names(x.name)
	}
	x.ctx, x.cancel = context.WithCancel(context.Background())
	defer x.cancel()
	var err error
	if x.admin, err = c.NewClient(clientv3.Config{}); err != nil {
		t.Fatalf("explorer client: %v", err)
	}
	defer x.admin.Close()
	// The foreign keys' lease. On three members another schedule's leader
	// move can drop this Grant ("raft proposal dropped"): that is etcd's
	// answer to the explorer, not a finding, so it asks again.
	var g *clientv3.LeaseGrantResponse
	for try := range 8 {
		if g, err = x.admin.Grant(x.ctx, 60); err == nil {
			break
		}
		t.Logf("foreign lease: %v", err)
		time.Sleep(time.Duration(50<<try) * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("foreign lease: %v", err)
	}
	x.fLease = g.ID

	n := 3
	for i := range n {
		a := &actor{id: i, x: x, in: &etcdtest.Injector{}}
		if a.cli, err = c.NewClient(clientv3.Config{DialOptions: a.in.DialOptions()}); err != nil {
			t.Fatalf("actor client: %v", err)
		}
		a.newSession()
		x.actors = append(x.actors, a)
	}
	if k.name == "Election" {
		x.observe()
	}
	if k.delay {
		x.watchDelays()
	}
	// Half the schedules start with a queue that spans pages.
	if d := x.rng.IntN(4); d < 2 {
		n := pages[d] + x.rng.IntN(3)
		err := x.putNested(x.ctx, n)
		x.logf("start: %d nested keys: %v", n, err)
	}

	steps := *exploreSteps
	for step := range steps {
		x.step(step)
		// On after a violation too: a defect often shows more than one
		// symptom, and each says something.
		x.check(fmt.Sprintf("after step %d", step))
	}
	x.teardown()

	x.mu.Lock()
	bad, log, met := x.bad, x.log, x.met
	x.mu.Unlock()
	if len(bad) > 0 || *exploreVerbose {
		report := fmt.Sprintf("schedule %s (seed %d, %d members):\n  %s", k.name, seed, c.Size(), strings.Join(log, "\n  "))
		if len(bad) > 0 {
			t.Errorf("%s\nreplay: go test -run 'TestExplore/%s$' -explore.seed=%d -v .", report, exploreRunName(k, c), seed)
		} else {
			t.Log(report)
		}
	}
	return met
}

func exploreRunName(k *exploreKind, c *etcdtest.Cluster) string {
	if c.Size() == 3 {
		return "ThreeMembers/" + k.name
	}
	return k.name
}

// newSession gives a a new session and a new lock on it (after its
// session ended, or at the start).
func (a *actor) newSession() {
	// NewSession rides out the errors that pass, and returns the others:
	// an injected fault can hit its Grant. The actor tries again, a few
	// times now, then at its next operation.
	var s *etcdlock.Session
	var err error
	for try := range 5 {
		ctx, cancel := context.WithTimeout(a.x.ctx, 10*time.Second)
		s, err = etcdlock.NewSession(ctx, a.cli, etcdlock.WithTTL(5*time.Second))
		cancel()
		if err == nil {
			break
		}
		a.x.logf("  a%d: NewSession: %v", a.id, err)
		time.Sleep(time.Duration(50<<try) * time.Millisecond)
	}
	if err != nil {
		if a.s == nil {
			a.x.violation("a%d: no first session: %v", a.id, err)
		}
		return
	}
	if a.id == 1 {
		// Actor a1 sends every release in a batch (batch.go), the way
		// a session releasing many locks at once sends most: the faults
		// meet that path too.
		etcdlock.SetReleasesInFlight(s, 0)
	}
	a.mu.Lock()
	a.s, a.sessions = s, append(a.sessions, s)
	a.p = a.x.k.mk(s, a.x.name, a.id)
	a.mu.Unlock()
}

// The draws of one step: made in full whatever happens, so that a seed
// makes the same choices on every run.
type draws struct {
	actor, op, arg, ctxKind, timeout int
	busy                             int // what to do if the actor is busy: cancel its operation, or let it be
	inject                           bool
	target, k, kind, pick, pick2     int
}

func (x *schedule) draw() draws {
	r := x.rng
	return draws{
		actor: r.IntN(len(x.actors)), op: r.IntN(100), arg: r.IntN(1000),
		ctxKind: r.IntN(4), timeout: 20 + r.IntN(400), busy: r.IntN(3),
		// RPC 2 most: the second page of a read, or the read after a write.
		inject: r.IntN(10) < 7, target: r.IntN(len(x.actors)), k: []int{1, 2, 2, 3}[r.IntN(4)],
		kind: r.IntN(100), pick: r.IntN(1000), pick2: r.IntN(1000),
	}
}

// step runs one step: an operation of one actor, with a fault injected
// at a chosen RPC of one actor.
func (x *schedule) step(step int) {
	d := x.draw()
	a := x.actors[d.actor]
	if d.inject {
		target := x.actors[d.target]
		if d.target != d.actor && d.pick%3 != 0 {
			target = a // mostly the actor that runs the operation
		}
		x.arm(step, target, d)
	}
	a.mu.Lock()
	busy := a.op
	a.mu.Unlock()
	switch {
	case busy != nil && busy.name == "Do":
		x.logf("step %d: a%d: Do's fn returns", step, a.id)
		a.endTurn()
	case busy != nil && d.busy == 0:
		x.logf("step %d: a%d: cancel %s", step, a.id, busy.name)
		busy.cancel()
	case busy != nil:
		x.logf("step %d: a%d: %s goes on", step, a.id, busy.name)
	case d.op < 4:
		x.adopt(step, a, d)
	default:
		op := x.k.ops[d.op%len(x.k.ops)]
		x.start(step, a, op, d)
	}
	x.settle()
	if x.k.delay && x.awaitDelays() {
		x.settle()
	}
	for _, b := range x.actors {
		b.in.Disarm()
	}
	x.collect()
}

// adopt has a try to make a session on another actor's live lease: it
// must be refused. Or, one time in two, a restarts (restart).
func (x *schedule) adopt(step int, a *actor, d draws) {
	if d.pick2%2 == 0 {
		x.restart(step, a)
		return
	}
	b := x.actors[d.pick%len(x.actors)]
	b.mu.Lock()
	bs := b.s
	b.mu.Unlock()
	if bs == nil || bs.Err() != nil || b == a {
		x.logf("step %d: a%d: (no live lease to adopt)", step, a.id)
		return
	}
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	s, err := etcdlock.NewSession(ctx, a.cli, etcdlock.WithLease(bs.Lease()))
	cancel()
	x.logf("step %d: a%d: NewSession(WithLease(a%d's %x)): %v", step, a.id, b.id, int64(bs.Lease()), err)
	if err == nil {
		x.violation("a%d made a second live session on a%d's lease %x", a.id, b.id, int64(bs.Lease()))
		a.mu.Lock()
		a.s, a.sessions = s, append(a.sessions, s)
		a.p = x.k.mk(s, x.name, a.id)
		a.mu.Unlock()
		return
	}
	// Any error will do: the refusal (ErrInvalidOption), or etcd's,
	// when a fault hits the lease's lookup, or the lease was revoked a
	// moment ago.
}

// restart is a's process dying without a word and starting again with
// its lease (WithLease), as etcd's package documents for a restart: its
// session is orphaned, its keys stay under the lease, and a new session
// adopts it. A hold a takes then is a new hold: it must never carry the
// token of the hold it resumes (finish checks), or that hold's late
// writes would pass a fence as the new one's.
func (x *schedule) restart(step int, a *actor) {
	a.mu.Lock()
	s, held := a.s, a.held
	a.mu.Unlock()
	if s == nil || s.Err() != nil {
		x.logf("step %d: a%d: (no live session to restart)", step, a.id)
		return
	}
	s.Orphan()
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	ns, err := etcdlock.NewSession(ctx, a.cli, etcdlock.WithLease(s.Lease()))
	cancel()
	x.logf("step %d: a%d: restart: Orphan, NewSession(WithLease(%x)): %v", step, a.id, int64(s.Lease()), err)
	if err != nil {
		return // a fault, or the lease went: a's next operation starts anew
	}
	rev := x.revision()
	x.mu.Lock()
	x.restarted[int64(ns.Lease())] = rev
	x.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.s, a.sessions = ns, append(a.sessions, ns)
	a.p = x.k.mk(ns, x.name, a.id)
	if held != nil {
		a.resumes = held
	}
}

// start starts op on a, in a goroutine.
func (x *schedule) start(step int, a *actor, op exploreOp, d draws) {
	a.mu.Lock()
	if a.s == nil || a.s.Err() != nil {
		a.mu.Unlock()
		a.newSession()
		a.mu.Lock()
	}
	ctx, cancel := context.WithCancel(x.ctx)
	desc := "no deadline"
	switch d.ctxKind {
	case 0:
		ctx, cancel = context.WithTimeout(x.ctx, time.Duration(d.timeout)*time.Millisecond)
		desc = fmt.Sprintf("%dms", d.timeout)
	case 1:
		ctx, cancel = context.WithTimeout(x.ctx, time.Duration(d.timeout/10)*time.Millisecond)
		desc = fmt.Sprintf("%dms", d.timeout/10)
	}
	if a.op != nil {
		// Another actor's RPC ran a quick operation on a (quickOp)
		// since the step found it idle: one operation at a time.
		busy := a.op.name
		a.mu.Unlock()
		cancel()
		x.logf("step %d: a%d: (taken meanwhile by %s)", step, a.id, busy)
		return
	}
	f := &inflight{name: op.name, op: op, cancel: cancel, done: make(chan error, 1), rev: x.revision(), reqs: x.requestCount(), began: time.Now()}
	a.op = f
	if op.name == "Do" {
		a.turn = make(chan struct{})
	}
	if op.release {
		a.held = nil // a careless caller: whatever Unlock returns, it is done
	}
	a.mu.Unlock()
	x.logf("step %d: a%d: %s(arg %d, ctx %s)", step, a.id, op.name, d.arg, desc)
	go func() {
		err := op.run(ctx, a, d.arg)
		if op.acquire && err == nil {
			x.admitted(a, op.name)
		}
		f.done <- err
	}()
}

// doFn is Do's fn: it holds until the actor's next turn.
func (a *actor) doFn(ctx context.Context) error {
	a.x.admitted(a, "Do")
	asked := a.p.ReleaseRequested()
	a.mu.Lock()
	reqs := 0
	if a.op != nil {
		reqs = a.op.reqs
	}
	a.held = &belief{keys: primKeys(a.p), token: a.p.Token(), done: a.p.Done(), asked: asked, reqs: reqs, by: "Do"}
	turn := a.turn
	a.mu.Unlock()
	select {
	case <-turn:
	case <-ctx.Done():
	}
	a.mu.Lock()
	a.held = nil
	a.mu.Unlock()
	return nil
}

// endTurn makes a's Do's fn return.
func (a *actor) endTurn() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.turn != nil {
		close(a.turn)
		a.turn = nil
	}
}

// settle waits until no actor has made an RPC for a moment: the step's
// operations have returned, or wait for their turn.
func (x *schedule) settle() {
	count := func() (n int64) {
		for _, a := range x.actors {
			n += a.in.Count()
		}
		return n
	}
	deadline := time.Now().Add(3 * time.Second)
	last := count()
	quiet := 0
	for time.Now().Before(deadline) && quiet < 3 {
		time.Sleep(10 * time.Millisecond)
		if n := count(); n != last {
			last, quiet = n, 0
			continue
		}
		quiet++
	}
}

// collect takes the results of the operations that returned.
func (x *schedule) collect() {
	for _, a := range x.actors {
		a.mu.Lock()
		f := a.op
		a.mu.Unlock()
		if f == nil {
			continue
		}
		select {
		case err := <-f.done:
			x.finish(a, f, err)
		default:
		}
	}
}

// finish records the result err of a's operation f.
func (x *schedule) finish(a *actor, f *inflight, err error) {
	f.cancel()
	var asked <-chan struct{}
	if f.op.acquire && err == nil {
		asked = a.p.ReleaseRequested()
	}
	a.mu.Lock()
	a.op = nil
	s := a.s
	if f.op.acquire && err == nil {
		b := &belief{keys: primKeys(a.p), token: a.p.Token(), done: a.p.Done(), asked: asked, reqs: f.reqs, by: f.name}
		if a.held != nil && a.held.token == b.token {
			// The same hold (a Campaign of the leader returns at once):
			// a request made since it began is its own.
			b.reqs = min(b.reqs, a.held.reqs)
		}
		if r := a.resumes; r != nil && b.token <= r.token && slices.ContainsFunc(b.keys, func(k string) bool { return slices.Contains(r.keys, k) }) {
			x.violation("a%d's %s after a restart holds %v with token %d, not larger than the token %d of the hold it resumed",
				a.id, f.name, b.keys, b.token, r.token)
		}
		a.held, a.resumes = b, nil
	}
	a.mu.Unlock()
	x.logf("  a%d: %s returned %v", a.id, f.name, err)
	if x.k.maxHold != nil && err != nil && strings.Contains(err.Error(), "max hold time passed") {
		x.mu.Lock()
		x.met.maxLost++
		x.mu.Unlock()
	}
	// (rev 0: etcd could not be asked when it began, during a member's
	// stop: nothing to compare with.)
	if f.op.acquire && err != nil && s.Err() == nil && !strings.Contains(err.Error(), "session") && f.rev > 0 {
		x.noKeyLeft(a, s, f)
	}
}

// noKeyLeft checks that a failed acquisition on s left no key: none of
// a's session created since the operation began. A Try whose ctx ended
// before its write's answer came leaves the key's removal to the session
// (writeOrHandOff): the check waits for that first.
func (x *schedule) noKeyLeft(a *actor, s *etcdlock.Session, f *inflight) {
	for i := 0; etcdlock.BackgroundRunning(s) > 0; i++ {
		if i == 3000 {
			x.violation("a%d's failed %s left work to its session that did not end within 30s", a.id, f.name)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, key := range primKeys(a.p) {
		resp, err := x.admin.Get(x.ctx, key)
		if err != nil {
			x.logf("  (could not look for a%d's key: %v)", a.id, err)
			return
		}
		if len(resp.Kvs) > 0 && resp.Kvs[0].CreateRevision > f.rev {
			x.violation("a%d's failed %s left its key %s (created at %d, after %d)", a.id, f.name, key, resp.Kvs[0].CreateRevision, f.rev)
		}
		if !x.k.delay {
			continue
		}
		// Nor a delay record: it would delay the next holder for a
		// hold that no one had.
		resp, err = x.admin.Get(x.ctx, etcdlock.LockDelayPrefix+key)
		if err != nil {
			x.logf("  (could not look for a%d's delay record: %v)", a.id, err)
			return
		}
		if len(resp.Kvs) > 0 {
			if token, _ := parseDelay(resp.Kvs[0]); token > f.rev {
				x.violation("a%d's failed %s left the delay record of %s (token %d, after %d)", a.id, f.name, key, token, f.rev)
			}
		}
	}
}

// revision returns etcd's current revision.
func (x *schedule) revision() int64 {
	resp, err := x.admin.Get(x.ctx, "explore-probe")
	if err != nil {
		return 0
	}
	return resp.Header.Revision
}

// check checks the actors' beliefs against etcd at one revision.
func (x *schedule) check(where string) {
	type believer struct {
		a *actor
		b *belief
	}
	var bs []believer
	var cmps []clientv3.Cmp
	for _, a := range x.actors {
		a.mu.Lock()
		b := a.held
		a.mu.Unlock()
		if b == nil {
			continue
		}
		select {
		case <-b.done:
			continue // told it lost the hold
		default:
		}
		bs = append(bs, believer{a, b})
		for _, k := range b.keys {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", b.token))
		}
	}
	// Every name checked is name or nested in it: one range reads them all.
	get := clientv3.OpGet(x.name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	resp, err := x.admin.Txn(x.ctx).If(cmps...).Then(get).Else(get).Commit()
	if err != nil {
		x.logf("  (check %s failed: %v)", where, err)
		return
	}
	rev := resp.Header.Revision
	tokens := map[string]int64{}
	type queueOf struct {
		children, holders []string
		modes             []etcdlock.KeyMode
	}
	queues := map[string]*queueOf{}
	for _, n := range x.names {
		queues[n] = &queueOf{}
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if name, ok := etcdlock.LockOfKey(string(kv.Key)); ok && queues[name] != nil {
			q := queues[name]
			q.children = append(q.children, string(kv.Key))
			q.modes = append(q.modes, etcdlock.ParseKeyMode(kv.Value))
			tokens[string(kv.Key)] = kv.CreateRevision
		}
	}
	for _, q := range queues {
		q.holders = q.children[:etcdlock.Holders(q.modes)]
	}
	seen := map[string]int{}
	believers := map[string]int{} // per name, believers whose key is present
	for _, b := range bs {
		// A hold of several keys is whole only while every key is its
		// own: one gone is a loss of the hold.
		present := true
		for _, k := range b.b.keys {
			present = present && tokens[k] == b.b.token
		}
		if !present {
			x.mu.Lock()
			if _, ok := x.lost[b.b]; !ok {
				x.lost[b.b] = time.Now()
				x.log = append(x.log, fmt.Sprintf("  a%d's hold %v (token %d) is gone at rev %d", b.a.id, b.b.keys, b.b.token, rev))
			}
			x.mu.Unlock()
			continue
		}
		for _, k := range b.b.keys {
			name, _ := etcdlock.LockOfKey(k)
			q := queues[name]
			if !slices.Contains(q.holders, k) {
				x.violation("%s (rev %d): a%d believes it holds %s (token %d, by %s), but etcd's queue %v admits only %v",
					where, rev, b.a.id, k, b.b.token, b.b.by, describe(q.children, q.modes), q.holders)
			}
			if other, dup := seen[k]; dup {
				x.violation("%s (rev %d): a%d and a%d both believe they hold %s", where, rev, other, b.a.id, k)
			}
			seen[k] = b.a.id
			believers[name]++
		}
	}
	x.mu.Lock()
	requests := x.requests
	x.mu.Unlock()
	for _, b := range bs {
		select {
		case <-b.b.asked:
			if requests == b.b.reqs {
				x.violation("%s: a%d's hold %v (token %d, by %s) was told to release, but no request was made since its acquisition began, nor was one under way then",
					where, b.a.id, b.b.keys, b.b.token, b.b.by)
			}
		default:
		}
	}
	if resp.Succeeded {
		for name, n := range believers {
			if n > 1 && n > len(queues[name].holders) {
				x.violation("%s (rev %d): every believer's IsOwner holds in one Txn, %d of them on %s, but only %v hold", where, rev, n, name, queues[name].holders)
			}
		}
	}
	x.checkLost(10 * time.Second)
	x.checkAsks(10 * time.Second)
}

// requestCount returns how many release requests have returned so far.
func (x *schedule) requestCount() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.requestsDone
}

// checkAsks reports a hold current throughout a release request, still
// held and still not told of it bound after the request.
func (x *schedule) checkAsks(bound time.Duration) {
	x.overdue(x.asks, bound, func(b *belief) bool {
		return closed(b.asked) || closed(b.done) // told, or ended: nothing to release
	}, "was current throughout a release request %v ago, and its ReleaseRequested is still open")
}

// overdue reports, as violations, the holds of pending (each with when it
// became pending) that are not settled more than bound later; what says
// the rest of the message (after the hold), with the time since. Settled
// and reported holds leave pending.
func (x *schedule) overdue(pending map[*belief]time.Time, bound time.Duration, settled func(*belief) bool, what string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for b, at := range pending {
		if settled(b) {
			delete(pending, b)
			continue
		}
		if time.Since(at) > bound {
			msg := fmt.Sprintf("the hold %v (token %d, by %s) ", b.keys, b.token, b.by) + fmt.Sprintf(what, time.Since(at).Round(time.Millisecond))
			x.bad = append(x.bad, msg)
			x.log = append(x.log, "VIOLATION: "+msg)
			delete(pending, b)
		}
	}
}

// currentHolds returns the beliefs whose keys are all their own in etcd
// now, that hold a key of the lock name.
func (x *schedule) currentHolds(ctx context.Context, name string) (map[*belief]bool, error) {
	resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	tokens := map[string]int64{}
	for _, kv := range resp.Kvs {
		tokens[string(kv.Key)] = kv.CreateRevision
	}
	cur := map[*belief]bool{}
	for _, a := range x.actors {
		a.mu.Lock()
		b := a.held
		a.mu.Unlock()
		if b == nil {
			continue
		}
		mine, whole := false, true
		for _, k := range b.keys {
			whole = whole && tokens[k] == b.token
			if n, ok := etcdlock.LockOfKey(k); ok && n == name {
				mine = true
			}
		}
		if mine && whole {
			cur[b] = true
		}
	}
	return cur, nil
}

// describe writes a queue: key and mode, oldest first.
func describe(keys []string, modes []etcdlock.KeyMode) string {
	var b strings.Builder
	for i, k := range keys {
		fmt.Fprintf(&b, " %s(%s)", k[strings.LastIndexByte(k, '/')+1:], modes[i])
	}
	return "[" + strings.TrimSpace(b.String()) + "]"
}

// checkLost reports a hold whose key went more than bound ago and whose
// Done is still open.
func (x *schedule) checkLost(bound time.Duration) {
	x.overdue(x.lost, bound, func(b *belief) bool { return closed(b.done) },
		"is gone since %v, and its Done is still open")
}

// An injection kind: what the explorer does at the chosen RPC.
const (
	injOther   = iota // another actor's quick operation
	injForeign        // a foreign exclusive key under the name
	injNested         // keys of nested locks, several in one Txn
	injTied           // a foreign key and nested keys in one Txn: one create revision
	injUnforeign
	injDelete  // a queue key deleted
	injRevoke  // an actor's lease revoked
	injCompact // a compaction
	injDrop    // the answer lost, once etcd applied the request
	injFail    // the request failed, not applied
	injMove    // etcd's leader moved (three members)
	injStop    // etcd's leader stopped and restarted (three members)
	injRequest // a release request (RequestRelease) on one of the names
	injEnd     // a hold ended without Unlock: its key deleted, or its lease revoked (a kind with a delay)
)

// injKind maps a draw to a kind: weights out of 100.
func (x *schedule) injKind(draw int) int {
	// A kind with a delay ends holds more often, in place of some other
	// actors' operations: a delay is pending only when a hold ends without
	// Unlock, and a key deleted or a lease revoked at random is seldom a
	// holder's. The other kinds' draws map as they always did.
	end := 0
	if x.k.delay {
		end = 12
	}
	table := []struct{ kind, weight int }{
		{injEnd, end}, {injOther, 17 - end}, {injRequest, 5}, {injForeign, 7}, {injNested, 8}, {injTied, 7}, {injUnforeign, 8},
		{injDelete, 10}, {injRevoke, 4}, {injCompact, 6}, {injDrop, 12}, {injFail, 10}, {injMove, 5}, {injStop, 1},
	}
	for _, e := range table {
		if draw < e.weight {
			if (e.kind == injMove || e.kind == injStop) && x.c.Size() < 3 {
				return injDrop
			}
			return e.kind
		}
		draw -= e.weight
	}
	return injOther
}

var injNames = []string{"another actor's operation", "a foreign key", "nested keys", "a tied group", "a foreign key removed",
	"a queue key deleted", "a lease revoked", "a compaction", "the answer lost", "the request failed", "the leader moved", "the leader stopped",
	"a release request", "a hold ended"}

// arm arms a fault at target's k-th RPC (unary calls and watch requests;
// lease renewals do not count).
func (x *schedule) arm(step int, target *actor, d draws) {
	kind := x.injKind(d.kind)
	x.logf("step %d: inject %s at a%d's RPC %d", step, injNames[kind], target.id, d.k)
	match := etcdtest.Nth(d.k, injectable)
	act := etcdtest.Action{}
	switch kind {
	case injDrop:
		act = lostAnswer(func(m string) { x.logf("  at a%d's %s: its answer lost", target.id, m) })
	case injFail:
		act = failedCall(d.pick2, func(m string) { x.logf("  at a%d's %s: it fails", target.id, m) })
	default:
		act.Before = func(r etcdtest.RPC) {
			x.logf("  at a%d's %s:", target.id, short(r.Method))
			x.inject(kind, target, d)
		}
	}
	target.in.At(match, act)
}

// injectable matches the RPCs an injection may be armed at: every unary
// call, and the requests sent on the watch stream.
func injectable(r etcdtest.RPC) bool { return !r.Stream || r.Method == etcdtest.MethodWatch }

// lostAnswer is the action that loses the answer of a call etcd applied,
// as a connection that breaks just then would; say logs it, with the
// call's method.
func lostAnswer(say func(method string)) etcdtest.Action {
	return etcdtest.Action{After: func(r etcdtest.RPC, err error) error {
		if err != nil {
			return err
		}
		say(short(r.Method))
		return status.Error(codes.Unavailable, "explore: the answer was lost")
	}}
}

// failedCall is the action that fails a call, unapplied, with one of the
// errors etcd answers such a call with (the pick-th, round); say logs it.
func failedCall(pick int, say func(method string)) etcdtest.Action {
	errs := []error{rpctypes.ErrGRPCTimeoutDueToLeaderFail, status.Error(codes.Unknown, "raft proposal dropped"), rpctypes.ErrGRPCLeaderChanged, status.Error(codes.Unavailable, "explore: connection refused")}
	return etcdtest.Action{
		Before: func(r etcdtest.RPC) { say(short(r.Method)) },
		Fail:   errs[pick%len(errs)],
	}
}

func short(method string) string { return method[strings.LastIndexByte(method, '/')+1:] }

// inject does kind, at target's RPC.
func (x *schedule) inject(kind int, target *actor, d draws) {
	x.injecting.RLock()
	defer x.injecting.RUnlock()
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	switch kind {
	case injOther:
		x.quickOp(ctx, target, d)
	case injForeign:
		x.mu.Lock()
		key := fmt.Sprintf("%s/f%d", x.name, len(x.foreign))
		x.foreign = append(x.foreign, key)
		x.mu.Unlock()
		_, err := x.admin.Put(ctx, key, "", clientv3.WithLease(x.fLease))
		x.logf("    put foreign %s: %v", key, err)
	case injNested, injTied:
		n := x.nestedCount(d.pick2)
		var ops []clientv3.Op
		x.mu.Lock()
		for range n {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/sub/k%03d", x.name, x.nested), ""))
			x.nested++
		}
		var key string
		if kind == injTied {
			// Sorted after the nested keys, so that etcd's order of
			// equal revisions may put it past a page boundary.
			key = fmt.Sprintf("%s/z%d", x.name, len(x.foreign))
			x.foreign = append(x.foreign, key)
			ops = append(ops, clientv3.OpPut(key, "", clientv3.WithLease(x.fLease)))
		}
		x.mu.Unlock()
		_, err := x.admin.Txn(ctx).Then(ops...).Commit()
		x.logf("    put %d nested keys %s in one Txn: %v", n, key, err)
	case injUnforeign:
		x.mu.Lock()
		var key string
		if len(x.foreign) > 0 {
			i := d.pick2 % len(x.foreign)
			key = x.foreign[i]
			x.foreign = append(x.foreign[:i:i], x.foreign[i+1:]...)
		}
		x.mu.Unlock()
		if key != "" {
			_, err := x.admin.Delete(ctx, key)
			x.logf("    delete foreign %s: %v", key, err)
		}
	case injDelete:
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			x.logf("    (read: %v)", err)
			return
		}
		var ks []string
		for _, kv := range resp.Kvs {
			if name, ok := etcdlock.LockOfKey(string(kv.Key)); ok && slices.Contains(x.names, name) {
				ks = append(ks, string(kv.Key))
			}
		}
		// Mostly a key of the actor that makes the RPC: the one whose
		// read is in progress.
		own := primKeys(target.p)
		key := own[d.pick2/3%len(own)]
		if d.pick2%3 == 0 && len(ks) > 0 {
			key = ks[d.pick2/3%len(ks)]
		}
		ended := x.delayFault(ctx)
		dresp, err := x.admin.Delete(ctx, key)
		x.logf("    delete %s: %v", key, err)
		if err == nil {
			ended(dresp.Header.Revision)
		}
	case injRevoke:
		a := x.actors[d.pick2%len(x.actors)]
		a.mu.Lock()
		s := a.s
		a.mu.Unlock()
		ended := x.delayFault(ctx)
		rresp, err := x.admin.Revoke(ctx, s.Lease())
		x.logf("    revoke a%d's lease %x: %v", a.id, int64(s.Lease()), err)
		if err == nil {
			ended(rresp.Header.Revision)
		}
	case injEnd:
		x.endHold(ctx, target, d)
	case injRequest:
		x.request(ctx, x.names[d.pick2%len(x.names)])
	case injCompact:
		rev := x.revision()
		_, err := x.admin.Compact(ctx, rev)
		x.logf("    compact at %d: %v", rev, err)
	case injMove:
		to := d.pick2 % x.c.Size()
		err := x.c.MoveLeader(ctx, to)
		x.logf("    move etcd's leader to m%d: %v", to, err)
	case injStop:
		// One stop at a time on a cluster: schedules run side by side.
		memberStops.Lock()
		defer memberStops.Unlock()
		lead := x.c.Leader()
		if lead < 0 {
			x.logf("    (no leader to stop)")
			return
		}
		x.c.StopMember(lead)
		err := x.c.RestartMember(lead)
		x.logf("    stopped and restarted m%d: %v", lead, err)
	}
}

// request makes a release request on name (RequestRelease), and notes
// what it must reach: the holds current before and after it were current
// when it was recorded, and each must be told (checkAsks); what it
// recorded must be for holds that held then (checkRequested).
func (x *schedule) request(ctx context.Context, name string) {
	before, err := x.currentHolds(ctx, name)
	if err != nil {
		x.logf("    (read: %v)", err)
		return
	}
	x.mu.Lock()
	x.requests++
	x.mu.Unlock()
	since := x.revision()
	err = etcdlock.RequestRelease(ctx, x.admin, name)
	x.mu.Lock()
	x.requestsDone++
	x.mu.Unlock()
	x.logf("    RequestRelease(%s): %v", name[strings.LastIndexByte(name, '/')+1:], err)
	if err != nil && !errors.Is(err, etcdlock.ErrNotHeld) {
		return
	}
	if err == nil {
		x.checkRequested(ctx, name, since)
	}
	after, err2 := x.currentHolds(ctx, name)
	if err2 != nil {
		x.logf("    (read: %v)", err2)
		return
	}
	if err != nil {
		// Nobody held, it says: no hold an acquisition returned may
		// have been current in etcd from before the call to after it,
		// nor may the queue's head that held.
		x.checkNotHeld(ctx, name, since)
		for b := range before {
			if after[b] {
				x.violation("RequestRelease(%s) returned %v, but the hold %v (token %d, by %s) was current before and after it", name, err, b.keys, b.token, b.by)
			}
		}
		return
	}
	x.mu.Lock()
	for b := range before {
		if after[b] {
			if _, ok := x.asks[b]; !ok {
				x.asks[b] = time.Now()
			}
		}
	}
	x.mu.Unlock()
}

// checkRequested checks the requests that a RequestRelease on name,
// begun after revision since, recorded: each is addressed to a hold that
// held at the revision it was recorded at, in etcd's queue, less what a
// pending lock delay keeps out and what a set still waits for elsewhere.
// A request for a key that only waits (a waiter a delay keeps out, a set
// first in line that waits for another name) reaches the hold it becomes
// later, which the docs promise never happens.
func (x *schedule) checkRequested(ctx context.Context, name string, since int64) {
	resp, err := x.admin.Get(ctx, etcdlock.ReleaseRequestPrefix+name+"/", clientv3.WithPrefix())
	if err != nil {
		x.logf("    (requests not read: %v)", err)
		return
	}
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), etcdlock.ReleaseRequestPrefix)
		if l, ok := etcdlock.LockOfKey(key); !ok || l != name || kv.ModRevision <= since {
			continue // another lock's, or an earlier request's
		}
		token, _ := strconv.ParseInt(string(kv.Value), 10, 64)
		if why, _ := x.heldAt(ctx, key, token, kv.ModRevision); why != "" {
			x.violation("a release request for %s (token %d) was recorded at rev %d, when it did not hold: %s", key, token, kv.ModRevision, why)
		}
	}
}

// heldAt says why key, with create revision token, did not hold at rev
// ("" when it held, or when etcd could not be read: read is then false,
// say when rev was compacted away): every key of its hold (the keys of
// the schedule's names with its lease and token) must be one etcd's
// queue admits; a set's must be under every name of its set (a set one
// of whose keys is gone is being released); and no pending lock delay of
// an older hold may keep it out, unless it is a set's.
func (x *schedule) heldAt(ctx context.Context, key string, token, rev int64) (why string, read bool) {
	lease := key[strings.LastIndexByte(key, '/')+1:]
	get := clientv3.OpGet(x.name+"/", clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	resp, err := x.admin.Txn(ctx).Then(get).Commit()
	if err != nil {
		return "", false
	}
	inSet := false // the hold is a set's
	if why := setGone(resp.Responses[0].GetResponseRange().Kvs, lease, token); why != "" {
		return why, true
	}
	for _, n := range x.names {
		var children []string
		var modes []etcdlock.KeyMode
		var mine string
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			if l, ok := etcdlock.LockOfKey(string(kv.Key)); ok && l == n {
				children = append(children, string(kv.Key))
				modes = append(modes, etcdlock.ParseKeyMode(kv.Value))
				if string(kv.Key) == n+"/"+lease && kv.CreateRevision == token {
					mine = string(kv.Key)
					inSet = inSet || etcdlock.InSet(kv.Value)
				}
			}
		}
		if mine != "" && !slices.Contains(children[:etcdlock.Holders(modes)], mine) {
			return fmt.Sprintf("%s waits in %s's queue %v", mine, n, children), true
		}
	}
	if !x.k.delay || inSet {
		return "", true // a set honours no delay
	}
	pending, err := x.pendingAt(ctx, rev)
	if err != nil {
		return "", false
	}
	for _, r := range pending {
		if r.token < token {
			return fmt.Sprintf("the lock delay of %s (token %d) was pending", r.key, r.token), true
		}
	}
	return "", true
}

// setGone says which name of a set lacks the set's key, among kvs (the
// keys under the schedule's lock, read at one revision), when the keys
// with lease and token are a set's: each set key names the next name of
// its set, round the ring. "" when none is missing, or they are no set's.
func setGone(kvs []*mvccpb.KeyValue, lease string, token int64) string {
	byKey := map[string]*mvccpb.KeyValue{}
	var start string
	for _, kv := range kvs {
		byKey[string(kv.Key)] = kv
		if strings.HasSuffix(string(kv.Key), "/"+lease) && kv.CreateRevision == token && etcdlock.InSet(kv.Value) {
			start = string(kv.Key)
		}
	}
	for k := start; k != ""; {
		next, _ := etcdlock.SetNext(byKey[k].Value)
		k = next + "/" + lease
		if k == start {
			break
		}
		if kv := byKey[k]; kv == nil || kv.CreateRevision != token {
			return fmt.Sprintf("its set's key in %s is gone", next)
		}
	}
	return ""
}

// checkNotHeld checks a RequestRelease on name, begun after revision
// since, that returned ErrNotHeld: the oldest key of name's queue at
// since may not have held from then to the call's end. A key that holds
// stays holding until it goes (keys join behind it; a set that holds has
// every name), so one that held at since and is in place, with the same
// create revision, after the call held throughout, and the call should
// have reached it.
func (x *schedule) checkNotHeld(ctx context.Context, name string, since int64) {
	resp, err := x.admin.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithRev(since), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return
	}
	var key string
	var token int64
	for _, kv := range resp.Kvs {
		if l, ok := etcdlock.LockOfKey(string(kv.Key)); ok && l == name {
			key, token = string(kv.Key), kv.CreateRevision
			break
		}
	}
	if key == "" {
		return
	}
	if why, read := x.heldAt(ctx, key, token, since); !read || why != "" {
		return
	}
	now, err := x.admin.Get(ctx, key)
	if err != nil || len(now.Kvs) == 0 || now.Kvs[0].CreateRevision != token {
		return
	}
	x.violation("RequestRelease(%s) returned ErrNotHeld, but %s (token %d) held from rev %d, before the call, to rev %d, after it", name, key, token, since, now.Header.Revision)
}

// endHold ends a hold without Unlock: a believer's, chosen by d, or the
// head of the queue when no actor believes it holds (an acquisition may
// have taken it and not returned yet). A third of the time it is a new
// hold, another actor's Try, that ends at once: a holder that crashes
// between two RPCs of the target (as between a Try's read and its
// guarded put).
func (x *schedule) endHold(ctx context.Context, target *actor, d draws) {
	if d.pick%3 == 0 {
		if b, err := x.quickOpNamed(ctx, target, d, "TryLock"); b != nil && err == nil {
			x.end(ctx, b.p.Key(), b, d)
		}
		return
	}
	var key string
	var holder *actor
	for i := range x.actors {
		a := x.actors[(d.pick2+i)%len(x.actors)]
		a.mu.Lock()
		if a.held != nil && holder == nil {
			key, holder = a.held.keys[0], a
		}
		a.mu.Unlock()
	}
	if holder == nil {
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		if err != nil {
			x.logf("    (read: %v)", err)
			return
		}
		for _, kv := range resp.Kvs {
			if name, ok := etcdlock.LockOfKey(string(kv.Key)); ok && name == x.name {
				key = string(kv.Key)
				break
			}
		}
	}
	if key == "" {
		x.logf("    (no hold to end)")
		return
	}
	x.end(ctx, key, holder, d)
	// A release request while the delay is pending, once a key waits
	// (one may have waited, or joins in a moment): the waiter the delay
	// keeps out holds nothing, and must not be asked.
	x.awaitWaiter(ctx, 500*time.Millisecond)
	x.request(ctx, x.name)
}

// awaitWaiter waits, for at most d, until a key is in the lock's queue.
func (x *schedule) awaitWaiter(ctx context.Context, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return
		}
		for _, kv := range resp.Kvs {
			if name, ok := etcdlock.LockOfKey(string(kv.Key)); ok && name == x.name {
				return
			}
		}
	}
}

// end ends the hold of key: it deletes the key, or, chosen by d, revokes
// the lease of its holder a (the session's end, seen from the others),
// when a is known.
func (x *schedule) end(ctx context.Context, key string, a *actor, d draws) {
	ended := x.delayFault(ctx)
	if d.pick2%2 == 0 || a == nil {
		resp, err := x.admin.Delete(ctx, key)
		x.logf("    delete %s: %v", key, err)
		if err == nil {
			ended(resp.Header.Revision)
		}
		return
	}
	a.mu.Lock()
	s := a.s
	a.mu.Unlock()
	resp, err := x.admin.Revoke(ctx, s.Lease())
	x.logf("    revoke a%d's lease %x: %v", a.id, int64(s.Lease()), err)
	if err == nil {
		ended(resp.Header.Revision)
	}
}

// pages are the sizes of the first page of a queue's reads: 8 keys for an
// exclusive waiter, 64 for a reader or permits. A queue read spans pages
// when the keys of nested locks fill one.
var pages = []int{8, 64}

// nestedCount draws how many nested keys to put at once: a few, or about a
// page's worth, so that the next read of the queue needs a second page.
func (x *schedule) nestedCount(draw int) int {
	if draw%3 != 0 {
		return 1 + draw%12
	}
	return pages[draw/3%len(pages)] - 1 + draw/6%4
}

// putNested puts n nested keys in one Txn.
func (x *schedule) putNested(ctx context.Context, n int) error {
	var ops []clientv3.Op
	x.mu.Lock()
	for range n {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/sub/k%03d", x.name, x.nested), ""))
		x.nested++
	}
	x.mu.Unlock()
	_, err := x.admin.Txn(ctx).Then(ops...).Commit()
	return err
}

// memberStops serialises the schedules' stops and restarts of members.
var memberStops sync.Mutex

// quickOp runs another actor's quick operation (a Try form, a release),
// from within target's RPC: an actor with no operation in flight.
func (x *schedule) quickOp(ctx context.Context, target *actor, d draws) {
	x.quickOpNamed(ctx, target, d, x.k.quick[d.pick%len(x.k.quick)])
}

// quickOpNamed is quickOp with the operation given: it returns the actor
// that ran it and its result (nil, nil when no actor was free).
func (x *schedule) quickOpNamed(ctx context.Context, target *actor, d draws, name string) (*actor, error) {
	var op exploreOp
	for _, o := range x.k.ops {
		if o.name == name {
			op = o
		}
	}
	// A Campaign here must not wait: a short ctx.
	ctx, cancel := context.WithCancel(ctx)
	if name == "Campaign" {
		ctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	}
	f := &inflight{name: name, op: op, cancel: cancel, done: make(chan error, 1), rev: x.revision(), reqs: x.requestCount(), began: time.Now()}
	// The actor is taken in the same critical section that finds it idle:
	// the step's own operation may be starting on it at this moment (see
	// start), and one of the two would otherwise overwrite the other's
	// inflight, which teardown then never cancels.
	var b *actor
	for i := range x.actors {
		c := x.actors[(d.pick2+i)%len(x.actors)]
		c.mu.Lock()
		idle := c != target && c.op == nil && c.s != nil && c.s.Err() == nil
		if idle {
			c.op = f
			if op.release {
				c.held = nil
			}
		}
		c.mu.Unlock()
		if idle {
			b = c
			break
		}
	}
	if b == nil {
		cancel()
		x.logf("    (no other actor free)")
		return nil, nil
	}
	start := time.Now()
	err := op.run(ctx, b, d.pick2)
	x.logf("    a%d: %s: %v (%v)", b.id, name, err, time.Since(start).Round(time.Millisecond))
	if op.acquire && err == nil {
		x.admitted(b, name)
	}
	if name == "Campaign" && time.Since(start) > 10*time.Second {
		x.violation("a%d's Campaign with a 200ms ctx returned after %v\n%s", b.id, time.Since(start).Round(time.Millisecond), stacks())
	}
	// The step collects it, as it does any operation.
	f.done <- err
	return b, err
}

// stacks returns every goroutine's stack, for a report.
func stacks() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// observe follows the election with ObserveLeader, and checks each Leader
// it yields against etcd at the Leader's revision.
func (x *schedule) observe() {
	x.obsDone = make(chan struct{})
	go func() {
		defer close(x.obsDone)
		var last int64
		for l, err := range etcdlock.ObserveLeader(x.ctx, x.admin, x.name) {
			if err != nil {
				if x.ctx.Err() == nil {
					x.violation("Observe ended: %v", err)
				}
				return
			}
			if l.Revision <= last {
				x.violation("Observe yielded revision %d after %d", l.Revision, last)
			}
			last = l.Revision
			x.mu.Lock()
			x.leaders = append(x.leaders, l)
			x.mu.Unlock()
			x.checkLeader(l)
		}
	}()
}

// checkLeader checks l against etcd's history: at l.Revision, the oldest
// key of the election is l's, with l's value and lease.
func (x *schedule) checkLeader(l etcdlock.Leader) {
	resp, err := x.admin.Get(x.ctx, x.name+"/", clientv3.WithPrefix(), clientv3.WithRev(l.Revision),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		x.logf("  (Observe's %s at %d not checked: %v)", l.Key, l.Revision, err)
		return
	}
	var want etcdlock.Leader
	for _, kv := range resp.Kvs {
		if name, ok := etcdlock.LockOfKey(string(kv.Key)); ok && name == x.name {
			want = etcdlock.Leader{Key: string(kv.Key), Value: kv.Value, Lease: clientv3.LeaseID(kv.Lease), Token: kv.CreateRevision, ModRevision: kv.ModRevision, Version: kv.Version}
			break
		}
	}
	if want.Key != l.Key || want.Token != l.Token || string(want.Value) != string(l.Value) || want.Lease != l.Lease ||
		want.ModRevision != l.ModRevision || want.Version != l.Version {
		x.violation("Observe yielded %s (token %d, %q, mod revision %d, version %d) at revision %d, where etcd's leader was %s (token %d, %q, mod revision %d, version %d)",
			l.Key, l.Token, l.Value, l.ModRevision, l.Version, l.Revision, want.Key, want.Token, want.Value, want.ModRevision, want.Version)
	}
}

// teardown ends the schedule as a careless program would: it cancels what
// waits, releases what it believes it holds ignoring the errors, and
// checks that nothing is left held, and that every lost hold was told.
func (x *schedule) teardown() {
	// An op waits for the injection at its RPC, and stopping and
	// restarting a member takes tens of seconds on a busy machine (its
	// stop waits up to 10s for etcd to exit, its restart for a quorum):
	// the 30s an op has to return start once no injection runs.
	for _, a := range x.actors {
		a.in.Disarm()
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
		x.violation("an injection did not finish within 2 minutes\n%s", stacks())
	}
	for _, a := range x.actors {
		a.in.Disarm()
		a.endTurn()
		a.mu.Lock()
		f := a.op
		a.mu.Unlock()
		if f != nil {
			f.cancel()
			select {
			case err := <-f.done:
				x.finish(a, f, err)
			case <-time.After(30 * time.Second):
				x.violation("a%d's %s did not return within 30s of its ctx's end\n%s", a.id, f.name, stacks())
			}
		}
	}
	// Every hold whose key went was told, before anything is released
	// (a release ends a hold, and closes its Done, whatever the watch).
	x.check("before the end")
	deadline := time.Now().Add(10 * time.Second)
	for {
		x.mu.Lock()
		n := len(x.lost) + len(x.asks)
		x.mu.Unlock()
		x.checkLost(10 * time.Second)
		x.checkAsks(10 * time.Second)
		if n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	x.checkLost(0)
	x.checkAsks(10 * time.Second)
	ctx, cancel := context.WithTimeout(x.ctx, 20*time.Second)
	defer cancel()
	for _, a := range x.actors {
		a.mu.Lock()
		a.held = nil
		a.mu.Unlock()
		// Every release of the primitive: an RWMutex may hold in either
		// mode (an actor that released in the wrong one holds still).
		for _, op := range x.k.ops {
			if !op.release {
				continue
			}
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			err := op.run(rctx, a, 0)
			rcancel()
			if !errors.Is(err, etcdlock.ErrLockReleased) {
				x.logf("end: a%d: %s: %v", a.id, op.name, err)
			}
		}
	}
	x.mu.Lock()
	foreign := x.foreign
	x.mu.Unlock()
	for _, k := range foreign {
		x.admin.Delete(ctx, k)
	}
	x.admin.Revoke(ctx, x.fLease)
	x.check("at the end")

	// Nothing of a live session stays held for good.
	leases := map[int64]int{}
	for _, a := range x.actors {
		a.mu.Lock()
		if a.s != nil && a.s.Err() == nil {
			leases[int64(a.s.Lease())] = a.id
		}
		a.mu.Unlock()
	}
	var left []string
	for ctx.Err() == nil {
		resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix())
		left = left[:0]
		if err == nil {
			for _, kv := range resp.Kvs {
				// A key of a hold before a restart stays with the lease
				// until a lock of its name or the session's end takes it
				// (WithLease): no actor here locks again.
				if id, ok := leases[kv.Lease]; ok && kv.CreateRevision > x.restarted[kv.Lease] {
					left = append(left, fmt.Sprintf("%s (a%d)", kv.Key, id))
				}
			}
			if len(left) == 0 {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(left) > 0 {
		x.violation("20s after every actor released, keys of live sessions are left: %v", left)
	}
	if x.k.delay {
		x.endInherited(ctx, leases)
		x.lastLock()
	}
	x.cancel()
	if x.obsDone != nil {
		<-x.obsDone
	}
	if x.delayDone != nil {
		<-x.delayDone
	}
	for _, a := range x.actors {
		for _, s := range a.sessions {
			s.Close()
		}
		a.cli.Close()
	}
	x.admin.Delete(context.Background(), x.name+"/", clientv3.WithPrefix())
	// The delay records too: one that no delay started has no lease, and
	// would stay for good.
	x.admin.Delete(context.Background(), etcdlock.LockDelayPrefix+x.name+"/", clientv3.WithPrefix())
}

// The lock delay (the MutexDelay schedules). A hold with a delay leaves
// its record, LockDelayPrefix + its key, when it ends without Unlock: a
// pending delay, which keeps out every hold with a delay behind it until
// a waiter has started it, as a lease with the record's TTL, and etcd
// has ended that lease. The faults that end holds (a deleted key, a
// revoked lease) make delays pending; the checker looks at each hold
// that an acquisition returns (admitted) and at the delays themselves
// (watchDelays, lastLock).

// delayMet counts what schedules met of the lock delay: a checker is
// only as good as the cases it sees.
type delayMet struct {
	runs    int // schedules
	pending int // delays a fault made pending
	started int // delays started (a record moved onto a lease)
	// waited counts the pending delays of holds that had returned, after
	// which a later hold was admitted, checked to have waited the delay
	// out; near those admitted less than twice the delay after the fault.
	waited, near int
	checked      int // admissions checked at their header's revision
	unread       int // admissions not checked: their revision was compacted
	minHolds     int // admissions checked against the minimum holds before them
	minNear      int // of those, admissions less than twice a minimum hold after an older hold was asked for
	maxHolds     int // holds returned, checked to be bound to a max hold lease
	maxLost      int // operations that returned a hold's loss to its max hold
	// Schedules in which a fault made a delay pending, a delay started,
	// a hold was admitted after one.
	runsPending, runsStarted, runsWaited int
}

func (m *delayMet) add(o delayMet) {
	m.runs++
	m.pending += o.pending
	m.started += o.started
	m.waited += o.waited
	m.near += o.near
	m.checked += o.checked
	m.unread += o.unread
	m.minHolds += o.minHolds
	m.minNear += o.minNear
	m.maxHolds += o.maxHolds
	m.maxLost += o.maxLost
	for _, c := range []struct {
		n    int
		runs *int
	}{{o.pending, &m.runsPending}, {o.started, &m.runsStarted}, {o.waited, &m.runsWaited}} {
		if c.n > 0 {
			*c.runs++
		}
	}
}

func (m *delayMet) String() string {
	return fmt.Sprintf("of %d schedules, %d had delays made pending (%d delays), %d had delays started (%d), "+
		"%d had holds admitted after one (%d delays, %d of them less than twice the delay after the fault); "+
		"%d admissions checked at their revision, %d not (compacted); %d against the minimum holds before them (%d less than twice one after its hold was asked for); "+
		"%d holds checked to be bound to a max hold lease, %d operations returned a loss to the max hold",
		m.runs, m.runsPending, m.pending, m.runsStarted, m.started, m.runsWaited, m.waited, m.near, m.checked, m.unread, m.minHolds, m.minNear, m.maxHolds, m.maxLost)
}

// A delayRecord is a delay record as the checker reads it.
type delayRecord struct {
	key   string // the holder's key: the record's key less LockDelayPrefix
	token int64
	secs  int64
	lease int64
}

// A noted delay is one that a fault made pending: the delay of a
// record in place at the fault's revision whose key went at it.
type noted struct {
	delayRecord
	rev     int64     // the fault's revision
	at      time.Time // before the fault began
	checked bool      // a later hold was checked against it
}

// parseDelay reads a record, whose value is "<token> <seconds>", then a
// minimum hold's milliseconds if it has one, as the library does: token 0
// is the record's own create revision (a record put with its key, in one
// Txn), and a value it cannot read is a delay of a second of token 0 (a
// key that never held).
func parseDelay(kv *mvccpb.KeyValue) (token, secs int64) {
	f := strings.Fields(string(kv.Value))
	if len(f) != 2 && len(f) != 3 {
		return 0, 1
	}
	token, err1 := strconv.ParseInt(f[0], 10, 64)
	secs, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil || token < 0 || secs < 1 {
		return 0, 1
	}
	if token == 0 {
		token = kv.CreateRevision
	}
	return token, secs
}

// pendingAt returns the pending delays of the schedule's lock at rev (0:
// now), by record key: its records (direct children of its delay prefix
// only) whose key is not in place with the record's token as its create
// revision.
func (x *schedule) pendingAt(ctx context.Context, rev int64) (map[string]delayRecord, error) {
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	pfx := etcdlock.LockDelayPrefix + x.name + "/"
	resp, err := x.admin.Txn(ctx).Then(
		clientv3.OpGet(x.name+"/", append(opts, clientv3.WithKeysOnly())...),
		clientv3.OpGet(pfx, opts...),
	).Commit()
	if err != nil {
		return nil, err
	}
	created := map[string]int64{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		created[string(kv.Key)] = kv.CreateRevision
	}
	pending := map[string]delayRecord{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if rest := strings.TrimPrefix(string(kv.Key), pfx); rest == "" || strings.Contains(rest, "/") {
			continue // a nested lock's
		}
		r := delayRecord{key: strings.TrimPrefix(string(kv.Key), etcdlock.LockDelayPrefix), lease: kv.Lease}
		r.token, r.secs = parseDelay(kv)
		if c, ok := created[r.key]; !ok || c != r.token {
			pending[string(kv.Key)] = r
		}
	}
	return pending, nil
}

// delayFault is called before a fault that may end holds (a deletion, a
// revoke): it reads the delays pending now, and returns what to call with
// the fault's revision, which notes the delays pending at it and not now.
// A fault ends a hold at one revision, so those are the fault's doing,
// begun after the time it notes.
func (x *schedule) delayFault(ctx context.Context) func(rev int64) {
	if !x.k.delay {
		return func(int64) {}
	}
	at := time.Now()
	before, err := x.pendingAt(ctx, 0)
	if err != nil {
		x.logf("    (delays not read: %v)", err)
		return func(int64) {}
	}
	return func(rev int64) {
		after, err := x.pendingAt(ctx, rev)
		if err != nil {
			x.logf("    (delays not read at %d: %v)", rev, err)
			return
		}
		x.mu.Lock()
		defer x.mu.Unlock()
		for k, r := range after {
			if b, ok := before[k]; ok && b.token == r.token {
				continue
			}
			x.pending = append(x.pending, &noted{delayRecord: r, rev: rev, at: at})
			x.met.pending++
			x.log = append(x.log, fmt.Sprintf("    the delay of %s (token %d, %ds) is pending at rev %d", r.key, r.token, r.secs, rev))
		}
	}
}

// admitted checks the hold that a's acquisition (by) has just returned,
// in a kind with a delay, against etcd at the revision of the hold's
// header, where the library admitted it.
func (x *schedule) admitted(a *actor, by string) {
	if !x.k.delay && x.k.maxHold == nil {
		return
	}
	a.mu.Lock()
	m, ok := a.p.(*etcdlock.Mutex)
	if !ok {
		a.mu.Unlock()
		return // a set, which honours no delay: nothing keeps it out
	}
	var began time.Time
	if a.op != nil {
		began = a.op.began
	}
	a.mu.Unlock()
	what := fmt.Sprintf("a%d's %s", a.id, by)
	if x.k.maxHold != nil {
		x.checkMaxHold(m, x.k.maxHold(a.id), what)
	}
	if !x.k.delay {
		return
	}
	x.checkAdmitted(m, what)
	if x.k.minHold != nil && !began.IsZero() {
		x.checkMinHold(m.Token(), began, x.k.minHold(a.id), what)
	}
}

// checkMaxHold checks the hold with m's token that what has just
// returned, in a kind with max hold d: its key is bound to a lease of
// its own, granted no longer than d (rounded up to seconds), not to its
// session's lease, so that etcd ends the hold by then even if the holder
// hangs. A hold whose key is already gone (a fault) has nothing to check.
func (x *schedule) checkMaxHold(m *etcdlock.Mutex, d time.Duration, what string) {
	token := m.Token()
	if token == 0 {
		return // lost and released meanwhile
	}
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	resp, err := x.admin.Get(ctx, m.Key())
	if err != nil || len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != token {
		return
	}
	lease := resp.Kvs[0].Lease
	// The key is name/<the session's lease in hex>.
	session, _ := strconv.ParseInt(m.Key()[strings.LastIndexByte(m.Key(), '/')+1:], 16, 64)
	if lease == 0 || lease == session {
		x.violation("%s returned the hold %s (token %d) bound to lease %x, not to a max hold lease of its own (its session's is %x)", what, m.Key(), token, lease, session)
		return
	}
	ttl, err := x.admin.TimeToLive(ctx, clientv3.LeaseID(lease))
	if err != nil || ttl.TTL < 0 {
		return // it has ended: the key goes with it
	}
	if limit := int64(math.Ceil(d.Seconds())); ttl.GrantedTTL > limit {
		x.violation("%s returned the hold %s (token %d) bound to lease %x of TTL %ds, longer than its max hold %v", what, m.Key(), token, lease, ttl.GrantedTTL, d)
	}
	x.met.maxHolds++
}

// A minHoldHold is a hold an acquisition returned, in a kind with a
// minimum hold: its token, and when the acquisition was asked for (before
// etcd admitted it).
type minHoldHold struct {
	token   int64
	asked   time.Time
	minHold time.Duration
	what    string
}

// checkMinHold checks the hold with token that what (an acquisition asked
// for at asked) has just returned, with a minimum hold of d, against the
// holds returned before it: each older one was admitted after it was
// asked for, and no other hold may be admitted sooner than its minimum
// hold after that, so the new one may not return sooner, whatever
// happened to the older (an Unlock, a Close, a fault). Only a hold
// returned too soon is reported: a check that cannot misfire.
func (x *schedule) checkMinHold(token int64, asked time.Time, d time.Duration, what string) {
	now := time.Now()
	x.mu.Lock()
	var early []string
	near := false
	for _, h := range x.minHolds {
		near = near || h.token < token && now.Before(h.asked.Add(2*h.minHold))
		if h.token < token && now.Before(h.asked.Add(h.minHold)) {
			early = append(early, fmt.Sprintf("%s returned a hold (token %d) %v after %s asked for the hold of token %d, before its minimum hold of %v",
				what, token, now.Sub(h.asked).Round(time.Millisecond), h.what, h.token, h.minHold))
		}
	}
	x.minHolds = append(x.minHolds, minHoldHold{token: token, asked: asked, minHold: d, what: what})
	x.met.minHolds++
	if near {
		x.met.minNear++
	}
	x.mu.Unlock()
	for _, e := range early {
		x.violation("%s", e)
	}
}

// checkAdmitted checks the hold of m, a lock with a delay, that what (an
// acquisition) has just returned, against etcd at the revision of the
// hold's header, where the library admitted it:
//
//   - no delay of an older hold was pending there: no record with a
//     token below the hold's whose key was gone, or had another create
//     revision;
//   - a hold admitted after a fault that ended an older hold (one whose
//     acquisition had returned) with its record in place came no sooner
//     than that record's delay after the fault: the delay's lease is
//     granted after the key went, and etcd ends it by the clock of this
//     process, the explorer's.
func (x *schedule) checkAdmitted(m *etcdlock.Mutex, what string) {
	now := time.Now()
	token, hdr := m.Token(), m.Header()
	x.mu.Lock()
	x.returned[token] = true
	x.mu.Unlock()
	if hdr == nil {
		x.logf("  (%s: no header to check)", what)
		return
	}
	ctx, cancel := context.WithTimeout(x.ctx, 10*time.Second)
	defer cancel()
	pending, err := x.pendingAt(ctx, hdr.Revision)
	x.mu.Lock()
	if err != nil {
		x.met.unread++
	} else {
		x.met.checked++
	}
	x.mu.Unlock()
	if err != nil {
		x.logf("  (%s's hold (token %d) not checked at rev %d: %v)", what, token, hdr.Revision, err)
	}
	for _, r := range pending {
		if r.token < token {
			x.violation("%s returned a hold (token %d) admitted at rev %d, where the delay of %s (token %d, %ds, lease %x) was pending",
				what, token, hdr.Revision, r.key, r.token, r.secs, r.lease)
		}
	}
	var early []string
	x.mu.Lock()
	for _, p := range x.pending {
		if p.token >= token || p.rev >= hdr.Revision || !x.returned[p.token] {
			continue
		}
		d := time.Duration(p.secs) * time.Second
		waited := now.Sub(p.at)
		if !p.checked {
			p.checked = true
			x.met.waited++
			if waited < 2*d {
				x.met.near++
			}
			x.log = append(x.log, fmt.Sprintf("  %s: the hold (token %d) came %v after the fault that made the delay of %s (token %d) pending",
				what, token, waited.Round(time.Millisecond), p.key, p.token))
		}
		if waited < d {
			early = append(early, fmt.Sprintf("%s returned a hold (token %d, admitted at rev %d) %v after a fault ended the hold of %s (token %d) at rev %d, before its delay of %v",
				what, token, hdr.Revision, waited.Round(time.Millisecond), p.key, p.token, p.rev, d))
		}
	}
	x.mu.Unlock()
	for _, e := range early {
		x.violation("%s", e)
	}
}

// watchDelays follows the lock's delay records: it counts the delays
// started (a record put on a lease), and checks that each lease lasts at
// least the delay its record asks for (etcd raises a TTL below its least
// to it, and never lowers one).
func (x *schedule) watchDelays() {
	x.delayDone = make(chan struct{})
	pfx := etcdlock.LockDelayPrefix + x.name + "/"
	wch := x.admin.Watch(x.ctx, pfx, clientv3.WithPrefix())
	go func() {
		defer close(x.delayDone)
		for wr := range wch {
			for _, ev := range wr.Events {
				x.mu.Lock()
				if ev.Type != mvccpb.PUT || ev.Kv.Lease == 0 {
					delete(x.running, string(ev.Kv.Key))
					x.mu.Unlock()
					continue
				}
				x.running[string(ev.Kv.Key)] = true
				x.met.started++
				x.mu.Unlock()
				_, secs := parseDelay(ev.Kv)
				x.logf("  the delay of %s (%s) started at rev %d: lease %x",
					strings.TrimPrefix(string(ev.Kv.Key), etcdlock.LockDelayPrefix), ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.Lease)
				ttl, err := x.admin.TimeToLive(x.ctx, clientv3.LeaseID(ev.Kv.Lease))
				if err == nil && ttl.TTL >= 0 && ttl.GrantedTTL < secs { // TTL -1: the lease has ended
					x.violation("the delay of %s (%s) started with lease %x of TTL %ds", ev.Kv.Key, ev.Kv.Value, ev.Kv.Lease, ttl.GrantedTTL)
				}
			}
		}
	}()
}

// awaitDelays lets the delays that have started end, when an actor waits
// to acquire: a step takes far less than the least delay (1s), so that
// otherwise a waiter would seldom see one end, nor meet a fault as it
// goes on after it; the armed fault may hit the RPCs that follow. It
// reports whether it waited. A delay that does not end is the last
// Lock's to find (lastLock).
func (x *schedule) awaitDelays() bool {
	waiting := false
	for _, a := range x.actors {
		a.mu.Lock()
		waiting = waiting || a.op != nil && a.op.op.acquire || a.op != nil && a.op.name == "Do" && a.held == nil
		a.mu.Unlock()
	}
	running := func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		return len(x.running) > 0
	}
	if !waiting || !running() {
		return false
	}
	start := time.Now()
	for running() && time.Since(start) < 5*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	x.logf("  (the delays started ended, or not, in %v)", time.Since(start).Round(time.Millisecond))
	return true
}

// lastLock takes the lock once more, on a session of its own, once every
// actor has released: whatever delays the schedule left, started or not,
// must end, so that it is had within 30s (the longest delay is 2s).
// endInherited closes each live session that still has keys of holds
// from before its restart: they stay queued while the session keeps the
// lease alive (WithLease documents it), so the last Lock would wait for
// them for good. Ending the session is the way out WithLease names; the
// holds ended without Unlock, so their lock delays are owed.
func (x *schedule) endInherited(ctx context.Context, leases map[int64]int) {
	resp, err := x.admin.Get(ctx, x.name+"/", clientv3.WithPrefix())
	if err != nil {
		x.logf("end: (inherited keys not read: %v)", err)
		return
	}
	ended := map[int64]bool{}
	for _, kv := range resp.Kvs {
		id, ok := leases[kv.Lease]
		if !ok || ended[kv.Lease] || kv.CreateRevision > x.restarted[kv.Lease] {
			continue
		}
		ended[kv.Lease] = true
		a := x.actors[id]
		a.mu.Lock()
		s := a.s
		a.mu.Unlock()
		x.logf("end: a%d's session closed: it keeps %s from before its restart", id, kv.Key)
		s.Close()
	}
}

func (x *schedule) lastLock() {
	ctx, cancel := context.WithTimeout(x.ctx, 30*time.Second)
	defer cancel()
	s, err := etcdlock.NewSession(ctx, x.admin)
	if err != nil {
		x.logf("end: the last Lock's session: %v", err)
		return
	}
	defer s.Close()
	pending, err := x.pendingAt(ctx, 0)
	if err != nil {
		x.logf("end: (delays not read: %v)", err)
	}
	m := etcdlock.NewMutex(s, x.name, etcdlock.WithLockDelay(time.Second))
	start := time.Now()
	err = m.Lock(ctx)
	x.logf("end: Lock, with %d delays pending: %v (%v)", len(pending), err, time.Since(start).Round(time.Millisecond))
	if err != nil {
		x.violation("a Lock after every actor released, with %d delays pending, returned %v after %v", len(pending), err, time.Since(start).Round(time.Millisecond))
		return
	}
	x.checkAdmitted(m, "the last Lock")
	if x.k.minHold != nil {
		x.checkMinHold(m.Token(), start, 0, "the last Lock")
	}
	if err := m.Unlock(ctx); err != nil {
		x.logf("end: Unlock: %v", err)
	}
}
