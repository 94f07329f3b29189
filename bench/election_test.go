package bench_test

import "testing"

// BenchmarkElection measures our Election against etcd's
// concurrency.Election: Campaign+Resign alone, 4 candidates taking turns,
// and the median and 99th percentile of the time from a Resign's response
// to each of 10 observers seeing the new leader; and (ours only) the time
// from a request to step down to the next Lead's fn starting. It fails if
// two candidates ever lead at once, or a request moves the leadership to
// any but the next in line.
func BenchmarkElection(b *testing.B) {
	for _, name := range []string{"elect-uncontended", "elect-handoff-4", "elect-observe-10-p50", "elect-observe-10-p99", "lead-yield-3"} {
		b.Run(name, func(b *testing.B) { benchScenario(b, name) })
	}
}
