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

	mu      sync.Mutex // guards the fields below
	pending []pending
	running bool
	closed  bool          // the session has ended and waited for run: add takes nothing more
	done    chan struct{} // closed when the last run started has returned
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
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addLocked(p)
}

// addLocked is add, with r.mu held.
func (r *releaser) addLocked(p pending) bool {
	if r.closed || r.end.Err() != nil {
		return false
	}
	r.pending = append(r.pending, p)
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
		work := r.pending
		r.pending = nil
		if len(work) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		var left []pending
		for _, p := range work {
			if !p() {
				left = append(left, p)
			}
		}
		r.mu.Lock()
		r.pending = append(left, r.pending...)
		r.mu.Unlock()
		if len(left) == 0 {
			backoff = minBackoff
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-r.end.Done():
		case <-r.wake:
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, maxBackoff)
	}
}
