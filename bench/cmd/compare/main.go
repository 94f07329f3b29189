// Command compare runs the bench scenarios for this library's Mutex and
// etcd's concurrency.Mutex on one etcd (server processes), alternating the two over
// rounds, and prints one table of medians with the ratio of our time to
// etcd's and whether each target is met. The scenarios of a Mutex and of an
// Election also run for this module's concurrency package
// (etcdlock-compat), and a second table sets it beside etcdlock's own API.
// The many-names scenarios also run the floor, no lock but a Put and a
// Delete of the key, and a third table prints every implementation's
// figures as multiples of etcd's and of the floor's. Scenarios that run no
// lock of ours (the floor's write and bare handoffs, which fifo-50 is
// compared with) get a table of references of their own.
//
//	go run ./bench/cmd/compare -members 1 -rounds 5
//
// Flags:
//
//	-members n     members of the etcd cluster: 1 or 3 (default 1)
//	-rounds n      rounds; each runs every scenario once per implementation,
//	               each implementation first in turn (default 5)
//	-scenarios re  run only the scenarios whose name matches re
//	-short         fewer operations per round, and none of the slow
//	               scenarios (fifo-300, fifo-1000, sem-fifo-1000, waiters-…,
//	               many-names with 64 and 256 goroutines)
//
// Progress goes to standard error, the tables to standard output. The
// command exits 1 if a scenario fails (two holders at once, FIFO order
// broken, an error) or goroutines are left behind; missed targets are only
// reported.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock/bench"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"go.uber.org/goleak"
)

func main() {
	members := flag.Int("members", 1, "members of the etcd cluster: 1 or 3")
	rounds := flag.Int("rounds", 5, "rounds; each runs every scenario once per implementation")
	filter := flag.String("scenarios", "", "run only the scenarios whose name matches this regexp")
	short := flag.Bool("short", false, "fewer operations per round, and none of the slow scenarios (fifo-1000, waiters-…)")
	flag.Parse()
	if err := run(*members, *rounds, *filter, *short); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run(members, rounds int, filter string, short bool) error {
	if members != 1 && members != 3 {
		return fmt.Errorf("-members %d: want 1 or 3", members)
	}
	if rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", rounds)
	}
	re, err := regexp.Compile(filter)
	if err != nil {
		return fmt.Errorf("-scenarios: %w", err)
	}
	var scenarios []bench.Scenario
	for _, sc := range bench.Scenarios {
		if re.MatchString(sc.Name) && (sc.Short || !short) {
			scenarios = append(scenarios, sc)
		}
	}
	if len(scenarios) == 0 {
		return fmt.Errorf("no scenario matches %q", filter)
	}
	// A scenario compared with another one needs that one's results too.
	run := slices.Clone(scenarios)
	for _, sc := range scenarios {
		for _, ref := range sc.Refs() {
			if !slices.ContainsFunc(run, func(s bench.Scenario) bool { return s.Name == ref.Scenario }) {
				other, ok := bench.Lookup(ref.Scenario)
				if !ok {
					return fmt.Errorf("%s is compared with the unknown scenario %s", sc.Name, ref.Scenario)
				}
				run = append(run, other)
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	before := goleak.IgnoreCurrent()
	start := time.Now()
	results, version, err := measure(ctx, members, rounds, short, run)
	if err != nil {
		return err
	}
	printTables(os.Stdout, version, members, rounds, scenarios, results)
	fmt.Fprintf(os.Stdout, "\nwall time %v\n", time.Since(start).Round(time.Second))

	// Every session and client the scenarios opened is closed, and etcd is
	// stopped: no goroutine may be left but net/http's peer leftovers.
	if err := leakcheck.Find(before); err != nil {
		return fmt.Errorf("goroutines left behind: %w", err)
	}
	return nil
}

// results holds one Result per round, by scenario and implementation.
type results map[string]map[string][]bench.Result

func measure(ctx context.Context, members, rounds int, short bool, scenarios []bench.Scenario) (results, string, error) {
	dir, err := etcdtest.MkdirTemp()
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	env, err := bench.NewEnv(dir, members)
	if err != nil {
		return nil, "", err
	}
	defer env.Close()

	res := make(results)
	for round := range rounds {
		for _, sc := range scenarios {
			n := sc.N
			if short {
				n = sc.ShortN
			}
			var impls []bench.Impl
			for _, impl := range bench.AllImpls {
				if sc.RunsFor(impl.Name) {
					impls = append(impls, impl)
				}
			}
			// Each goes first in turn: with two, they alternate.
			k := round % len(impls)
			impls = append(impls[k:], impls[:k]...)
			for _, impl := range impls {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
				r, err := sc.Run(rctx, env, impl, n, nil)
				cancel()
				if err != nil {
					return nil, "", fmt.Errorf("round %d, %s, %s: %w", round+1, sc.Name, impl.Name, err)
				}
				if res[sc.Name] == nil {
					res[sc.Name] = make(map[string][]bench.Result)
				}
				res[sc.Name][impl.Name] = append(res[sc.Name][impl.Name], r)
				fmt.Fprintf(os.Stderr, "round %d/%d  %-23s %-15s %10s/%s  %5.2f rpcs/op  %5.2f revs/op\n",
					round+1, rounds, sc.Name, impl.Name, duration(r.NsPerOp()), sc.Unit, r.RPCsPerOp(), r.RevsPerOp())
			}
		}
	}
	return res, env.ServerVersion(), nil
}

func printTables(w io.Writer, version string, members, rounds int, scenarios []bench.Scenario, res results) {
	ours := bench.Etcdlock.Name
	fmt.Fprintf(w, "etcdlock (ours) vs theirs (etcd's concurrency.Mutex unless said): etcd %s server processes, %d member(s), fsync on; medians of %d rounds [min-max]\n", version, members, rounds)
	fmt.Fprintf(w, "ratio = our time / theirs; rpcs/op = unary calls + streams opened, lease keepalive streams apart (ka/op); allocs/op of the whole process\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tper\tetcdlock time/op\ttheirs time/op\tratio\trpcs/op ours|theirs\tka/op ours|theirs\trevs/op ours|theirs\tallocs/op ours|theirs\tcpu/op etcd+clients ours|theirs\ttheirs\ttargets\tmet")
	summary := func(ref bench.Ref) bench.Summary { return bench.Summarize(res[ref.Scenario][ref.Impl]) }
	var queues, servers []bench.Scenario
	var versus []string       // lines for the targets against another scenario
	var splits []string       // lines for the handoffs split into release and admission
	var refs []bench.Scenario // the references: no lock of ours runs in them
	for _, sc := range scenarios {
		if !sc.RunsFor(ours) {
			refs = append(refs, sc)
			continue
		}
		ref := sc.Theirs()
		o, t := bench.Summarize(res[sc.Name][ours]), bench.Summarize(res[ref.Scenario][ref.Impl])
		baseline := sc.Baseline
		if baseline == "" {
			baseline = "etcd Mutex"
		}
		met := "yes"
		if missed := bench.Check(sc, o, summary); len(missed) > 0 {
			met = "NO: " + strings.Join(missed, ", ")
		}
		var targets []string
		for _, t := range sc.Targets {
			targets = append(targets, t.Text)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\t%.2f | %.2f\t%.2f | %.2f\t%.2f | %.2f\t%.0f | %.0f\t%s+%s | %s+%s\t%s\t%s\t%s\n",
			sc.Name, sc.Unit, timeRange(o), timeRange(t), bench.Ratio(o, t),
			o.RPCsPerOp, t.RPCsPerOp, o.KeepAlivesPerOp, t.KeepAlivesPerOp,
			o.RevsPerOp, t.RevsPerOp, o.AllocsPerOp, t.AllocsPerOp,
			duration(o.ServerCPUPerOp), duration(o.ClientCPUPerOp), duration(t.ServerCPUPerOp), duration(t.ClientCPUPerOp),
			baseline, strings.Join(targets, " "), met)
		if o.ReleasePerOp > 0 && t.ReleasePerOp > 0 {
			splits = append(splits, fmt.Sprintf("%s: ours %s + %s, theirs %s + %s",
				sc.Name, duration(o.ReleasePerOp), duration(o.NsPerOp-o.ReleasePerOp),
				duration(t.ReleasePerOp), duration(t.NsPerOp-t.ReleasePerOp)))
		}
		if o.Queue != nil {
			queues = append(queues, sc)
		}
		if o.Server != nil {
			servers = append(servers, sc)
		}
		for _, t := range sc.Targets {
			if t.Versus != nil {
				v := summary(*t.Versus)
				med, lo, hi := roundRatios(res[sc.Name][ours], res[t.Versus.Scenario][t.Versus.Impl])
				versus = append(versus, fmt.Sprintf("%s: ours %s = %.2f x %s %s (%s per %s); per round %.2f [%.2f-%.2f]",
					sc.Name, duration(o.NsPerOp), bench.Ratio(o, v), t.Versus.Impl, t.Versus.Scenario, timeRange(v), unit(t.Versus.Scenario), med, lo, hi))
			}
		}
	}
	tw.Flush()
	printRefs(w, refs, res)
	printCompat(w, scenarios, res)
	printFloor(w, scenarios, res)
	if len(versus) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(versus, "\n"))
	}
	if len(splits) > 0 {
		fmt.Fprintf(w, "\nper handoff, release + admission (medians): the releaser's Unlock, then the rest until the next waiter holds\n%s\n", strings.Join(splits, "\n"))
	}
	if len(queues) == 0 {
		return
	}

	fmt.Fprintf(w, "\nper waiting Mutex (medians): client B = heap + goroutine stacks of this process (etcd runs in processes of its own);\n")
	fmt.Fprintf(w, "growth = heap per waiter of the last half of the queue over the first half (1 = O(1))\n")
	if len(servers) > 0 {
		fmt.Fprintf(w, "waiters-…: the waiting alone, every session made before the first snapshot; the others: waiter and session, after a first tenth\n")
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\timpl\twaiters measured\tclient B\tof which heap\tof which stack\tgoroutines\tgrowth")
	for _, sc := range queues {
		for _, impl := range bench.AllImpls {
			if !sc.RunsFor(impl.Name) {
				continue
			}
			q := bench.Summarize(res[sc.Name][impl.Name]).Queue
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\n",
				sc.Name, impl.Name, q.Waiters, q.ClientHeap+q.Stack, q.ClientHeap, q.Stack, q.Goroutines, q.Growth)
		}
	}
	tw.Flush()
	printServer(w, servers, res)
}

// printRefs prints the scenarios that run no lock of ours (the floor's
// write and handoffs), each implementation's figures with its time as a
// multiple of the scenario's Versus.
func printRefs(w io.Writer, refs []bench.Scenario, res results) {
	if len(refs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nreferences (no lock: what any lock on etcd pays), medians [min-max]; ratio = time / the reference's, per round: median [min-max] of it within each round\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tper\timpl\ttime/op\tvs\tratio\tper round\trpcs/op\trevs/op\tcpu/op etcd+clients")
	for _, sc := range refs {
		ref := sc.Theirs()
		v := res[ref.Scenario][ref.Impl]
		for _, impl := range bench.AllImpls {
			rs := res[sc.Name][impl.Name]
			if !sc.RunsFor(impl.Name) || len(rs) == 0 {
				continue
			}
			s := bench.Summarize(rs)
			med, lo, hi := roundRatios(rs, v)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s %s\t%.3f\t%.2f [%.2f-%.2f]\t%.2f\t%.2f\t%s+%s\n",
				sc.Name, sc.Unit, impl.Name, timeRange(s), ref.Impl, ref.Scenario, bench.Ratio(s, bench.Summarize(v)), med, lo, hi,
				s.RPCsPerOp, s.RevsPerOp, duration(s.ServerCPUPerOp), duration(s.ClientCPUPerOp))
		}
	}
	tw.Flush()
}

// printCompat prints, for the scenarios that ran for the concurrency
// package, its figures beside etcdlock's own API's: the claim is that
// they are the same RPCs and revisions, and level times. Rounds run both
// close together, so the ratio within each round is printed too.
func printCompat(w io.Writer, scenarios []bench.Scenario, res results) {
	compat, ours := bench.Compat.Name, bench.Etcdlock.Name
	var ran []bench.Scenario
	for _, sc := range scenarios {
		if sc.RunsFor(compat) && sc.RunsFor(ours) {
			ran = append(ran, sc)
		}
	}
	if len(ran) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s (the concurrency package: etcd's API on etcdlock) vs etcdlock's own API, medians [min-max]\n", compat)
	fmt.Fprintf(w, "ratio = compat time / etcdlock's; per round = median [min-max] of that ratio within each round\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tper\tcompat time/op\tetcdlock time/op\tratio\tper round\tcompat / theirs\trpcs/op compat|etcdlock\trevs/op compat|etcdlock\tallocs/op compat|etcdlock")
	var splits []string
	for _, sc := range ran {
		c, o := bench.Summarize(res[sc.Name][compat]), bench.Summarize(res[sc.Name][ours])
		ref := sc.Theirs()
		t := bench.Summarize(res[ref.Scenario][ref.Impl])
		med, lo, hi := roundRatios(res[sc.Name][compat], res[sc.Name][ours])
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\t%.3f [%.3f-%.3f]\t%.3f\t%.2f | %.2f\t%.2f | %.2f\t%.0f | %.0f\n",
			sc.Name, sc.Unit, timeRange(c), timeRange(o), bench.Ratio(c, o), med, lo, hi, bench.Ratio(c, t),
			c.RPCsPerOp, o.RPCsPerOp, c.RevsPerOp, o.RevsPerOp, c.AllocsPerOp, o.AllocsPerOp)
		if c.ReleasePerOp > 0 && o.ReleasePerOp > 0 {
			splits = append(splits, fmt.Sprintf("%s: compat %s + %s, etcdlock %s + %s", sc.Name,
				duration(c.ReleasePerOp), duration(c.NsPerOp-c.ReleasePerOp), duration(o.ReleasePerOp), duration(o.NsPerOp-o.ReleasePerOp)))
		}
	}
	tw.Flush()
	if len(splits) > 0 {
		fmt.Fprintf(w, "\nper handoff, release + admission (medians)\n%s\n", strings.Join(splits, "\n"))
	}
}

// printFloor prints, for the scenarios that ran the floor beside the
// locks (the many-names ones), every implementation's row, the floor's too: its time
// per operation as a multiple of etcd's Mutex's and of the floor's, and
// what an operation costs the etcd members and this process.
func printFloor(w io.Writer, scenarios []bench.Scenario, res results) {
	var ran []bench.Scenario
	for _, sc := range scenarios {
		if sc.RunsFor(bench.Floor.Name) && sc.RunsFor(bench.Etcdlock.Name) {
			ran = append(ran, sc)
		}
	}
	if len(ran) == 0 {
		return
	}
	fmt.Fprintf(w, "\nevery implementation beside the floor (a Put of the key with the session's lease, then its Delete: the least a lock writes), medians [min-max]\n")
	fmt.Fprintf(w, "time/op = the window's wall time / operations; x etcd, x floor = time / etcd Mutex's, / the floor's (per round: median [min-max] of that ratio within each round);\n")
	fmt.Fprintf(w, "cpu/op = CPU time of the etcd members, of this process (the clients); allocs and B of the whole process\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\timpl\ttime/op\tx etcd\tper round\tx floor\tper round\tetcd cpu/op\tclient cpu/op\trpcs/op\trevs/op\tallocs/op\tB/op")
	for _, sc := range ran {
		etcd, floor := res[sc.Name][bench.Etcd.Name], res[sc.Name][bench.Floor.Name]
		e, f := bench.Summarize(etcd), bench.Summarize(floor)
		for _, impl := range bench.AllImpls {
			if !sc.RunsFor(impl.Name) {
				continue
			}
			rs := res[sc.Name][impl.Name]
			s := bench.Summarize(rs)
			em, elo, ehi := roundRatios(rs, etcd)
			fm, flo, fhi := roundRatios(rs, floor)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%.2f [%.2f-%.2f]\t%.3f\t%.2f [%.2f-%.2f]\t%s\t%s\t%.2f\t%.2f\t%.0f\t%.0f\n",
				sc.Name, impl.Name, timeRange(s), bench.Ratio(s, e), em, elo, ehi, bench.Ratio(s, f), fm, flo, fhi,
				duration(s.ServerCPUPerOp), duration(s.ClientCPUPerOp), s.RPCsPerOp, s.RevsPerOp, s.AllocsPerOp, s.BytesPerOp)
		}
	}
	tw.Flush()
}

// roundRatios returns the median, least and greatest of a's time per
// operation over b's, round by round.
func roundRatios(a, b []bench.Result) (med, lo, hi float64) {
	n := min(len(a), len(b))
	if n == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	rs := make([]float64, n)
	for i := range n {
		rs[i] = a[i].NsPerOp() / b[i].NsPerOp()
	}
	slices.Sort(rs)
	if n%2 == 1 {
		med = rs[n/2]
	} else {
		med = (rs[n/2-1] + rs[n/2]) / 2
	}
	return med, rs[0], rs[n-1]
}

// printServer prints what the waiters of the scenarios cost the etcd
// members, read from the members themselves.
func printServer(w io.Writer, scenarios []bench.Scenario, res results) {
	if len(scenarios) == 0 {
		return
	}
	fmt.Fprintf(w, "\nper waiting Mutex, etcd server (medians; read from the members' /metrics, summed over them): streams = watch streams open\n")
	fmt.Fprintf(w, "with every waiter waiting (for the whole queue); heap (after a GC of each member) and goroutines per waiter, from every session made to every waiter waiting\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\timpl\twaiters\tserver streams\tserver heap B\tserver goroutines\tGC")
	for _, sc := range scenarios {
		for _, impl := range []string{bench.Etcdlock.Name, bench.Etcd.Name} {
			if !sc.RunsFor(impl) {
				continue
			}
			s := bench.Summarize(res[sc.Name][impl]).Server
			gc := "yes"
			if !s.GC {
				gc = "no: heap with garbage"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f\t%.0f\t%.2f\t%s\n", sc.Name, impl, s.Waiters, s.Streams, s.Heap, s.Goroutines, gc)
		}
	}
	tw.Flush()
}

// unit returns what one operation of the scenario called name is.
func unit(name string) string {
	sc, _ := bench.Lookup(name)
	return sc.Unit
}

// timeRange formats the median time per operation and its range.
func timeRange(s bench.Summary) string {
	return fmt.Sprintf("%s [%s-%s]", duration(s.NsPerOp), duration(s.MinNsPerOp), duration(s.MaxNsPerOp))
}

func duration(ns float64) string {
	switch {
	case ns >= 1e9:
		return fmt.Sprintf("%.2fs", ns/1e9)
	case ns >= 1e6:
		return fmt.Sprintf("%.2fms", ns/1e6)
	default:
		return fmt.Sprintf("%.0fµs", ns/1e3)
	}
}
