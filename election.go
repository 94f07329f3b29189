package etcdlock

import (
	"bytes"
	"context"
	"errors"
	"iter"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Elections: a Mutex whose holder publishes a value (Campaign, Proclaim,
// Resign, Observe), and the calls that follow an election without a
// Session (CurrentLeader, ObserveLeader). Its queue is the Mutex's.

// Leader is one observation of an election: who leads it at a revision.
type Leader struct {
	Key      string           // the leader's key, name/<lease ID in hex>; "" when there is no leader
	Value    []byte           // the leader's proposal: its Campaign's value, or its last Proclaim's
	Lease    clientv3.LeaseID // the lease the leader's key is bound to
	Token    int64            // the leader key's create revision: the leader's fencing token
	Revision int64            // the etcd revision this observation is true at
	// The leader key's mod revision and version: they change with every
	// Proclaim (the version counts the key's writes since its creation).
	ModRevision, Version int64
}

// same reports whether l and m say the same: the same leader (or none)
// with the same value and lease, whatever their revisions.
func (l Leader) same(m Leader) bool {
	return l.Key == m.Key && l.Token == m.Token && l.Lease == m.Lease && bytes.Equal(l.Value, m.Value)
}

// leaderOf is the Leader that kv, the oldest key of an election, makes at
// revision rev.
func leaderOf(kv *mvccpb.KeyValue, rev int64) Leader {
	return Leader{Key: string(kv.Key), Value: kv.Value, Lease: clientv3.LeaseID(kv.Lease), Token: kv.CreateRevision, Revision: rev, ModRevision: kv.ModRevision, Version: kv.Version}
}

// An Election is a fair leader election on etcd: a Mutex whose holder, the
// leader, publishes a value. Candidates queue in the order their keys were
// created and win in that order; each watches only the key just ahead, so a
// leader's resignation wakes exactly the next candidate. The leader is
// always the oldest key of the election.
//
// The key is name/<lease ID in hex> and its value the proposal: the layout
// of etcd's concurrency.Election and `etcdctl elect`, so that they, and
// this package's Election, queue behind each other and observe each other
// on one name. Names may contain "/": an election named "a/b" never mixes
// with one named "a" or "ab".
//
// Winning is not, by itself, mutual exclusion: a leader that is paused or
// cut off longer than its session's TTL loses leadership while it still
// runs. Done closes before anyone else can be elected; guard writes to
// etcd with IsOwner, and writes elsewhere with Token.
//
// An election's keys are exclusive keys of the lock of the same name (their
// values never read as another mode: see ErrInvalidValue), so a Mutex,
// RWMutex or Semaphore of the same name would queue with the candidates
// and exclude the leader. Do not share a name between an election and a
// lock: observers would report a lock holder as the leader.
//
// An Election is safe for concurrent use, with one candidacy at a time per
// Session and name (they share the key): a Campaign while another Campaign
// of the same Session and name waits, or while another Election of them
// leads, waits for that candidacy's Resign. Lead runs the whole
// primary/standby loop on an Election.
type Election struct{ queue }

// NewElection returns an Election for the election called name, in which
// session s campaigns. Names are checked by Campaign, which returns
// ErrInvalidName for an invalid name (see ErrInvalidName).
func NewElection(s *Session, name string) *Election {
	e := new(Election)
	e.init(s, name, KindElection, nil)
	return e
}

// anyMode accepts a hold of any mode.
func anyMode(KeyMode) bool { return true }

// checkValue returns ErrInvalidValue for a value that could read as the
// mode of a lock's key: Proclaim changes a key's value in place, which
// Invariant K allows only for values that are all of one mode.
func checkValue(value string) error {
	if strings.HasPrefix(value, modeHeader) {
		return errorf("%w: %q is reserved", ErrInvalidValue, modeHeader)
	}
	return nil
}

// Campaign blocks until e is the leader, ctx ends, or the session ends.
// Candidates win in the order they joined (first come, first served). One
// round trip puts the key, with value as its proposal, and reads who is
// ahead: an uncontended Campaign is that one RPC.
//
// While it waits, Campaign rides out broken watches and etcd leader
// elections, and it watches its own key: if the session's lease ends (it
// expired, was revoked, or the session was closed), Campaign returns an
// error matching ErrSessionExpired at once: it neither blocks nor returns
// nil holding nothing. If someone deletes the key, it returns an error
// matching ErrLockLost.
//
// On failure Campaign leaves no key of this session in the election (if
// etcd cannot be reached to remove it, or the session has ended, the key
// goes with the session's lease) and returns ctx's
// error, an error matching ErrSessionExpired, ErrLockLost, ErrInvalidName,
// ErrInvalidValue, or etcd's error. If e won just as ctx ended, it resigns
// again and Campaign returns ctx's error.
//
// If e is already the leader, Campaign proclaims value and returns, as
// etcd's Campaign does. If its leadership was lost and not yet resigned,
// Campaign ends that term and campaigns anew.
func (e *Election) Campaign(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	if e.holding(anyMode) {
		if e.Err() == nil {
			err := e.Proclaim(ctx, value)
			if !errors.Is(err, ErrNotLeader) {
				return err
			}
		}
		// Leadership was lost: end that term, then campaign anew.
		if err := e.unlock(ctx, nil, "Campaign"); err != nil && !errors.Is(err, ErrLockLost) && !errors.Is(err, ErrLockReleased) {
			return err
		}
	}
	return e.lockValue(ctx, KeyMode{}, value, true)
}

// Proclaim makes value the leader's proposal, keeping the key's lease and
// create revision (so its place and Token): observers see the new value.
// The Put is guarded by the key's create revision, so Proclaim never
// writes a key that is not this leadership's.
//
// It returns an error matching ErrNotLeader if e is not the leader: it has
// not won, it resigned or a Resign is under way or failed (call Resign
// again), or its leadership is lost (then the error also says why, and
// Done closes). If the RPC fails, the value may or may not
// have been written, e stays the leader, and Proclaim may be called again.
//
// A proclaimed value changes the key's value but never its mode: every
// value an Election writes reads as exclusive (ErrInvalidValue), so a
// waiter of a lock of the same name never sees its turn change in place.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := checkValue(value); err != nil {
		return err
	}
	e.mu.Lock()
	h := e.h
	var lost error
	switch {
	case h == nil:
		lost = errors.New("not elected")
	case h.ended():
		lost = h.err
		if lost == nil {
			lost = errors.New("leadership ended")
		}
	case !h.intact():
		lost = errors.New("resigning")
	default:
		lost = e.unwatchedLoss(h)
	}
	e.mu.Unlock()
	if lost != nil {
		return errorf("%w: %w", ErrNotLeader, lost)
	}
	resp, err := e.s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.key), "=", h.rev)).
		Then(clientv3.OpPut(e.key, value, clientv3.WithIgnoreLease())).
		Commit()
	if err != nil {
		return errorf("proclaim %s: %w", e.key, e.rpcErr(err))
	}
	if !resp.Succeeded {
		cause := e.whyKeyGone(ctx, 0)
		e.lose(h, cause)
		return errorf("%w: %w: %w", ErrNotLeader, ErrLockLost, cause)
	}
	return nil
}

// Resign gives up the leadership: it deletes the key only if it is still
// this leadership's (same create revision), so it can never delete
// another candidate's key, however often it is sent. (A waiting Campaign
// gives up its place when its ctx ends.)
//
// Resign is idempotent: it returns nil when e is not the leader (never
// won, or already resigned). It returns an error matching ErrLockLost when
// leadership was lost before Resign began (as Mutex.Unlock does); e is
// then no longer the leader either.
//
// Resign rides out errors that pass, as Mutex.Unlock does. If ctx ends
// before etcd confirms the resignation, Resign returns ctx's error, e is
// no longer the leader (Token returns 0), and the resignation goes on in
// the background while the session lives; a retried Resign waits for it.
// So the key never outlives a Resign whose RPC failed, and a retry never
// returns nil while the key may stay. A Resign while
// another Resign of e is under way returns an error matching
// ErrLockReleased.
func (e *Election) Resign(ctx context.Context) error {
	err := e.unlock(ctx, nil, "Resign")
	if errors.Is(err, ErrLockReleased) && !e.holding(anyMode) {
		return nil
	}
	return err
}

// Leader returns the election's current leader, read linearizably: the
// oldest key of the election. When there is none it returns an error
// matching ErrNoLeader, and a Leader with only Revision set.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if e.s == nil {
		return Leader{}, errorf("%w: no Session", ErrSessionExpired)
	}
	return CurrentLeader(ctx, e.s.cli, e.lockName())
}

// Observe is ObserveLeader on e's client and name. It needs no lease: it
// goes on after e's session ends.
func (e *Election) Observe(ctx context.Context) iter.Seq2[Leader, error] {
	if e.s == nil {
		return func(yield func(Leader, error) bool) {
			yield(Leader{}, errorf("%w: no Session", ErrSessionExpired))
		}
	}
	return ObserveLeader(ctx, e.s.cli, e.lockName())
}

// Done returns a channel closed when the current leadership ends, for any
// reason: Resign, or loss (the key was deleted, the session's lease expired
// or was revoked, the session ended). Loss by lease expiry is reported
// before etcd can elect anyone else: the session counts its lease's life
// from when each renewal was sent and ends a margin before it runs out.
// When e is not the leader, Done returns the channel of the last
// leadership, or a closed channel if there was none.
func (e *Election) Done() <-chan struct{} { return e.queue.Done() }

// ReleaseRequested returns a channel closed when the current leadership is
// asked to step down (RequestRelease on the election's name). The leader
// decides: it stays the leader until Resign. Lead resigns by itself when
// made with YieldOnRequest. See Mutex.ReleaseRequested.
func (e *Election) ReleaseRequested() <-chan struct{} { return e.queue.ReleaseRequested() }

// Err returns nil while e leads and after Resign, and an error matching
// ErrLockLost once leadership ended involuntarily (until the next
// Campaign), as Mutex.Err does.
func (e *Election) Err() error { return e.queue.Err() }

// Token returns the fencing token of the current leadership: the create
// revision of the leader's key. Successive leaders' tokens strictly
// increase. Token returns 0 when e is not the leader; after a loss it
// returns the lost leadership's token until Resign.
func (e *Election) Token() int64 { return e.queue.Token() }

// IsOwner returns a comparison that holds only while e's current
// leadership lasts: use it in Txn().If to make a write conditional on
// being the leader. When e is not the leader it never holds.
func (e *Election) IsOwner() clientv3.Cmp { return e.queue.IsOwner() }

// Key returns e's key in etcd: name/<lease ID in hex>.
func (e *Election) Key() string { return e.queue.Key() }

// Header returns the header of the etcd response that showed e had won,
// or nil when e is not the leader.
func (e *Election) Header() *pb.ResponseHeader { return e.queue.Header() }

// CurrentLeader returns the leader of the election called name, read
// linearizably through cli: the oldest direct child of name/ (keys of
// nested elections, name/sub/..., do not count). It needs no Session. When
// there is no leader it returns an error matching ErrNoLeader, and a
// Leader with only Revision set.
func CurrentLeader(ctx context.Context, cli *clientv3.Client, name string) (Leader, error) {
	if err := checkName(name); err != nil {
		return Leader{}, err
	}
	l, err := leaderAt(ctx, cli, name+"/", 0)
	if err != nil {
		return Leader{}, err
	}
	if l.Key == "" {
		return l, errorf("%w: %s", ErrNoLeader, name)
	}
	return l, nil
}

// leaderAt reads the oldest direct child of pfx at revision rev (the
// newest when 0), linearizably.
func leaderAt(ctx context.Context, cli *clientv3.Client, pfx string, rev int64) (Leader, error) {
	page := func() []clientv3.OpOption {
		return []clientv3.OpOption{
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend),
			clientv3.WithLimit(queueScan),
		}
	}
	first := append(page(), clientv3.WithPrefix())
	if rev > 0 {
		first = append(first, clientv3.WithRev(rev))
	}
	resp, err := cli.Get(ctx, pfx, first...)
	if err != nil {
		return Leader{}, err
	}
	if rev == 0 {
		rev = resp.Header.Revision
	}
	// Later pages read at the first one's revision: the answer is the
	// state at one revision.
	p := pager{cli: cli, pfx: pfx, rev: rev, page: page}
	p.add(resp.Kvs, resp.More)
	for kvs := resp.Kvs; ; {
		for _, kv := range kvs {
			if isChild(pfx, kv.Key) {
				return leaderOf(kv, rev), nil
			}
		}
		if !p.more {
			return Leader{Revision: rev}, nil
		}
		if kvs, err = p.next(ctx); err != nil {
			return Leader{}, err
		}
	}
}

// ObserveLeader observes the election called name through cli, with no
// lease: standbys and clients that only route to the leader need no
// Session.
//
// The sequence yields the current state first (the leader, or a Leader
// with Key "" when there is none), then every change, in revision order:
// a new leader, a new proclaimed value, no leader. Each Leader yielded was
// the oldest key of the election at its Revision (never a later
// candidate, as etcd's Observe can report), and no state is yielded twice
// in a row. "No leader" is yielded as such, so a cached leader never
// outlives its key.
//
// Broken watches, etcd leader elections and member restarts are ridden
// out: the watch resumes after the last revision seen, so no change is
// missed or repeated. If etcd compacted that revision meanwhile, the
// state is read again and yielded if it differs: changes that came and
// went within the compacted history are not seen. While etcd is out of
// reach the sequence waits, and the last state yielded may be stale.
//
// The sequence ends when the loop breaks (its watch ends with it), when
// ctx ends, or after it yields an error: ErrInvalidName, or an error of
// etcd that does not pass (a closed client, a permission denied). The end
// of ctx is the caller's own doing, so it ends the sequence without an
// error, as a break does: after the loop, ctx.Err() != nil tells that ctx
// ended it. Otherwise it never ends without an error.
//
// The watch starts at the current revision, so that etcd counts it as
// synced and sends each event at once: a watch started at an older
// revision waits for etcd's next resync pass, up to 100ms. One read
// closes the gap between the two.
func ObserveLeader(ctx context.Context, cli *clientv3.Client, name string) iter.Seq2[Leader, error] {
	return func(yield func(Leader, error) bool) {
		if err := checkName(name); err != nil {
			yield(Leader{}, err)
			return
		}
		o := &observer{cli: cli, name: name, pfx: name + "/", yield: yield}
		if err := o.run(ctx); err != nil && !errors.Is(err, errStopped) && ctx.Err() == nil {
			yield(Leader{}, err)
		}
	}
}

// errStopped says the caller's loop broke.
var errStopped = errors.New("etcdlock: observer stopped")

// An observer is the state of one ObserveLeader sequence.
type observer struct {
	cli   *clientv3.Client
	name  string
	pfx   string // name + "/"
	yield func(Leader, error) bool

	known bool   // cur is the state at rev
	cur   Leader // the leader (or none) at rev
	rev   int64  // every change up to rev is in cur

	out     Leader // the state last yielded
	yielded bool   // out is set
}

// run observes until ctx ends, the caller stops, or an error that does not
// pass.
func (o *observer) run(ctx context.Context) error {
	backoff := minBackoff // the waiter's backoff (retry.go)
	for {
		started := time.Now()
		err := o.watch(ctx)
		switch {
		case errors.Is(err, errStopped):
			return err
		case ctx.Err() != nil:
			return ctx.Err()
		case o.cli.Ctx().Err() != nil:
			return errorf("observe %s: %w: %w", o.name, errClientClosed, o.cli.Ctx().Err())
		case errors.Is(err, rpctypes.ErrCompacted):
			// History since rev is gone: read the state anew.
			o.known = false
		case !transient(err):
			return errorf("observe %s: %w", o.name, err)
		}
		if time.Since(started) > maxBackoff {
			backoff = minBackoff
		}
		if !pause(ctx, &backoff) {
			return ctx.Err()
		}
	}
}

// watch watches the election: from where the last watch stopped if the
// state is known, else from now with one read. It yields each change and
// returns when the watch ends.
func (o *observer) watch(ctx context.Context) error {
	// WithRequireLeader: a member cut off from the leader cancels the watch
	// rather than leaving it silent while the election moves on elsewhere;
	// run resumes it, on another member if the client has one.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCreatedNotify()}
	if o.known {
		// Resuming: no change may be missed, so start right after the
		// last revision seen. Such a watch is unsynced for as long as it
		// replays; that is the price of a broken watch only.
		opts = append(opts, clientv3.WithRev(o.rev+1))
	}
	ch := o.cli.Watch(wctx, o.pfx, opts...)
	wr, ok := <-ch
	if !ok || wr.Err() != nil || !wr.Created {
		return o.watchErr(ctx, wr)
	}
	if !o.known {
		// The watch delivers what happens after its creation; the read,
		// linearizable, is at a revision at least that: it closes the gap,
		// and the watch's events up to it are skipped.
		l, err := leaderAt(ctx, o.cli, o.pfx, 0)
		if err != nil {
			return err
		}
		if err := o.set(l, l.Revision); err != nil {
			return err
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case wr, ok := <-ch:
			if !ok || wr.Err() != nil {
				return o.watchErr(ctx, wr)
			}
			if err := o.apply(ctx, wr.Events); err != nil {
				return err
			}
			if len(wr.Events) == 0 {
				// Progress, as etcd's client counts it: every event
				// before the header's revision has been delivered.
				o.rev = max(o.rev, wr.Header.Revision-1)
			}
		}
	}
}

// watchErr explains why the watch ended: ctx, compaction (matching
// rpctypes.ErrCompacted), a refusal (rpctypes.ErrPermissionDenied), or a
// broken watch.
func (o *observer) watchErr(ctx context.Context, wr clientv3.WatchResponse) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if wr.CompactRevision != 0 {
		return rpctypes.ErrCompacted
	}
	if refused(wr.Err()) {
		// etcd cancels a watch the user may not make: that does not
		// pass, and it ends the sequence (it was retried for ever).
		return rpctypes.ErrPermissionDenied
	}
	return errorf("%w: %w", errWatchBroken, wr.Err())
}

// apply applies a watch response's events, one revision at a time.
func (o *observer) apply(ctx context.Context, evs []*clientv3.Event) error {
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		j := i + 1
		for j < len(evs) && evs[j].Kv.ModRevision == rev {
			j++
		}
		if rev > o.rev { // else the read that closed the gap saw it
			if err := o.step(ctx, rev, evs[i:j]); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

// step applies the events of revision rev. Only the leader's key and, with
// no leader, a new key can change the state: keys behind the leader are
// not observed. When the leader's key goes, the new leader is read at
// exactly rev: the oldest key then, whatever came later.
func (o *observer) step(ctx context.Context, rev int64, evs []*clientv3.Event) error {
	next, reread, created := o.cur, false, 0
	for _, ev := range evs {
		if !isChild(o.pfx, ev.Kv.Key) {
			continue // a nested election's key
		}
		switch {
		case o.cur.Key == "":
			created++
			if ev.Type == mvccpb.PUT && ev.Kv.CreateRevision == rev {
				next = leaderOf(ev.Kv, rev)
			} else {
				reread = true
			}
		case string(ev.Kv.Key) != o.cur.Key:
			// A candidate behind the leader joined, left or changed.
		case ev.Type == mvccpb.PUT && ev.Kv.CreateRevision == o.cur.Token:
			next = leaderOf(ev.Kv, rev)
		default:
			reread = true // the leader's key went (or was created anew)
		}
	}
	if reread || created > 1 {
		l, err := o.readAt(ctx, rev)
		if err != nil {
			return err
		}
		next = l
	}
	return o.set(next, rev)
}

// readAt reads the leader at rev, linearizably: the member that answers
// has applied rev first. (The watch that reported rev may run on another
// member than the read, and a serializable read at a revision a member has
// not applied yet fails, which etcd's client logs as a warning. A new
// leader is read once per change of leader: the round trip to etcd's
// leader costs little.)
func (o *observer) readAt(ctx context.Context, rev int64) (Leader, error) {
	return leaderAt(ctx, o.cli, o.pfx, rev)
}

// set makes l the state at rev, and yields it unless it says what the
// last one yielded said.
func (o *observer) set(l Leader, rev int64) error {
	o.cur, o.known, o.rev = l, true, max(o.rev, rev)
	if o.yielded && o.out.same(l) {
		return nil
	}
	o.out, o.yielded = l, true
	if !o.yield(l, nil) {
		return errStopped
	}
	return nil
}
