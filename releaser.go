package etcdlock

import (
	"context"
	"sync"
	"time"
)

// The session's releaser: what Unlock left to the background, and the
// tidy-ups after losses, sent again until done or the session ends. It
// runs jobs (pending) that the release makes; it names nothing of them.

// A releaser sends, in the background, the releases that Unlock returned
// before etcd confirmed (its ctx ended), and tidies up after losses that
// leave a max hold lease: one goroutine per session while any is pending,
// which sends each one's attempts in turn, with a backoff between rounds,
// and ends when none is left or the session ends (it then ends them all:
// their keys go with the lease). It is safe for concurrent use.
type releaser struct {
	end  context.Context // the session's end
	wake chan struct{}   // capacity 1: a release was added, or one ended

	mu       sync.Mutex // guards the fields below
	pending  []job
	running  bool
	flushing bool          // Session.Close asked for every job now, due or not
	closed   bool          // the session has ended and waited for run: add takes nothing more
	done     chan struct{} // closed when the last run started has returned
}

// A job is a pending and when it is due: the zero time for now, the end
// of a minimum hold for a release Unlock asked for before it.
type job struct {
	run pending
	due time.Time
}

// A pending is one job of the releaser: a release (queue.step), a tidy-up
// after a loss (step with tidy), or the sweep of a set's keys after one
// of them went (queue.sweep). It reports whether it is done with; one not
// done is run again after the releaser's backoff.
type pending func() bool

// newReleaser returns the releaser of a session that ends with end.
func newReleaser(end context.Context) *releaser {
	return &releaser{end: end, wake: make(chan struct{}, 1)}
}

// add has the releaser run p until it is done with: a release (h is
// releasing), a tidy-up after a loss (h has ended, and its finishing is
// claimed), or a set's sweep. It reports false, and takes nothing, once
// the session has ended: the keys go with the lease.
func (r *releaser) add(p pending) bool {
	return r.addAt(time.Time{}, p)
}

// addAt is add of a job first run at due, or sooner when Session.Close
// flushes the releaser or the session ends: the job tells by the time.
func (r *releaser) addAt(due time.Time, p pending) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.end.Err() != nil {
		return false
	}
	r.pending = append(r.pending, job{run: p, due: due})
	if !r.running {
		r.running = true
		r.done = make(chan struct{})
		go r.run(r.done)
	}
	r.signal()
	return true
}

// signal wakes the releaser.
func (r *releaser) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// flush wakes the releaser to send its pending releases now, and waits
// until none is left or ctx ends: Session.Close calls it before it ends
// the session, which would leave them to the lease.
func (r *releaser) flush(ctx context.Context) {
	r.mu.Lock()
	r.flushing = true
	running, done := r.running, r.done
	r.mu.Unlock()
	if !running {
		return
	}
	r.signal()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// wait waits until the releaser's goroutine has returned, once the
// session has ended: the goroutine ends every release left (their keys go
// with the lease) and returns at once.
func (r *releaser) wait() {
	r.mu.Lock()
	r.closed = true
	running, done := r.running, r.done
	r.mu.Unlock()
	if running {
		<-done
	}
}

// run sends the pending releases until none is left.
func (r *releaser) run(done chan struct{}) {
	defer close(done)
	backoff := minBackoff
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		work, later := r.due()
		r.pending = later
		r.mu.Unlock()
		var left []job
		for _, j := range work {
			if !j.run() {
				left = append(left, j)
			}
		}
		r.mu.Lock()
		r.pending = append(left, r.pending...)
		wait := r.untilDue()
		if len(left) > 0 {
			wait = backoff // (left is due: untilDue is 0)
		} else {
			backoff = minBackoff
		}
		r.mu.Unlock()
		if wait == 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-r.end.Done():
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
		if len(left) > 0 {
			backoff = min(2*backoff, maxBackoff)
		}
	}
}

// due splits the pending jobs into those to run now and those not yet
// due: every job is due once Close flushes or the session has ended.
// Called with r.mu held.
func (r *releaser) due() (now, later []job) {
	all := r.allDue()
	t := time.Now()
	for _, j := range r.pending {
		if all || !t.Before(j.due) {
			now = append(now, j)
		} else {
			later = append(later, j)
		}
	}
	return now, later
}

// allDue reports whether every job is due whatever its time: Close
// flushes, or the session has ended. Called with r.mu held.
func (r *releaser) allDue() bool { return r.flushing || r.end.Err() != nil }

// untilDue returns how long until the first pending job is due: 0 when
// one is (or none is pending: run then returns). Called with r.mu held.
func (r *releaser) untilDue() time.Duration {
	if r.allDue() || len(r.pending) == 0 {
		return 0
	}
	wait := time.Duration(-1)
	for _, j := range r.pending {
		d := time.Until(j.due)
		if d <= 0 {
			return 0
		}
		if wait < 0 || d < wait {
			wait = d
		}
	}
	return wait
}
