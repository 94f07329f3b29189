package main

// TestShardsProcesses (issue 42): 64 shards over replica processes of
// 'etcdlock shards' on a three-member etcd, through joins, a SIGKILL and a
// drain. It fails on an overlap or a token that does not rise, or a set
// that does not settle; it reports what each change cost.

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	procShards = 64
	procTTL    = 5 * time.Second
	// settleBound bounds every wait for the set to settle: generous, for
	// two loaded cores running -race (a graceful change settles in about
	// a second there, a SIGKILL in about the TTL).
	settleBound = 6 * procTTL
)

// A shardsFleet is the replicas of one shard set, and what the test knows
// of them.
type shardsFleet struct {
	t       *testing.T
	cli     *clientv3.Client
	eps     string
	name    string
	log     string
	script  string
	procs   map[string]*proc  // by member ID: the live replicas
	drained map[string]bool   // by member ID
	killed  map[int]time.Time // by pid of a killed replica's CMD: when first seen gone
	// vanished are the CMDs that ended without an "end" line (SIGTERM
	// before the trap was set, or SIGKILL), by pid: when first seen gone.
	vanished map[int]time.Time
}

func TestShardsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of processes")
	}
	began := time.Now()
	c := etcdtest.Start(t, 3)
	dir := t.TempDir()
	f := &shardsFleet{t: t, cli: c.Client(t), eps: strings.Join(c.Endpoints(), ","), name: "cmdtest/shards-processes",
		log: filepath.Join(dir, "log"), script: writeScript(t, dir, "shard.sh", shardScript),
		procs: map[string]*proc{}, drained: map[string]bool{}, killed: map[int]time.Time{}, vanished: map[int]time.Time{}}

	owners := map[int]string{}
	for _, m := range []int{1, 2, 5, 8} {
		at := time.Now()
		for len(f.procs) < m {
			f.start()
		}
		owners = f.settled(fmt.Sprintf("%d → %d replicas", f.before(owners), m), at, owners)
	}

	f.rpcsAtRest(c)

	// SIGKILL one replica: its CMDs die with it (the supervisors), and its
	// shards start elsewhere once its lease has expired, about the TTL.
	owners = f.kill(owners)

	at := time.Now()
	f.start()
	owners = f.settled("one added (7 → 8)", at, owners)

	var drain string
	for id := range f.procs {
		drain = id
		break
	}
	at = time.Now()
	r := runProc(t, nil, "shards", "drain", "--endpoints="+f.eps, f.name, drain)
	require.Equal(t, 0, r.code, r.stderr)
	f.drained[drain] = true
	f.settled("one drained (8 → 7 owning)", at, owners)

	// SIGTERM to every replica: each stops its CMDs, releases and exits 0.
	for _, p := range f.procs {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for id, p := range f.procs {
		require.Equal(t, 0, p.wait(t), "replica %s:\n%s", id, p.stderr)
	}
	evs := readShardLog(t, f.log)
	require.Empty(t, f.alive(evs), "CMDs still run after every replica left")
	f.checkLog(evs)
	t.Logf("%d CMD starts in all; the test took %v", countStarts(evs), time.Since(began).Round(100*time.Millisecond))
}

// before returns how many replicas owned shards in owners.
func (f *shardsFleet) before(owners map[int]string) int {
	seen := map[string]bool{}
	for _, o := range owners {
		seen[o] = true
	}
	return len(seen)
}

// start starts a replica and waits until it is a member; it returns its
// member ID.
func (f *shardsFleet) start() string {
	t := f.t
	t.Helper()
	// A program built with -race sleeps a second at exit (GORACE's
	// atexit_sleep_ms): each supervisor would, and every hand-over with it.
	gorace := strings.TrimSpace(os.Getenv("GORACE") + " atexit_sleep_ms=0")
	p := startProc(t, []string{"LOG=" + f.log, "GORACE=" + gorace}, "shards", "--endpoints="+f.eps, "--ttl", procTTL.String(), "--quiet",
		f.name, "--count", strconv.Itoa(procShards), "--", f.script)
	deadline := time.Now().Add(settleBound)
	for {
		set := f.inspect()
		for _, m := range set.Members {
			if rec, ok := parseRunRecord(m.Identity); ok && rec.PID == p.cmd.Process.Pid {
				f.procs[m.ID] = p
				return m.ID
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica pid %d did not join within %v:\n%s", p.cmd.Process.Pid, settleBound, p.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (f *shardsFleet) inspect() *etcdlock.ShardSet {
	f.t.Helper()
	set, err := etcdlock.InspectShards(f.t.Context(), f.cli, f.name, procShards)
	require.NoError(f.t, err)
	return set
}

// owning returns the live replicas that are not drained, sorted.
func (f *shardsFleet) owning() []string {
	var ids []string
	for id := range f.procs {
		if !f.drained[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// isSettled reports whether the set is settled over the live replicas:
// its members are they, every shard is owned where the assignment puts
// it, each replica not drained owns ⌊64/m⌋ or ⌈64/m⌉ and a drained one
// none, and the log agrees: each shard runs one CMD, its owner's, with
// its owner's token. It returns the owners.
func (f *shardsFleet) isSettled(set *etcdlock.ShardSet, evs []shardEvent) (map[int]string, string) {
	if len(set.Members) != len(f.procs) {
		return nil, fmt.Sprintf("%d members, %d replicas", len(set.Members), len(f.procs))
	}
	m := len(f.owning())
	lo, hi := procShards/m, (procShards+m-1)/m
	for _, mb := range set.Members {
		if f.procs[mb.ID] == nil {
			return nil, "member " + mb.ID + " is no live replica"
		}
		if f.drained[mb.ID] && mb.Owns != 0 || !f.drained[mb.ID] && (mb.Owns < lo || mb.Owns > hi) {
			return nil, fmt.Sprintf("member %s owns %d", mb.ID, mb.Owns)
		}
	}
	owners := map[int]string{}
	for _, sh := range set.Shards {
		if sh.Owner == "" || sh.Moving() {
			return nil, fmt.Sprintf("shard %d: owner %q, assigned %q", sh.Num, sh.Owner, sh.Assigned)
		}
		owners[sh.Num] = sh.Owner
	}
	per := map[int][]shardEvent{}
	for _, e := range f.alive(evs) {
		per[e.shard] = append(per[e.shard], e)
	}
	for _, sh := range set.Shards {
		run := per[sh.Num]
		if len(run) != 1 || run[0].lease != sh.Owner || run[0].token != sh.Token {
			return nil, fmt.Sprintf("shard %d (owner %s, token %d) runs %+v", sh.Num, sh.Owner, sh.Token, run)
		}
	}
	return owners, ""
}

// alive returns the CMDs of the log that started and have not ended, not
// counting those of a killed replica (seen gone), nor those that ended
// without a line (seen gone, vanished).
func (f *shardsFleet) alive(evs []shardEvent) []shardEvent {
	var out []shardEvent
	for pid, e := range running(evs) {
		_, killed := f.killed[pid]
		_, vanished := f.vanished[pid]
		if !killed && !vanished {
			out = append(out, e)
		}
	}
	return out
}

// sweep records the CMDs that the log says run but the process table
// does not have: they ended without their "end" line.
func (f *shardsFleet) sweep(evs []shardEvent) {
	now := time.Now()
	for _, e := range f.alive(evs) {
		if !procRunning(e.pid) {
			f.vanished[e.pid] = now
		}
	}
}

// settled waits until the set settles after the change made at at, and
// reports how long that took, how many shards moved against the fewest
// that could, and the handover gaps of the moves. It returns the owners.
func (f *shardsFleet) settled(change string, at time.Time, before map[int]string) map[int]string {
	t := f.t
	t.Helper()
	var (
		owners map[int]string
		why    string
		evs    []shardEvent
	)
	for deadline := time.Now().Add(settleBound); ; time.Sleep(25 * time.Millisecond) {
		evs = readShardLog(t, f.log)
		f.sweep(evs)
		if owners, why = f.isSettled(f.inspect(), evs); owners != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not settled %v after the change: %s%s", change, settleBound, why, f.stderrs())
		}
	}
	seen := time.Now()
	moved, gaps, last := 0, []time.Duration{}, at
	for i, o := range owners {
		start := lastStart(evs, i)
		last = maxTime(last, start.at)
		if before[i] == o {
			continue
		}
		moved++
		if before[i] != "" && !f.wasKilled(before[i]) {
			if end, ok := endOf(evs, i, before[i], start.at); ok {
				gaps = append(gaps, start.at.Sub(end.at))
			}
		}
	}
	t.Logf("%s: settled %v after the change (the last CMD started then; seen settled at %v); %d shards moved, the fewest possible %d%s",
		change, last.Sub(at).Round(time.Millisecond), seen.Sub(at).Round(time.Millisecond), moved, fewestMoves(before, f.owning()), gapText(gaps))
	return owners
}

// stderrs returns what the live replicas said on stderr, for a failure.
func (f *shardsFleet) stderrs() string {
	var b strings.Builder
	for id, p := range f.procs {
		fmt.Fprintf(&b, "\nreplica %s (pid %d) said:\n%s", id, p.cmd.Process.Pid, p.stderr)
	}
	return b.String()
}

// wasKilled reports whether member id was killed.
func (f *shardsFleet) wasKilled(id string) bool {
	return f.procs[id] == nil && !f.drained[id]
}

// lastStart returns the last start of shard i in the log.
func lastStart(evs []shardEvent, i int) shardEvent {
	var s shardEvent
	for _, e := range evs {
		if e.start && e.shard == i {
			s = e
		}
	}
	return s
}

// endOf returns the last end of shard i by member id before t.
func endOf(evs []shardEvent, i int, id string, t time.Time) (shardEvent, bool) {
	var end shardEvent
	ok := false
	for _, e := range evs {
		if !e.start && e.shard == i && e.lease == id && e.at.Before(t) {
			end, ok = e, true
		}
	}
	return end, ok
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// fewestMoves is the fewest shards that must change owner for owners to
// become balanced over members: each keeps at most its new share, and
// the n mod m larger shares go to those that own the most.
func fewestMoves(owners map[int]string, members []string) int {
	if len(owners) == 0 {
		return procShards
	}
	m := len(members)
	q, r := procShards/m, procShards%m
	var counts []int
	for _, id := range members {
		n := 0
		for _, o := range owners {
			if o == id {
				n++
			}
		}
		counts = append(counts, n)
	}
	slices.SortFunc(counts, func(a, b int) int { return cmp.Compare(b, a) })
	keep := 0
	for i, c := range counts {
		share := q
		if i < r {
			share++
		}
		keep += min(c, share)
	}
	return procShards - keep
}

// gapText tells the handover gaps: median and max.
func gapText(gaps []time.Duration) string {
	if len(gaps) == 0 {
		return ""
	}
	slices.Sort(gaps)
	return fmt.Sprintf("; handover gap (old owner's CMD ended → new owner's started) median %v, max %v over %d",
		gaps[len(gaps)/2].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond), len(gaps))
}

// kill kills one replica with SIGKILL and follows, until the set settles
// again: its CMDs (and their children, and the supervisors) in the
// process table, which must all be gone before any of its shards starts
// elsewhere; and its lease, which must have expired before then. It
// reports the time from the kill to the lease's end and to the shards'
// restarts.
func (f *shardsFleet) kill(owners map[int]string) map[int]string {
	t := f.t
	t.Helper()
	var id string
	for o := range f.procs {
		id = o
		break
	}
	victim := f.procs[id]
	mine := map[int]shardEvent{} // by shard: its CMD on the victim
	cmds := map[int]bool{}       // the victim's CMDs
	var pids []int               // they, their children, their supervisors
	for _, e := range f.alive(readShardLog(t, f.log)) {
		if e.lease == id {
			mine[e.shard], cmds[e.pid] = e, true
			pids = append(pids, e.pid, parentOf(t, e.pid))
			pids = append(pids, childrenOf(e.pid)...)
		}
	}
	require.NotEmpty(t, mine)
	lease, err := strconv.ParseInt(id, 16, 64)
	require.NoError(t, err)

	// Watch the process table and the lease from the kill on.
	var (
		mu        sync.Mutex
		lastAlive = map[int]time.Time{} // pid → last seen running
		firstGone = map[int]time.Time{} // pid → first seen gone
		leaseSeen time.Time             // the lease last seen alive
		leaseGone time.Time             // first seen gone
		keyGone   time.Time             // its membership key's delete seen
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(3)
	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	wch := f.cli.Watch(wctx, f.name+"/members/"+id, clientv3.WithFilterPut())
	go func() {
		defer wg.Done()
		for wr := range wch {
			if len(wr.Events) > 0 {
				mu.Lock()
				keyGone = time.Now()
				mu.Unlock()
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			now := time.Now()
			left := 0
			mu.Lock()
			for _, pid := range pids {
				if _, ok := firstGone[pid]; ok {
					continue
				}
				if procRunning(pid) {
					lastAlive[pid] = now
					left++
				} else {
					firstGone[pid] = now
				}
			}
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if left == 0 {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for {
			now := time.Now()
			resp, err := f.cli.TimeToLive(t.Context(), clientv3.LeaseID(lease))
			if err == nil {
				mu.Lock()
				if resp.TTL > 0 {
					leaseSeen = now
				} else if leaseGone.IsZero() {
					leaseGone = time.Now()
				}
				gone := !leaseGone.IsZero()
				mu.Unlock()
				if gone {
					return
				}
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	killedAt := time.Now()
	require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
	<-victim.exited
	delete(f.procs, id)
	for pid := range cmds {
		f.killed[pid] = time.Time{}
	}
	next := f.settled("one killed with SIGKILL (8 → 7)", killedAt, owners)
	close(done)
	cancel()
	wg.Wait()

	require.False(t, leaseGone.IsZero(), "the killed replica's lease never went")
	evs := readShardLog(t, f.log)
	var restarts []time.Duration
	first := time.Time{}
	for i, e := range mine {
		start := firstStartAfter(evs, i, killedAt)
		require.False(t, start.at.IsZero(), "shard %d did not start again", i)
		require.NotEqual(t, id, start.lease)
		require.Greater(t, start.token, e.token, "shard %d: the token did not rise past the killed hold's", i)
		if first.IsZero() || start.at.Before(first) {
			first = start.at
		}
		restarts = append(restarts, start.at.Sub(killedAt))
		// Never sooner than the killed hold's key was gone: its lease
		// was still seen alive before the restart, never after.
		require.True(t, leaseSeen.Before(start.at), "shard %d started again at %v, while the killed replica's lease was seen alive at %v", i, start.at, leaseSeen)
	}
	for _, pid := range pids {
		gone, ok := firstGone[pid]
		require.True(t, ok, "pid %d of the killed replica never went", pid)
		require.True(t, gone.Before(first), "pid %d of the killed replica was still running at %v, after its shard started elsewhere at %v", pid, lastAlive[pid], first)
		if cmds[pid] {
			f.killed[pid] = gone
		}
	}
	slices.Sort(restarts)
	var goneBy time.Duration
	for _, g := range firstGone {
		goneBy = max(goneBy, g.Sub(killedAt))
	}
	require.False(t, keyGone.IsZero(), "the killed replica's membership key was never seen deleted")
	t.Logf("  SIGKILL: its %d CMDs, their children and supervisors (%d processes) gone %v after the kill; its lease seen expired %v after, its keys seen deleted %v after (--ttl %v); its shards started again %v after the kill (median), %v (max), each with a higher token",
		len(mine), len(pids), goneBy.Round(time.Millisecond), leaseGone.Sub(killedAt).Round(time.Millisecond), keyGone.Sub(killedAt).Round(time.Millisecond), procTTL,
		restarts[len(restarts)/2].Round(time.Millisecond), restarts[len(restarts)-1].Round(time.Millisecond))
	return next
}

// firstStartAfter returns the first start of shard i after t.
func firstStartAfter(evs []shardEvent, i int, t time.Time) shardEvent {
	for _, e := range evs {
		if e.start && e.shard == i && e.at.After(t) {
			return e
		}
	}
	return shardEvent{}
}

// procRunning reports whether pid runs: it is in the process table and
// not a zombie (killed, not yet reaped: it runs nothing).
func procRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	rest := s[strings.LastIndexByte(s, ')')+1:]
	return !strings.HasPrefix(strings.TrimSpace(rest), "Z")
}

// checkLog fails the test on an overlap in the whole log: a shard's CMD
// that started while another CMD of the shard had not ended (a killed
// replica's CMD ends when it was first seen gone), or a shard's token that
// did not rise from one hold to the next.
func (f *shardsFleet) checkLog(evs []shardEvent) {
	t := f.t
	t.Helper()
	for pid, gone := range f.killed {
		require.False(t, gone.IsZero(), "pid %d of the killed replica was never seen gone", pid)
		e := running(evs)[pid]
		evs = append(evs, shardEvent{shard: e.shard, token: e.token, pid: pid, at: gone, lease: e.lease})
	}
	for pid, gone := range f.vanished {
		e, ok := running(evs)[pid]
		if !ok {
			delete(f.vanished, pid) // its end line came after the sweep read the log
			continue
		}
		t.Logf("  pid %d, shard %d's CMD on %s (token %d), ended without its end line: first seen gone %v after it started",
			pid, e.shard, e.lease, e.token, gone.Sub(e.at).Round(time.Millisecond))
		evs = append(evs, shardEvent{shard: e.shard, token: e.token, pid: pid, at: gone, lease: e.lease})
	}
	slices.SortStableFunc(evs, func(a, b shardEvent) int { return a.at.Compare(b.at) })
	run := map[int]map[int]shardEvent{} // shard → pid → its start
	last := map[int]shardEvent{}        // shard → the last start
	for _, e := range evs {
		if run[e.shard] == nil {
			run[e.shard] = map[int]shardEvent{}
		}
		if !e.start {
			delete(run[e.shard], e.pid)
			continue
		}
		for _, o := range run[e.shard] {
			if _, ok := f.vanished[o.pid]; ok && o.lease == e.lease && o.token == e.token {
				// The same hold starts CMD again only once the CMD before
				// has exited and its supervisor with it; when exactly it
				// exited, without its line, the log cannot tell.
				continue
			}
			t.Errorf("overlap: shard %d started on %s (pid %d, token %d) at %v while pid %d of %s (token %d) ran it", e.shard, e.lease, e.pid, e.token, e.at, o.pid, o.lease, o.token)
		}
		if l, ok := last[e.shard]; ok && (e.token < l.token || e.token == l.token && e.lease != l.lease) {
			t.Errorf("shard %d: token %d on %s after token %d on %s: it did not rise", e.shard, e.token, e.lease, l.token, l.lease)
		}
		run[e.shard][e.pid], last[e.shard] = e, e
	}
}

func countStarts(evs []shardEvent) int {
	n := 0
	for _, e := range evs {
		if e.start {
			n++
		}
	}
	return n
}

// rpcsAtRest reports the RPCs the etcd members handle for the replicas at
// rest: the gRPC messages they received (a unary RPC is one, as is each
// keepalive and each watch request on a stream) over 10 seconds, summed
// over the members, from each member's /metrics.
func (f *shardsFleet) rpcsAtRest(c *etcdtest.Cluster) {
	t := f.t
	t.Helper()
	const window = 10 * time.Second
	time.Sleep(time.Second) // the last hand-over's writes done
	read := func() map[string]float64 {
		sum := map[string]float64{}
		for _, ep := range c.Endpoints() {
			for m, v := range grpcReceived(t, ep) {
				sum[m] += v
			}
		}
		return sum
	}
	before := read()
	time.Sleep(window)
	after := read()
	var total float64
	var methods []string
	for m, v := range after {
		if d := (v - before[m]) / window.Seconds(); d > 0 {
			total += d
			methods = append(methods, fmt.Sprintf("%s %.1f/s", m, d))
		}
	}
	slices.Sort(methods)
	t.Logf("at rest, %d shards over %d replicas (--ttl %v): etcd received %.1f RPCs/s over its 3 members, keepalives counted (%s)",
		procShards, len(f.procs), procTTL, total, strings.Join(methods, ", "))
}

// grpcReceived reads grpc_server_msg_received_total of the member at ep,
// summed by method.
func grpcReceived(t *testing.T, ep string) map[string]float64 {
	return grpcCounter(t, ep, "grpc_server_msg_received_total")
}
