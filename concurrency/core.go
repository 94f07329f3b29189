package concurrency

import (
	"context"
	"errors"
	"sync"

	v3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

// A core is the etcdlock Session behind the Sessions of this process on
// one lease, and the holds it has. etcd's package lets two Sessions share
// a lease, and two Mutexes (or Elections) of one lease share a key; the
// etcdlock Session allows one Session per lease and one hold per name, so
// the Sessions and the holds are shared here instead.
type core struct {
	es *etcdlock.Session

	mu    sync.Mutex
	refs  int              // Sessions not yet orphaned
	holds map[string]*hold // by name: the live hold es has on it
}

// cores are the live cores of this process by lease, for WithLease.
var cores struct {
	mu sync.Mutex
	m  map[v3.LeaseID][]*core
}

func newCore(es *etcdlock.Session) *core {
	c := &core{es: es, refs: 1, holds: make(map[string]*hold)}
	cores.mu.Lock()
	defer cores.mu.Unlock()
	if cores.m == nil {
		cores.m = make(map[v3.LeaseID][]*core)
	}
	cores.m[es.Lease()] = append(live(cores.m[es.Lease()]), c)
	return c
}

// live returns the cores of cs whose etcdlock Session has not ended.
func live(cs []*core) []*core {
	out := cs[:0]
	for _, c := range cs {
		if c.es.Err() == nil {
			out = append(out, c)
		}
	}
	return out
}

// findCore returns a live core on lease id, counting one more Session in,
// preferring one of client; nil if there is none.
func findCore(client *v3.Client, id v3.LeaseID) *core {
	cores.mu.Lock()
	defer cores.mu.Unlock()
	cs := live(cores.m[id])
	cores.m[id] = cs
	var found *core
	for _, c := range cs {
		if found == nil || c.es.Client() == client {
			found = c
		}
	}
	if found == nil {
		return nil
	}
	found.mu.Lock()
	defer found.mu.Unlock()
	if found.refs == 0 { // its last Session is orphaning it
		return nil
	}
	found.refs++
	return found
}

// unref counts a Session out; the last one orphans the etcdlock Session.
func (c *core) unref() {
	c.mu.Lock()
	c.refs--
	last := c.refs == 0
	c.mu.Unlock()
	if !last {
		return
	}
	c.es.Orphan()
	cores.mu.Lock()
	defer cores.mu.Unlock()
	cores.m[c.es.Lease()] = live(cores.m[c.es.Lease()])
	if len(cores.m[c.es.Lease()]) == 0 {
		delete(cores.m, c.es.Lease())
	}
}

// A hold is a lock or a leadership of a core on one name, shared by the
// Mutex (or Election) values that took it: in etcd they share the key
// name/<lease>, and the Unlock of any of them deletes it.
type hold struct {
	c    *core
	name string
	m    *etcdlock.Mutex    // a lock, or
	e    *etcdlock.Election // a leadership

	mu       sync.Mutex // serializes the release
	released bool
}

// token, key and err are those of the etcdlock hold.
func (h *hold) token() int64 {
	if h.m != nil {
		return h.m.Token()
	}
	return h.e.Token()
}

func (h *hold) key() string {
	if h.m != nil {
		return h.m.Key()
	}
	return h.e.Key()
}

func (h *hold) isOwner() v3.Cmp {
	if h.m != nil {
		return h.m.IsOwner()
	}
	return h.e.IsOwner()
}

// find returns the live hold of c on name, or the lost one that still
// keeps the name (until it is released, the etcdlock Session lets no new
// hold of it queue).
func (c *core) find(name string, leadership bool) (live, lost *hold) {
	c.mu.Lock()
	h := c.holds[name]
	c.mu.Unlock()
	if h == nil || (h.e != nil) != leadership {
		return nil, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.released:
		return nil, nil
	case h.token() == 0 || h.m != nil && h.m.Err() != nil || h.e != nil && h.e.Err() != nil:
		return nil, h
	}
	return h, nil
}

// take returns the live hold of c on name to share, or nil once the name
// is free to take anew: a lost hold on it is released first, as etcd's
// would put its key again.
func (c *core) take(ctx context.Context, name string, leadership bool) (*hold, error) {
	live, lost := c.find(name, leadership)
	if lost != nil {
		if err := lost.release(ctx); err != nil && !errors.Is(err, etcdlock.ErrLockLost) && !errors.Is(err, etcdlock.ErrLockReleased) {
			return nil, err
		}
	}
	return live, nil
}

// add records a hold just admitted.
func (c *core) add(h *hold) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.holds[h.name] = h
}

// release ends h for all who share it, once: the first call unlocks (or
// resigns), later ones return nil as etcd's do on a deleted key. A
// release whose ctx ended goes on in the etcdlock hold's background, and
// the next call waits for it (etcdlock's Unlock).
func (h *hold) release(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.released {
		return nil
	}
	var err error
	if h.m != nil {
		err = h.m.Unlock(ctx)
	} else {
		err = h.e.Resign(ctx)
	}
	if err == nil || errors.Is(err, etcdlock.ErrLockLost) || errors.Is(err, etcdlock.ErrLockReleased) {
		h.released = true
		h.c.mu.Lock()
		if h.c.holds[h.name] == h {
			delete(h.c.holds, h.name)
		}
		h.c.mu.Unlock()
	}
	return err
}
