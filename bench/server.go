package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ServerCost is what waiting Mutexes cost the etcd members, read from
// the members' own metrics (they are processes of their own): the watch
// streams they keep open, and the growth of their heap and of their
// number of goroutines per waiter, from just before the first waiter
// calls Lock (every session already made) to when all of them wait.
// Each figure is the sum over the members.
type ServerCost struct {
	// Waiters is the number of waiters measured.
	Waiters int64
	// Streams is the number of watch streams open once every waiter
	// waits, beyond those open before the run's clients connected: etcd's
	// gauge etcd_debugging_mvcc_watch_stream_total. It is a count for the
	// whole run, not per waiter.
	Streams float64
	// Heap is the growth of go_memstats_heap_alloc_bytes per waiter,
	// read after a garbage collection of each member when GC is set.
	Heap float64
	// Goroutines is the growth of go_goroutines per waiter.
	Goroutines float64
	// GC reports whether the heap was read after forcing a garbage
	// collection in each member (through its /debug/pprof/heap?gc=1).
	// Without it each figure is the median of a few readings, and the
	// heap counts garbage.
	GC bool
}

// add returns the average of c and o, weighted by their waiters.
func (c *ServerCost) add(o *ServerCost) *ServerCost {
	switch {
	case c == nil:
		return o
	case o == nil:
		return c
	}
	n, m := float64(c.Waiters), float64(o.Waiters)
	avg := func(a, b float64) float64 { return (a*n + b*m) / (n + m) }
	return &ServerCost{
		Waiters:    c.Waiters + o.Waiters,
		Streams:    avg(c.Streams, o.Streams),
		Heap:       avg(c.Heap, o.Heap),
		Goroutines: avg(c.Goroutines, o.Goroutines),
		GC:         c.GC && o.GC,
	}
}

// serverSnapshot is the state of the members at one moment, summed over
// them.
type serverSnapshot struct {
	streams    float64 // watch streams open
	heap       float64 // heap in use, after a GC when gc is set
	goroutines float64
	gc         bool // every member collected its garbage just before
}

// serverReadings is how many times serverSnapshot reads each member; it
// returns the medians.
const serverReadings = 3

// serverSnapshot reads the members' watch streams, heap and goroutines
// from their /metrics, serverReadings times, each time after asking every
// member to collect its garbage, and returns the medians. A member that
// does not serve Go's profiling endpoints cannot be asked: its readings
// are then 100ms apart, and the heap counts garbage.
func (e *Env) serverSnapshot(ctx context.Context) (serverSnapshot, error) {
	var streams, heap, goroutines []float64
	gc := true
	for i := range serverReadings {
		var s serverSnapshot
		for _, ep := range e.cluster.Endpoints() {
			collected, err := collectGarbage(ctx, ep)
			if err != nil {
				return serverSnapshot{}, err
			}
			gc = gc && collected
			v, err := scrapeMetrics(ctx, ep, "etcd_debugging_mvcc_watch_stream_total", "go_memstats_heap_alloc_bytes", "go_goroutines")
			if err != nil {
				return serverSnapshot{}, err
			}
			s.streams += v[0]
			s.heap += v[1]
			s.goroutines += v[2]
		}
		streams = append(streams, s.streams)
		heap = append(heap, s.heap)
		goroutines = append(goroutines, s.goroutines)
		if !gc && i < serverReadings-1 {
			if err := sleep(ctx, 100*time.Millisecond); err != nil {
				return serverSnapshot{}, err
			}
		}
	}
	return serverSnapshot{streams: median(streams), heap: median(heap), goroutines: median(goroutines), gc: gc}, nil
}

// collectGarbage makes the member at ep run a garbage collection, through
// net/http/pprof's heap profile with gc=1, and reports false if the
// member does not serve it (etcd without --enable-pprof).
func collectGarbage(ctx context.Context, ep string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return false, err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("bench: heap profile of %s: %w", ep, err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return false, fmt.Errorf("bench: heap profile of %s: %w", ep, err)
	}
	return resp.StatusCode == http.StatusOK, nil
}

// serverCost turns three snapshots, before the run's clients connected
// (s0), once every session was made but no waiter had called Lock yet
// (s1), and once all w waiters wait (s2), into the cost per waiter.
func serverCost(w int64, s0, s1, s2 serverSnapshot) *ServerCost {
	n := float64(w)
	return &ServerCost{
		Waiters:    w,
		Streams:    s2.streams - s0.streams,
		Heap:       (s2.heap - s1.heap) / n,
		Goroutines: (s2.goroutines - s1.goroutines) / n,
		GC:         s1.gc && s2.gc,
	}
}
