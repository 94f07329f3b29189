package concurrency

import (
	"context"
	"errors"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	v3 "go.etcd.io/etcd/client/v3"

	"github.com/etcdlock/etcdlock"
)

var (
	ErrElectionNotLeader = errors.New("election: not leader")
	ErrElectionNoLeader  = errors.New("election: no leader")
)

// Election is an etcdlock.Election (see Etcdlock) on the name pfx: the
// candidates' keys are pfx/<lease ID in hex> with the value proposed, as
// in etcd, so candidates on etcd's package and on this one run in one
// election. Elections of one Session (or of Sessions sharing a lease) on
// one name share one leadership, as they share one key in etcd.
type Election struct {
	session *Session
	name    string

	mu        sync.Mutex
	h         *hold
	leaderKey string
	leaderRev int64
	// resumed: a ResumeElection of a leadership this process does not
	// hold; Proclaim and Resign act on that key as etcd's do.
	resumed bool
	hdr     *pb.ResponseHeader
}

// NewElection returns a new election on a given key prefix.
func NewElection(s *Session, pfx string) *Election {
	return &Election{session: s, name: pfx}
}

// ResumeElection initializes an election with a known leader.
//
// If s holds that leadership (leaderKey with create revision leaderRev),
// the Election shares it. Otherwise Proclaim and Resign act on leaderKey
// while its create revision is leaderRev, as etcd's do, and Etcdlock
// returns nil: the fencing token of that hold was handed out by the
// process that won it and is not handed out again; Campaign takes the
// leadership as a new hold (see WithLease).
//
// The election is the one leaderKey is in (etcd's would watch and
// campaign under pfx itself, not pfx + "/"); without a leader key, pfx's.
func ResumeElection(s *Session, pfx string, leaderKey string, leaderRev int64) *Election {
	name := pfx
	if n, ok := etcdlock.LockOfKey(leaderKey); ok {
		name = n
	}
	e := &Election{session: s, name: name, leaderKey: leaderKey, leaderRev: leaderRev}
	if h, _ := s.core.find(name, true); h != nil && h.key() == leaderKey && h.token() == leaderRev {
		e.h, e.hdr = h, h.e.Header()
	} else {
		e.resumed = true
	}
	return e
}

// Campaign puts a value as eligible for the election on the prefix
// key.
// Multiple sessions can participate in the election for the
// same prefix, but only one can be the leader at a time.
//
// If the context is 'context.TODO()/context.Background()', the Campaign
// will continue to be blocked for other keys to be deleted, unless server
// returns a non-recoverable error (e.g. ErrCompacted).
// Otherwise, until the context is not cancelled or timed-out, Campaign will
// continue to be blocked until it becomes the leader.
//
// Campaign returns ErrSessionExpired as soon as the session's lease ends
// while it waits, where etcd's may return nil, leader of nothing.
func (e *Election) Campaign(ctx context.Context, val string) error {
	c := e.session.core
	h, err := c.take(ctx, e.name, true)
	if err != nil {
		return compatErr(ctx, err)
	}
	if h == nil {
		ee := etcdlock.NewElection(c.es, e.name)
		if err := ee.Campaign(ctx, val); err != nil {
			return compatErr(ctx, err)
		}
		h = &hold{c: c, name: e.name, e: ee}
		c.add(h)
	} else if err := h.e.Campaign(ctx, val); err != nil { // the leader's: a Proclaim
		return compatErr(ctx, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.h, e.resumed = h, false
	e.leaderKey, e.leaderRev, e.hdr = h.key(), h.token(), h.e.Header()
	return nil
}

// Proclaim lets the leader announce a new value without another election.
func (e *Election) Proclaim(ctx context.Context, val string) error {
	e.mu.Lock()
	h, resumed, key, rev := e.h, e.resumed, e.leaderKey, e.leaderRev
	e.mu.Unlock()
	switch {
	case h != nil:
		if err := h.e.Proclaim(ctx, val); err != nil {
			if errors.Is(err, etcdlock.ErrNotLeader) {
				e.setLeader("", rev)
			}
			return compatErr(ctx, err)
		}
		e.mu.Lock()
		e.hdr = h.e.Header()
		e.mu.Unlock()
		return nil
	case !resumed:
		return ErrElectionNotLeader
	}
	client := e.session.Client()
	cmp := v3.Compare(v3.CreateRevision(key), "=", rev)
	put := v3.OpPut(key, val, v3.WithLease(e.session.Lease()))
	tresp, err := client.Txn(ctx).If(cmp).Then(put).Commit()
	if err != nil {
		return err
	}
	if !tresp.Succeeded {
		e.setLeader("", rev)
		return ErrElectionNotLeader
	}
	e.mu.Lock()
	e.hdr = tresp.Header
	e.mu.Unlock()
	return nil
}

func (e *Election) setLeader(key string, rev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.leaderKey, e.leaderRev = key, rev
}

// Resign lets a leader start a new election.
//
// It deletes the key only while it is this leadership's (etcdlock's
// Resign), and returns nil once it is gone, as etcd's does.
func (e *Election) Resign(ctx context.Context) (err error) {
	e.mu.Lock()
	h, resumed, key, rev := e.h, e.resumed, e.leaderKey, e.leaderRev
	e.mu.Unlock()
	switch {
	case h != nil:
		if err := h.release(ctx); err != nil && !errors.Is(err, etcdlock.ErrLockLost) && !errors.Is(err, etcdlock.ErrLockReleased) {
			return compatErr(ctx, err)
		}
	case resumed:
		cmp := v3.Compare(v3.CreateRevision(key), "=", rev)
		resp, err := e.session.Client().Txn(ctx).If(cmp).Then(v3.OpDelete(key)).Commit()
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.hdr = resp.Header
		e.mu.Unlock()
	default:
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h == h {
		e.h, e.resumed, e.leaderKey = nil, false, ""
	}
	return nil
}

// Leader returns the leader value for the current election.
func (e *Election) Leader(ctx context.Context) (*v3.GetResponse, error) {
	client := e.session.Client()
	resp, err := client.Get(ctx, e.name+"/", v3.WithFirstCreate()...)
	if err != nil {
		return nil, err
	} else if len(resp.Kvs) == 0 {
		// no leader currently elected
		return nil, ErrElectionNoLeader
	}
	return resp, nil
}

// Observe returns a channel that reliably observes ordered leader proposals
// as GetResponse pointers on every current elected leader key. It will not
// necessarily fetch all historical leader updates, but will always post the
// most recent leader value.
//
// The channel closes when the context is canceled or the underlying watcher
// is otherwise disrupted.
//
// It is etcdlock.ObserveLeader: it rides out compactions, leader changes
// and broken watches, and closes only when ctx ends or etcd refuses
// (permission denied). A response's header carries only the revision its
// leader was observed at.
func (e *Election) Observe(ctx context.Context) <-chan *v3.GetResponse {
	retc := make(chan *v3.GetResponse)
	go e.observe(ctx, retc)
	return retc
}

func (e *Election) observe(ctx context.Context, ch chan<- *v3.GetResponse) {
	defer close(ch)
	for l, err := range etcdlock.ObserveLeader(ctx, e.session.Client(), e.name) {
		if err != nil {
			return
		}
		if l.Key == "" {
			continue // no leader: etcd's waits for one
		}
		kv := &mvccpb.KeyValue{
			Key: []byte(l.Key), Value: l.Value, Lease: int64(l.Lease),
			CreateRevision: l.Token, ModRevision: l.ModRevision, Version: l.Version,
		}
		resp := &v3.GetResponse{Header: &pb.ResponseHeader{Revision: l.Revision}, Kvs: []*mvccpb.KeyValue{kv}, Count: 1}
		select {
		case ch <- resp:
		case <-ctx.Done():
			return
		}
	}
}

// Key returns the leader key if elected, empty string otherwise.
func (e *Election) Key() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leaderKey
}

// Rev returns the leader key's creation revision, if elected.
func (e *Election) Rev() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leaderRev
}

// Header is the response header from the last successful election proposal.
func (e *Election) Header() *pb.ResponseHeader {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hdr
}

// Etcdlock returns the etcdlock.Election of e's leadership, for what
// etcd's API has no words for: its fencing Token, Done and Err (the
// leadership's loss, told before etcd can elect anyone else),
// ReleaseRequested. It returns nil while e is not the leader, and for a
// ResumeElection of a leadership this process did not win.
func (e *Election) Etcdlock() *etcdlock.Election {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h == nil {
		return nil
	}
	return e.h.e
}
