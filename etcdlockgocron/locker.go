package etcdlockgocron

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/go-co-op/gocron/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Locker is a gocron.Locker on etcd: give every replica's scheduler
// one, with the same minimum hold and prefix
// (gocron.WithDistributedLocker), and each tick of a job runs on one
// replica (see the package comment for the conditions). It is safe for
// concurrent use.
//
// The locks are taken through an etcdlock Session of the Locker's own,
// made at the first Lock; when it ends (its lease expired while etcd was
// out of reach, or was revoked), the next Lock makes a new one, so a
// replica cut off longer than the TTL takes part again once etcd is
// back. Close ends it.
type Locker struct {
	cli      *clientv3.Client
	minHold  time.Duration
	prefix   string
	session  []etcdlock.SessionOption
	identity string // WithIdentity's, or defaultIdentity

	// starting is a token, held by the Lock that makes a new session:
	// the Locks that need one meanwhile wait for it (or for their ctx)
	// rather than each grant a lease.
	starting chan struct{}

	mu     sync.Mutex        // guards s and closed
	s      *etcdlock.Session // the current session; nil before the first Lock
	closed bool              // Close was called
}

// NewLocker returns a Locker that takes its locks through cli, each kept
// for at least minHold after it was taken (etcdlock.WithMinHold). Choose
// minHold longer than the worst spread between the replicas' attempts at
// one tick (their clocks' skew, gocron's firing delay, etcd's latency),
// and shorter than the job's interval less that spread: half the
// shortest interval of the jobs it locks is the usual choice. Jobs of
// very different intervals take a Locker each, given with
// gocron.WithDistributedJobLocker.
//
// NewLocker makes no RPC. It returns an error wrapping
// etcdlock.ErrInvalidOption for a nil cli, a minHold that is not
// positive or that etcdlock.WithMinHold refuses (above
// etcdlock.MaxLockDelay, below a millisecond), or an invalid Option or
// session option, and etcdlock.ErrInvalidName for a prefix that makes
// every name invalid.
func NewLocker(cli *clientv3.Client, minHold time.Duration, opts ...Option) (*Locker, error) {
	o := options{prefix: DefaultPrefix}
	if err := o.apply(opts); err != nil {
		return nil, err
	}
	switch {
	case o.yield:
		return nil, fmt.Errorf("etcdlockgocron: %w: YieldOnRequest is an option of NewElector", etcdlock.ErrInvalidOption)
	case o.delaySet:
		return nil, fmt.Errorf("etcdlockgocron: %w: WithTakeoverDelay is an option of NewElector", etcdlock.ErrInvalidOption)
	}
	if minHold <= 0 {
		return nil, fmt.Errorf("etcdlockgocron: %w: minimum hold %v: a Locker needs one, or every replica runs each tick it fires once the last run ended", etcdlock.ErrInvalidOption, minHold)
	}
	if cli == nil {
		return nil, fmt.Errorf("etcdlockgocron: %w: nil client", etcdlock.ErrInvalidOption)
	}
	if err := checkName(o.prefix + "job"); err != nil {
		return nil, fmt.Errorf("%w (prefix %.64q)", err, o.prefix)
	}
	if err := etcdlock.CheckMutexOptions(etcdlock.WithMinHold(minHold)); err != nil {
		return nil, fmt.Errorf("etcdlockgocron: %w", err)
	}
	if err := etcdlock.CheckSessionOptions(o.session...); err != nil {
		return nil, fmt.Errorf("etcdlockgocron: %w", err)
	}
	if !o.identitySet {
		o.identity = defaultIdentity()
	}
	return &Locker{
		cli:      cli,
		minHold:  minHold,
		prefix:   o.prefix,
		session:  o.session,
		identity: o.identity,
		starting: make(chan struct{}, 1),
	}, nil
}

// Lock takes the lock of the job named key, prefix + key, if no replica
// holds it, and never waits for it: gocron runs the job only when Lock
// returns nil, and skips the run otherwise. The lock is released by the
// returned Lock's Unlock, which gocron calls when the run ends, but no
// sooner than the minimum hold after Lock took it.
//
// Lock returns an error matching etcdlock.ErrLocked when another replica
// holds the lock: it runs the tick, or ran it less than the minimum hold
// ago, or runs an earlier one still. The error says which replica (its
// WithIdentity), or that the record of a run that ended keeps the tick
// out until its minimum hold has passed: that costs a read, on a skipped
// tick only. A run of the job still under way on
// this replica holds it too. Lock is bounded by ctx and by the minimum
// hold: an attempt that etcd has not answered by then fails with
// context.DeadlineExceeded, as a lock taken later could be taken after
// the hold of the replica that ran the tick had passed, and the tick run
// twice. It fails, too, with the session's error when no session can be
// started, with etcdlock.ErrInvalidName for a name the library refuses,
// and with an error matching etcdlock.ErrSessionClosed after Close. On
// failure Lock leaves no key of this replica under the lock's name: a
// write whose answer comes after d has its key removed by the session as
// soon as etcd answers, without holding Lock up.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	ctx, cancel := context.WithTimeout(ctx, l.minHold)
	defer cancel()
	s, err := l.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcdlockgocron: lock job %q: %w", key, err)
	}
	m := etcdlock.NewMutex(s, l.prefix+key, etcdlock.WithMinHold(l.minHold), etcdlock.WithIdentity(newRecord(l.identity)))
	if err := m.TryLock(ctx); err != nil {
		return nil, fmt.Errorf("etcdlockgocron: lock job %q: %w", key, whoHolds(ctx, l.cli, l.prefix+key, err))
	}
	return jobLock{m}, nil
}

// current returns the Locker's session, started anew if there is none or
// it has ended.
func (l *Locker) current(ctx context.Context) (*etcdlock.Session, error) {
	if s, err := l.live(); s != nil || err != nil {
		return s, err
	}
	select {
	case l.starting <- struct{}{}:
		defer func() { <-l.starting }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// Another Lock may have started one while this one waited.
	if s, err := l.live(); s != nil || err != nil {
		return s, err
	}
	// WithContext last: the session lives until Close, not until the end
	// of the ctx of the Lock that started it, nor of one the options
	// gave.
	opts := append(l.session[:len(l.session):len(l.session)], etcdlock.WithContext(context.Background()))
	s, err := etcdlock.NewSession(ctx, l.cli, opts...)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		s.Close()
		return nil, errClosed
	}
	if l.s != nil {
		l.s.Orphan() // it has ended: this only waits for its goroutines
	}
	l.s = s
	return s, nil
}

// live returns the current session if it runs, nil if a new one is
// needed, and an error after Close.
func (l *Locker) live() (*etcdlock.Session, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.closed:
		return nil, errClosed
	case l.s != nil && l.s.Err() == nil:
		return l.s, nil
	}
	return nil, nil
}

// errClosed is the error of a Lock after Close.
var errClosed = fmt.Errorf("locker closed: %w", etcdlock.ErrSessionClosed)

// Close ends the Locker's session: it revokes its lease, so every lock it
// holds is released, but a minimum hold not yet passed, which an etcd
// lease keeps to its end (whole seconds): the replica may stop at once
// without another running the tick again. Call it after the scheduler's
// Shutdown, which waits for the runs under way. Later Locks fail. Close
// returns the error of the lease's revoke (the lease then expires within
// the TTL); calling it again does nothing.
func (l *Locker) Close() error {
	l.mu.Lock()
	s, already := l.s, l.closed
	l.closed = true
	l.mu.Unlock()
	if s == nil || already {
		return nil
	}
	return s.Close()
}

// jobLock is a gocron.Lock: the hold of one run.
type jobLock struct{ m *etcdlock.Mutex }

// Unlock releases the hold: at once if the minimum hold has passed, and
// otherwise when it does, in the background; it then returns nil without
// an RPC. See etcdlock's Mutex.Unlock.
func (j jobLock) Unlock(ctx context.Context) error { return j.m.Unlock(ctx) }
