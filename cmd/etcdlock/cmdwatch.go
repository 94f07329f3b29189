package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/etcdlock/etcdlock"
)

// A cmdWatch runs the loop that keeps CMD (started under its supervisor,
// startChild) inside one hold of a session's lease, for run, elect and
// each shard of shards: CMD is stopped (SIGTERM, then SIGKILL after
// grace, sooner if the lease's deadline comes first) when the hold ends,
// and before the lease can expire unrenewed; the supervisor is told the
// lease's deadline after each renewal, so that it stops CMD by then even
// if etcdlock cannot. Its fields are set before watch, which is called
// once, from one goroutine.
type cmdWatch struct {
	ch      *child
	waitc   <-chan error // the supervisor's Wait result
	s       *etcdlock.Session
	renewed <-chan struct{} // a value after a renewal of s's lease moved its Expiry
	grace   time.Duration
	cmdName string // CMD as messages name it
	held    string // what is held, as messages name it: lock "NAME"
	stderr  io.Writer

	// ended is closed when the hold ends (lost, or for a shard moved);
	// why then returns the error that ended it (nil for a move), and
	// stopMsg the message that stopping CMD begins with, given the
	// error the hold is known lost with (nil if none).
	ended   <-chan struct{}
	why     func() error
	stopMsg func(lostErr error) string
	// asked gets a value when the holder is asked to release, and
	// onAsked acts on it; nil when nobody asks.
	asked   <-chan struct{}
	onAsked func()
	// sigc gets the signals etcdlock passes on, and onSignal acts on
	// each.
	sigc     <-chan os.Signal
	onSignal func(os.Signal)
}

// A cmdEnd is how a cmdWatch ended: CMD has exited.
type cmdEnd struct {
	waitErr error // the supervisor's Wait result
	// lostErr is why the hold ended (or may have, when etcdlock could
	// not renew the lease in time) while CMD ran; nil if it did not.
	lostErr error
	// stoppedEarly: CMD was stopped in jeopardy, before any loss, as
	// renewals failed for so long that the hold could pass on.
	stoppedEarly bool
	// late: CMD was found gone only after the lease's deadline, which the
	// supervisor kept: etcdlock was paused or starved, and the lease may
	// have expired, the hold passed on.
	late bool
}

// errLate is lostErr for a cmdEnd that is late and lost nothing before.
func errLate() error {
	return fmt.Errorf("%w: etcdlock could not renew the lease in time (was it paused?)", etcdlock.ErrSessionExpired)
}

// watch runs until CMD has exited, and tells how it ended.
func (w *cmdWatch) watch() cmdEnd {
	ch, stderr, cmdName, held, grace := w.ch, w.stderr, w.cmdName, w.held, w.grace
	ended := w.ended
	// CMD must be gone, SIGKILL included, killMargin before etcd can expire
	// the lease: stopping it starts grace before that, whenever renewals
	// have failed that long (jeopardy), or at once when the hold is lost.
	// The supervisor is told the deadline after each renewal, and keeps
	// it if etcdlock cannot (paused, starved); etcdlock acts a moment
	// earlier, so that the supervisor need not.
	const lead = 100 * time.Millisecond
	margin := killMargin(w.s.TTL())
	killBy := func() time.Time { return w.s.Expiry().Add(-margin - lead) }
	ch.deadline(killBy().Add(lead))
	jeopardy := time.NewTimer(time.Until(killBy().Add(-grace)))
	defer jeopardy.Stop()
	var (
		end            cmdEnd
		termAt, killAt time.Time // zero until CMD is being stopped
		killed         bool      // SIGKILL was sent
	)
	kill := time.NewTimer(time.Hour)
	kill.Stop()
	defer kill.Stop()
	// stop stops CMD by at: SIGTERM now and SIGKILL at, or SIGKILL now if
	// at has come. A second call only brings SIGKILL forward. now is when
	// the caller read the clock to choose at.
	stop := func(why string, now, at time.Time) {
		switch {
		case killed || (!killAt.IsZero() && !at.Before(killAt)):
			fmt.Fprintf(stderr, "etcdlock: %s; %s is being stopped\n", why, cmdName)
		case !now.Before(at):
			fmt.Fprintf(stderr, "etcdlock: %s; sending %s SIGKILL\n", why, cmdName)
			ch.kill()
			killed = true
		case termAt.IsZero():
			fmt.Fprintf(stderr, "etcdlock: %s; sending it SIGTERM (SIGKILL in %s if it still runs)\n", why, fmtDur(at.Sub(now)))
			ch.stop()
			termAt = now
			fallthrough
		default:
			killAt = at
			kill.Reset(time.Until(at))
		}
	}
	for {
		select {
		case end.waitErr = <-w.waitc:
			end.late = !time.Now().Before(killBy().Add(lead))
			return end
		case <-ended:
			ended = nil
			if err := w.why(); end.lostErr == nil || end.stoppedEarly {
				end.lostErr = err
			}
			now := time.Now()
			stop(w.stopMsg(end.lostErr), now, minTime(now.Add(grace), killBy()))
		case <-w.renewed:
			ch.deadline(killBy().Add(lead))
		case <-jeopardy.C:
			now := time.Now()
			if at := killBy().Add(-grace); now.Before(at) {
				jeopardy.Reset(time.Until(at)) // renewed since
				continue
			}
			switch {
			case now.Before(killBy().Add(lead)): // the supervisor's deadline
				end.stoppedEarly = end.stoppedEarly || (termAt.IsZero() && !killed)
			case end.lostErr == nil:
				// Too late to stop CMD in time: etcdlock itself was
				// paused or starved past it. The hold is as good as lost.
				end.lostErr = fmt.Errorf("%w: the lease may have expired before etcdlock could stop %s (etcdlock was paused or starved)", etcdlock.ErrSessionExpired, cmdName)
			}
			stop(fmt.Sprintf("etcd has not confirmed a renewal of the lease for %s, and %s can pass on %s from now (--ttl %s): %s must be gone by then",
				fmtDur(now.Sub(w.s.Expiry().Add(-w.s.TTL()))), held, fmtDur(max(0, w.s.Expiry().Sub(now))), w.s.TTL(), cmdName), now, killBy())
		case <-kill.C:
			// The wait planned, not the one measured: a timer may fire a
			// hair early or late.
			fmt.Fprintf(stderr, "etcdlock: %s still runs %s after SIGTERM; sending it SIGKILL\n", cmdName, fmtDur(killAt.Sub(termAt)))
			ch.kill()
			killed = true
		case <-w.asked:
			w.asked = nil
			w.onAsked()
		case sig := <-w.sigc:
			w.onSignal(sig)
		}
	}
}
