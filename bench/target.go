package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// A Summary is the median, over rounds, of each per-operation figure of one
// implementation in one scenario, as benchstat reports medians.
type Summary struct {
	Rounds                 int
	NsPerOp                float64
	MinNsPerOp, MaxNsPerOp float64
	RPCsPerOp              float64 // lease keepalives excluded
	KeepAlivesPerOp        float64
	RevsPerOp              float64
	AllocsPerOp            float64
	BytesPerOp             float64
	ServerCPUPerOp         float64     // ns of the etcd members' CPU
	ClientCPUPerOp         float64     // ns of the clients' CPU
	ReleasePerOp           float64     // ns in Unlock (see Result.Release)
	Queue                  *QueueCost  // medians; nil but for FIFO scenarios
	Server                 *ServerCost // medians; nil but where measured
}

// Summarize returns the medians of rs, one Result per round.
func Summarize(rs []Result) Summary {
	med := func(f func(Result) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	s := Summary{
		Rounds:          len(rs),
		NsPerOp:         med(Result.NsPerOp),
		RPCsPerOp:       med(Result.RPCsPerOp),
		KeepAlivesPerOp: med(Result.KeepAlivesPerOp),
		RevsPerOp:       med(Result.RevsPerOp),
		AllocsPerOp:     med(Result.AllocsPerOp),
		BytesPerOp:      med(Result.BytesPerOp),
		ServerCPUPerOp:  med(Result.ServerCPUPerOp),
		ClientCPUPerOp:  med(Result.ClientCPUPerOp),
		ReleasePerOp:    med(Result.ReleasePerOp),
	}
	if len(rs) > 0 {
		s.MinNsPerOp, s.MaxNsPerOp = math.Inf(1), math.Inf(-1)
		for _, r := range rs {
			s.MinNsPerOp = min(s.MinNsPerOp, r.NsPerOp())
			s.MaxNsPerOp = max(s.MaxNsPerOp, r.NsPerOp())
		}
	}
	if len(rs) > 0 && rs[0].Queue != nil {
		q := func(f func(*QueueCost) float64) float64 {
			return med(func(r Result) float64 { return f(r.Queue) })
		}
		s.Queue = &QueueCost{
			Waiters:    rs[0].Queue.Waiters,
			ClientHeap: q(func(c *QueueCost) float64 { return c.ClientHeap }),
			Stack:      q(func(c *QueueCost) float64 { return c.Stack }),
			Goroutines: q(func(c *QueueCost) float64 { return c.Goroutines }),
			Growth:     q(func(c *QueueCost) float64 { return c.Growth }),
		}
	}
	if len(rs) > 0 && rs[0].Server != nil {
		q := func(f func(*ServerCost) float64) float64 {
			return med(func(r Result) float64 { return f(r.Server) })
		}
		s.Server = &ServerCost{
			Waiters:    rs[0].Server.Waiters,
			Streams:    q(func(c *ServerCost) float64 { return c.Streams }),
			Heap:       q(func(c *ServerCost) float64 { return c.Heap }),
			Goroutines: q(func(c *ServerCost) float64 { return c.Goroutines }),
			GC:         !slices.ContainsFunc(rs, func(r Result) bool { return !r.Server.GC }),
		}
	}
	return s
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// A Target is a goal for this library (ours) against etcd's Mutex
// (theirs) in one scenario.
type Target struct {
	// Text says the goal, e.g. "ratio<=0.25".
	Text string
	// Met reports whether the medians meet the goal.
	Met func(ours, theirs Summary) bool
	// Versus, when set, is the result this goal compares ours with,
	// instead of the scenario's (Scenario.Theirs).
	Versus *Ref
}

// RatioAtMost is the goal that our time per operation is at most x times
// etcd's.
func RatioAtMost(x float64) Target {
	return Target{
		Text: fmt.Sprintf("ratio<=%.2f", x),
		Met:  func(ours, theirs Summary) bool { return Ratio(ours, theirs) <= x },
	}
}

// TimeAtMost is the goal that our time per operation is at most d,
// whatever the comparison's.
func TimeAtMost(d time.Duration) Target {
	return Target{
		Text: fmt.Sprintf("time<=%v", d),
		Met:  func(ours, _ Summary) bool { return ours.NsPerOp <= float64(d) },
	}
}

// RatioVersusAtMost is RatioAtMost against ref's results instead of the
// scenario's own comparison.
func RatioVersusAtMost(ref Ref, x float64) Target {
	t := RatioAtMost(x)
	t.Text = fmt.Sprintf("ratio<=%.2f vs %s %s", x, ref.Impl, ref.Scenario)
	t.Versus = &ref
	return t
}

// RPCsEqual is the goal that our operations take exactly n RPCs each (lease
// keepalives excluded), to the two decimals printed.
func RPCsEqual(n float64) Target {
	return Target{
		Text: fmt.Sprintf("rpcs==%g", n),
		Met:  func(ours, _ Summary) bool { return math.Abs(ours.RPCsPerOp-n) < 0.005 },
	}
}

// RPCsAtMost is the goal that our operations take at most n RPCs each
// (lease keepalives excluded).
func RPCsAtMost(n float64) Target {
	return Target{
		Text: fmt.Sprintf("rpcs<=%g", n),
		Met:  func(ours, _ Summary) bool { return ours.RPCsPerOp < n+0.005 },
	}
}

// RevsEqual is the goal that our operations consume exactly n revisions
// each.
func RevsEqual(n float64) Target {
	return Target{
		Text: fmt.Sprintf("revs==%g", n),
		Met:  func(ours, _ Summary) bool { return math.Abs(ours.RevsPerOp-n) < 0.005 },
	}
}

// RevsAtMost is the goal that our operations consume at most n revisions
// each.
func RevsAtMost(n float64) Target {
	return Target{
		Text: fmt.Sprintf("revs<=%g", n),
		Met:  func(ours, _ Summary) bool { return ours.RevsPerOp < n+0.005 },
	}
}

// ConstantMemory is the goal that a waiting Mutex's client memory does not
// grow with the queue: the waiters of the second half of the queue take at
// most x times what those of the first half took.
func ConstantMemory(x float64) Target {
	return Target{
		Text: fmt.Sprintf("mem O(1) (2nd/1st half<=%.1f)", x),
		Met: func(ours, _ Summary) bool {
			return ours.Queue != nil && ours.Queue.Growth <= x
		},
	}
}

// ServerStreamsAtMost is the goal that the etcd members keep at most n
// watch streams open for our waiters (ServerCost.Streams): with n the
// number of clients, one stream per client, as etcd's clients share one.
func ServerStreamsAtMost(n float64) Target {
	return Target{
		Text: fmt.Sprintf("server streams<=%g", n),
		Met:  func(ours, _ Summary) bool { return ours.Server != nil && ours.Server.Streams <= n },
	}
}

// ServerHeapAtMost is the goal that a waiter grows the etcd members' heap
// by at most x times what etcd's Mutex's waiter does.
func ServerHeapAtMost(x float64) Target {
	return perWaiterAtMost("server heap", x, func(s Summary) (float64, bool) {
		if s.Server == nil {
			return 0, false
		}
		return s.Server.Heap, true
	})
}

// ServerGoroutinesAtMost is the goal that a waiter adds at most x times
// the goroutines to the etcd members that etcd's Mutex's waiter does.
func ServerGoroutinesAtMost(x float64) Target {
	return perWaiterAtMost("server goroutines", x, func(s Summary) (float64, bool) {
		if s.Server == nil {
			return 0, false
		}
		return s.Server.Goroutines, true
	})
}

// ClientHeapAtMost is the goal that a waiter's client heap is at most x
// times that of etcd's Mutex's waiter.
func ClientHeapAtMost(x float64) Target {
	return perWaiterAtMost("client heap", x, func(s Summary) (float64, bool) {
		if s.Queue == nil {
			return 0, false
		}
		return s.Queue.ClientHeap, true
	})
}

// ClientGoroutinesAtMost is the goal that a waiter has at most x times
// the client goroutines of etcd's Mutex's waiter.
func ClientGoroutinesAtMost(x float64) Target {
	return perWaiterAtMost("client goroutines", x, func(s Summary) (float64, bool) {
		if s.Queue == nil {
			return 0, false
		}
		return s.Queue.Goroutines, true
	})
}

// perWaiterAtMost is the goal that ours is at most x times theirs in the
// figure per waiter that f returns (with false when it was not measured).
// It compares products, not a ratio: theirs may be 0.
func perWaiterAtMost(what string, x float64, f func(Summary) (float64, bool)) Target {
	return Target{
		Text: fmt.Sprintf("%s<=%gx", what, x),
		Met: func(ours, theirs Summary) bool {
			o, ok := f(ours)
			t, ok2 := f(theirs)
			return ok && ok2 && o <= x*t
		},
	}
}

// Ratio returns our time per operation over etcd's.
func Ratio(ours, theirs Summary) float64 { return ours.NsPerOp / theirs.NsPerOp }

// Check returns the texts of the targets of sc that ours misses. summary
// returns the medians of the results that ref names (sc.Refs).
func Check(sc Scenario, ours Summary, summary func(ref Ref) Summary) (missed []string) {
	for _, t := range sc.Targets {
		ref := sc.Theirs()
		if t.Versus != nil {
			ref = *t.Versus
		}
		if !t.Met(ours, summary(ref)) {
			missed = append(missed, t.Text)
		}
	}
	return missed
}
