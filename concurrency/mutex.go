package concurrency

import (
	"context"
	"errors"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	v3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// The errors of etcd's package, with its words. They are values of this
// package: compare them with this package's (errors.Is or ==).
var (
	ErrLocked         = errors.New("mutex: Locked by another session")
	ErrSessionExpired = errors.New("mutex: session is expired")
	ErrLockReleased   = errors.New("mutex: lock has already been released")
)

// Mutex implements the sync Locker interface with etcd
//
// It is an etcdlock.Mutex (see Etcdlock) on the name pfx: the key is
// pfx/<lease ID in hex>, as in etcd, so processes on etcd's package and
// on this one queue together. Mutexes of one Session (or of Sessions
// sharing a lease) on one name share one hold, as they share one key in
// etcd: once one holds, the others' Lock and TryLock return nil at once,
// and the Unlock of any of them releases it. One that comes while another
// of the session waits, waits behind it.
type Mutex struct {
	s    *Session
	name string

	mu    sync.Mutex
	h     *hold
	myKey string
	myRev int64
	hdr   *pb.ResponseHeader
}

func NewMutex(s *Session, pfx string) *Mutex {
	return &Mutex{s: s, name: pfx, myRev: -1}
}

// TryLock locks the mutex if not already locked by another session.
// If lock is held by another session, return immediately after attempting necessary cleanup
// The ctx argument is used for the sending/receiving Txn RPC.
//
// A held lock costs one read-only RPC and writes nothing (etcd's writes a
// key and deletes it again), and a TryLock never takes the lock ahead of
// a waiter.
func (m *Mutex) TryLock(ctx context.Context) error {
	return m.lock(ctx, false)
}

// Lock locks the mutex with a cancelable context. If the context is canceled
// while trying to acquire the lock, the mutex tries to clean its stale lock entry.
//
// Lock returns ErrSessionExpired as soon as the session's lease ends
// while it waits (etcd's waits for the keys ahead to go first).
func (m *Mutex) Lock(ctx context.Context) error {
	return m.lock(ctx, true)
}

func (m *Mutex) lock(ctx context.Context, wait bool) error {
	m.mu.Lock()
	held := m.h
	m.mu.Unlock()
	c := m.s.core
	h, err := c.take(ctx, m.name, false)
	if err != nil {
		return compatErr(ctx, err)
	}
	if h != nil && h == held {
		return nil // held already: etcd's finds its key and holds
	}
	if h == nil {
		em := etcdlock.NewMutex(c.es, m.name)
		if wait {
			err = em.Lock(ctx)
		} else {
			err = em.TryLock(ctx)
		}
		if err != nil {
			m.mu.Lock()
			m.h, m.myKey, m.myRev = nil, "\x00", -1
			m.mu.Unlock()
			return compatErr(ctx, err)
		}
		h = &hold{c: c, name: m.name, m: em}
		c.add(h)
	}
	m.mu.Lock()
	m.h, m.myKey, m.myRev, m.hdr = h, h.key(), h.token(), h.m.Header()
	m.mu.Unlock()
	return nil
}

// Unlock releases the lock. It deletes the key only if it is still the
// key this hold created (etcdlock's Unlock), and returns nil, as etcd's
// does, once the key is gone, also when it went before Unlock (the lock
// was lost: Etcdlock's Err says so).
func (m *Mutex) Unlock(ctx context.Context) error {
	m.mu.Lock()
	h := m.h
	m.mu.Unlock()
	if h == nil {
		return ErrLockReleased
	}
	if err := h.release(ctx); err != nil && !errors.Is(err, etcdlock.ErrLockLost) && !errors.Is(err, etcdlock.ErrLockReleased) {
		return compatErr(ctx, err)
	}
	m.mu.Lock()
	if m.h == h {
		m.h, m.myKey, m.myRev = nil, "\x00", -1
	}
	m.mu.Unlock()
	return nil
}

// IsOwner returns a comparison that holds only while this hold lasts.
func (m *Mutex) IsOwner() v3.Cmp {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h != nil {
		return m.h.isOwner()
	}
	return v3.Compare(v3.CreateRevision(m.myKey), "=", m.myRev)
}

func (m *Mutex) Key() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.myKey
}

// Header is the response header received from etcd on acquiring the lock.
func (m *Mutex) Header() *pb.ResponseHeader {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hdr
}

// Etcdlock returns the etcdlock.Mutex of m's current hold, for what
// etcd's API has no words for: its fencing Token, Done and Err (the hold's
// loss, told before etcd can give the lock to anyone else), Do,
// ReleaseRequested. It returns nil while m holds nothing.
func (m *Mutex) Etcdlock() *etcdlock.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.h == nil {
		return nil
	}
	return m.h.m
}

type lockerMutex struct{ *Mutex }

func (lm *lockerMutex) Lock() {
	client := lm.s.Client()
	if err := lm.Mutex.Lock(client.Ctx()); err != nil {
		panic(err)
	}
}

func (lm *lockerMutex) Unlock() {
	client := lm.s.Client()
	if err := lm.Mutex.Unlock(client.Ctx()); err != nil {
		panic(err)
	}
}

// NewLocker creates a sync.Locker backed by an etcd mutex.
func NewLocker(s *Session, pfx string) sync.Locker {
	return &lockerMutex{NewMutex(s, pfx)}
}

// compatErr turns an etcdlock error into the one etcd's package returns
// for the same case: ctx's own error, or one of this package's values.
func compatErr(ctx context.Context, err error) error {
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return ctx.Err()
	case errors.Is(err, etcdlock.ErrLocked):
		return ErrLocked
	case errors.Is(err, etcdlock.ErrNotLeader):
		return ErrElectionNotLeader
	case errors.Is(err, etcdlock.ErrNoLeader):
		return ErrElectionNoLeader
	case errors.Is(err, etcdlock.ErrSessionExpired), errors.Is(err, etcdlock.ErrLockLost):
		return ErrSessionExpired
	}
	return err
}
