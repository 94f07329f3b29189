package bench_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/bench"
)

var (
	memSizes = flag.String("mem.sizes", "100,1000,10000",
		"BenchmarkMem: numbers of held locks and of waiters, comma-separated")
	memProfile = flag.String("mem.heapprofile", "",
		"BenchmarkMem: write a heap profile of each case into this directory, with every allocation sampled")
)

// BenchmarkMem measures the client memory and goroutines of held locks
// (with and without Done) and of waiters, for each size of -mem.sizes,
// for this library and etcd's Mutex: heap, stack and goroutines per unit.
// It is slow (minutes at 10 000) and skipped under -short, so CI's bench
// run leaves it out. Run it with
//
//	go test -run '^$' -bench Mem -benchtime 1x ./bench/ -args -mem.sizes=100,1000,10000
//
// and, to see where the bytes go, add -mem.heapprofile=DIR and read a
// profile with go tool pprof -sample_index=inuse_space.
func BenchmarkMem(b *testing.B) {
	if testing.Short() {
		b.Skip("slow: skipped under -short")
	}
	var sizes []int
	for _, f := range strings.Split(*memSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			b.Fatalf("-mem.sizes: %q is not a size", f)
		}
		sizes = append(sizes, n)
	}
	if *memProfile != "" {
		old := runtime.MemProfileRate
		runtime.MemProfileRate = 1
		b.Cleanup(func() { runtime.MemProfileRate = old })
	}
	e := env(b, 1)
	cases := []struct {
		name string
		done bool
		run  func(ctx context.Context, impl bench.Impl, n int, done bool, after func()) (bench.MemCost, error)
	}{
		{"held", false, func(ctx context.Context, impl bench.Impl, n int, done bool, after func()) (bench.MemCost, error) {
			return bench.MemHeld(ctx, e, impl, n, done, after)
		}},
		{"held-done", true, func(ctx context.Context, impl bench.Impl, n int, done bool, after func()) (bench.MemCost, error) {
			return bench.MemHeld(ctx, e, impl, n, done, after)
		}},
		{"waiting", false, func(ctx context.Context, impl bench.Impl, n int, _ bool, after func()) (bench.MemCost, error) {
			return bench.MemWaiting(ctx, e, impl, n, after)
		}},
	}
	for _, c := range cases {
		for _, n := range sizes {
			b.Run(fmt.Sprintf("%s/n=%d", c.name, n), func(b *testing.B) {
				for _, impl := range bench.Impls {
					if c.done && impl.Name != bench.Etcdlock.Name {
						continue // etcd's Mutex has no Done
					}
					b.Run("impl="+impl.Name, func(b *testing.B) {
						ctx, cancel := context.WithTimeout(b.Context(), 20*time.Minute)
						defer cancel()
						var after func()
						if *memProfile != "" {
							path := filepath.Join(*memProfile, fmt.Sprintf("%s-%d-%s.pprof", c.name, n, impl.Name))
							after = func() { writeHeapProfile(b, path) }
						}
						var sum bench.MemCost
						for range b.N {
							r, err := c.run(ctx, impl, n, c.done, after)
							if err != nil {
								b.Fatal(err)
							}
							sum.Heap += r.Heap / float64(b.N)
							sum.Stack += r.Stack / float64(b.N)
							sum.Goroutines += r.Goroutines / float64(b.N)
							sum.Growth += r.Growth / float64(b.N)
						}
						b.ReportMetric(0, "ns/op")
						b.ReportMetric(sum.Heap, "heap-B/unit")
						b.ReportMetric(sum.Stack, "stack-B/unit")
						b.ReportMetric(sum.Goroutines, "goroutines/unit")
						b.ReportMetric(sum.Growth, "growth")
					})
				}
			})
		}
	}
}

func writeHeapProfile(b *testing.B, path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}
