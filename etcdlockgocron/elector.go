package etcdlockgocron

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An Elector is a gocron.Elector on etcd: give every replica's scheduler
// one, with the same election name (gocron.WithDistributedElector), and
// only the leader runs the jobs. It is safe for concurrent use.
//
// It runs etcdlock.Lead in a goroutine of its own until Close: the
// replica campaigns in the election, leads until its leadership ends,
// and then campaigns again, with a new session, behind the others. A
// leader that dies or is cut off from etcd is followed by the next
// replica in line once its lease runs out, at most the session's TTL
// later; the ticks that fall between run nowhere.
type Elector struct {
	name   string
	delay  time.Duration      // WithTakeoverDelay's
	cancel context.CancelFunc // ends the campaign
	done   chan struct{}      // closed when the campaign's goroutine has returned

	// term is the ctx etcdlock.Lead gave the current leadership, once
	// its takeover delay has passed; nil before the first: Lead cancels
	// it when the leadership ends, before any other replica can win.
	term atomic.Pointer[context.Context]

	mu  sync.Mutex // guards err
	err error      // why the campaign ended, if not by Close
}

// NewElector starts campaigning, through cli, in the election called
// name, with value as this replica's proposal (for example its host
// name: `etcdlock status NAME` shows it); an empty value campaigns with
// the replica's identity (WithIdentity, by default "HOST:PID"). It makes no RPC. It returns an
// error wrapping etcdlock.ErrInvalidOption for a nil cli, an invalid
// Option or session option, and etcdlock.ErrInvalidName for an invalid
// name. What only etcdlock.Lead checks, the value, ends the campaign at
// once: IsLeader then says why.
//
// Do not share the name with a lock: the election's keys are a lock's
// keys of that name (see etcdlock.Election).
func NewElector(cli *clientv3.Client, name, value string, opts ...Option) (*Elector, error) {
	o := options{delay: DefaultTakeoverDelay}
	if err := o.apply(opts); err != nil {
		return nil, err
	}
	if o.prefixSet {
		return nil, fmt.Errorf("etcdlockgocron: %w: WithPrefix is an option of NewLocker", etcdlock.ErrInvalidOption)
	}
	lopts := []etcdlock.LeadOption{etcdlock.WithSessionOptions(o.session...)}
	if o.yield {
		lopts = append(lopts, etcdlock.YieldOnRequest())
	}
	if cli == nil {
		return nil, fmt.Errorf("etcdlockgocron: %w: nil client", etcdlock.ErrInvalidOption)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := etcdlock.CheckSessionOptions(o.session...); err != nil {
		return nil, fmt.Errorf("etcdlockgocron: %w", err)
	}
	if value == "" {
		value = o.identity
		if !o.identitySet {
			value = defaultIdentity()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Elector{name: name, delay: o.delay, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		err := etcdlock.Lead(ctx, cli, name, value, e.lead, lopts...)
		if ctx.Err() == nil {
			// Lead gave up: a closed client, a permission etcd denies.
			e.mu.Lock()
			e.err = err
			e.mu.Unlock()
		}
	}()
	return e, nil
}

// lead is Lead's fn: it publishes the leadership's ctx once the takeover
// delay has passed, and keeps it until Lead ends it. Returning only then
// makes Lead campaign again after a loss, and resign when Close ends the
// campaign.
func (e *Elector) lead(ctx context.Context) error {
	delay := time.NewTimer(e.delay)
	defer delay.Stop()
	select {
	case <-delay.C:
		e.term.Store(&ctx)
	case <-ctx.Done():
	}
	<-ctx.Done()
	return context.Cause(ctx)
}

// IsLeader returns nil while this replica leads the election, from the
// takeover delay after it won (WithTakeoverDelay) until its leadership
// ends, and otherwise an error matching etcdlock.ErrNotLeader. It answers from the
// replica's own state, without an RPC: the leadership ends, here, before
// another replica can win (when the lease is about to run out unrenewed,
// a margin before etcd ends it). gocron asks before each run, so a run
// started while leading may go on after the leadership was lost (a
// process paused longer than the TTL, a long job): fence the job's
// writes with Term.
//
// ctx is not used: IsLeader never waits.
func (e *Elector) IsLeader(context.Context) error {
	if t := e.term.Load(); t != nil && (*t).Err() == nil {
		return nil
	}
	e.mu.Lock()
	err := e.err
	e.mu.Unlock()
	if err != nil {
		return fmt.Errorf("etcdlockgocron: %w of %q: campaign ended: %w", etcdlock.ErrNotLeader, e.name, err)
	}
	return fmt.Errorf("etcdlockgocron: %w of %q", etcdlock.ErrNotLeader, e.name)
}

// Term returns the current leadership and true while IsLeader answers
// nil, and false otherwise. Its Token is a fencing token (a later leadership
// has a larger one) and its IsOwner a comparison that holds only while
// the leadership lasts: see etcdlock.Term.
func (e *Elector) Term() (etcdlock.Term, bool) {
	t := e.term.Load()
	if t == nil || (*t).Err() != nil {
		return etcdlock.Term{}, false
	}
	return etcdlock.TermFromContext(*t)
}

// Close ends the campaign and waits for its goroutine: a leader resigns,
// so that the next replica in line leads at once, rather than a TTL
// later, and its lease is revoked (if etcd is out of reach, Close gives
// up after 5s and the lease expires on its own). Call it after the
// scheduler's Shutdown. IsLeader then returns an error. Close returns
// nil; calling it again does nothing.
func (e *Elector) Close() error {
	e.cancel()
	<-e.done
	return nil
}
