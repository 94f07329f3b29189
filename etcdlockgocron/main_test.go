package etcdlockgocron_test

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/require"
)

// cluster is a one-member etcd started by TestMain.
var cluster *etcdtest.Cluster

func TestMain(m *testing.M) {
	os.Exit(etcdtest.RunMain(func(c *etcdtest.Cluster) int {
		cluster = c
		return m.Run()
	}))
}

// skewedClock is the machine's clock set off by offset: what a replica
// whose clock is offset ahead of true time (behind, if negative) reads.
// Its timers are real ones, so a scheduler on it fires a tick due at T on
// its clock at true time T - offset, as a replica on a machine with that
// skew does.
type skewedClock struct {
	clockwork.Clock
	offset time.Duration
}

func newSkewedClock(offset time.Duration) skewedClock {
	return skewedClock{clockwork.NewRealClock(), offset}
}

func (c skewedClock) Now() time.Time                  { return c.Clock.Now().Add(c.offset) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c skewedClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// tick is the tick of a job every second that a replica on clock c fires
// now: the second its clock has reached. A run or an attempt of the tick
// due at T comes a little after T on the clock that fired it (gocron's
// timer never fires early, and the Locker waits for etcd for at most
// its minimum hold, under a second), so every replica names a tick alike
// whatever its skew.
func (c skewedClock) tick() time.Time { return c.Now().Truncate(time.Second) }

// everySecond is a gocron job definition firing at each whole second of
// the scheduler's clock.
var everySecond = gocron.CronJob("* * * * * *", true)

// runLog records, for each tick, which replicas ran it.
type runLog struct {
	mu   sync.Mutex
	runs map[time.Time][]int // guarded by mu
	ran  chan struct{}       // receives after each run, never blocking
}

func newRunLog() *runLog {
	return &runLog{runs: map[time.Time][]int{}, ran: make(chan struct{}, 1)}
}

// task returns the job's function for replica i on clock c.
func (l *runLog) task(i int, c skewedClock) gocron.Task {
	return gocron.NewTask(func() {
		l.mu.Lock()
		l.runs[c.tick()] = append(l.runs[c.tick()], i)
		l.mu.Unlock()
		select {
		case l.ran <- struct{}{}:
		default:
		}
	})
}

// snapshot returns a copy of the runs so far.
func (l *runLog) snapshot() map[time.Time][]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[time.Time][]int, len(l.runs))
	for k, v := range l.runs {
		out[k] = append([]int(nil), v...)
	}
	return out
}

// waitTick waits until a run of a tick at or after t is recorded, for at
// most d.
func (l *runLog) waitTick(t *testing.T, tick time.Time, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		for k := range l.snapshot() {
			if !k.Before(tick) {
				return
			}
		}
		select {
		case <-l.ran:
		case <-deadline:
			t.Fatalf("no run of tick %v or later within %v; runs %v", tick.Format(time.TimeOnly), d, l.snapshot())
		}
	}
}

// newScheduler returns a started scheduler on clock c with opts, shut
// down at the end of the test (Shutdown waits for its runs).
func newScheduler(t *testing.T, c skewedClock, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(append([]gocron.SchedulerOption{gocron.WithClock(c)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { s.Shutdown() })
	return s
}

// nameSeq counts the tests that asked for a lockName, so that a test run
// again (-count) has names of its own: a hold that ended without Unlock
// (a session closed or revoked under it, as some tests do) leaves its
// minimum hold to the next attempt at the name, whenever it comes.
var nameSeq atomic.Int64

// lockName returns a name of the test's own, another at each call: call
// it once per test.
func lockName(t *testing.T) string {
	return fmt.Sprintf("test/%s/%d", t.Name(), nameSeq.Add(1))
}
