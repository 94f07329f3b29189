package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/etcdlock/etcdlock/internal/streams"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Shards: n shards of work spread over the replicas alive, each run by
// one replica at a time (RunShards), on the queues the other primitives
// use: the replicas' membership is a read lock's key that every replica
// puts on its lease, and each shard is a Mutex.

// MaxShards is the most shards RunShards spreads.
const MaxShards = 4096

// A Shard is a shard of work this replica owns, given to RunShards's fn.
type Shard struct {
	// Num is the shard's number, from 0 to n-1.
	Num int
	// Token is the fencing token of this replica's hold of the shard:
	// greater than the token of every replica that owned it before.
	Token int64
	m     *Mutex
}

// IsOwner returns a comparison that holds while this replica owns the
// shard, for a Txn that must write only then (see Mutex.IsOwner).
func (sh Shard) IsOwner() clientv3.Cmp { return sh.m.IsOwner() }

// Key returns the key of this replica's hold of the shard.
func (sh Shard) Key() string { return sh.m.Key() }

// A ShardOption configures RunShards. An invalid value makes RunShards
// return an error wrapping ErrInvalidOption.
type ShardOption func(*shardOptions) error

type shardOptions struct {
	mutex    []MutexOption
	identity string
}

// WithShardMutexOptions sets the options of each shard's Mutex: a lock
// delay (WithLockDelay) keeps a shard whose owner crashed free for that
// long after its session ends, as for any Mutex. Default: none.
func WithShardMutexOptions(opts ...MutexOption) ShardOption {
	return func(o *shardOptions) error {
		o.mutex = append(o.mutex, opts...)
		return nil
	}
}

// WithShardIdentity records who this replica is in its membership key and
// in the key of each shard it owns (see WithIdentity). Default: none.
func WithShardIdentity(identity string) ShardOption {
	return func(o *shardOptions) error {
		if len(identity) > MaxIdentityLen {
			return errorf("%w: identity is %d bytes, longer than %d", ErrInvalidOption, len(identity), MaxIdentityLen)
		}
		o.identity = identity
		return nil
	}
}

// RunShards spreads n shards of work, numbered 0 to n-1, over the
// replicas that run RunShards on name, and calls fn(ctx, shard) on this
// replica for each shard it owns, until ctx ends. Every replica must pass
// the same n.
//
// The promises:
//   - Never two at once. Each shard is a Mutex (name/<shard>): fn starts
//     on a replica only once the shard's previous owner released it,
//     after its fn returned, or once that owner's session ended (a crash:
//     its lease's TTL, and a lock delay if WithShardMutexOptions set one).
//     A fn that ignores its ctx keeps its shard: it is never run twice.
//     Each owner's token is greater than the last one's, so a fenced
//     write (FencedWrite, etcdlocksql) of an earlier owner is refused.
//   - Balanced. The replicas are the keys of name/members: each
//     RunShards puts one there, a read lock's, bound to its session's
//     lease. With m of them, once everyone has read the same membership,
//     each owns ⌊n/m⌋ or ⌈n/m⌉ shards (weighted by SetShardWeight), and
//     every shard has an owner.
//   - Little movement. Each shard goes to the replica that ranks
//     highest for it (rendezvous hashing) among those with room, so a
//     replica that joins or leaves moves about n/m shards, not all.
//
// A shard that moves is handed over: its owner's fn's ctx is cancelled,
// the shard is released once fn returned, and the next owner, waiting in
// the shard's queue, starts. When ctx ends, this replica leaves the
// membership first, so that the others queue for its shards, then ends
// every fn's ctx likewise. fn's ctx also ends when the shard is lost
// (its key deleted, the session ended), with context.Cause matching
// ErrLockLost. A fn that returns nil while it still owns the shard is
// called again after a pause: 50 ms, doubling up to 1 s while it keeps
// returning at once, and 50 ms again after a call that lasted a second
// or more. A fn that returns an error ends RunShards,
// which then releases every shard and returns that error.
//
// RunShards returns when ctx ends (nil), when fn fails, or when the
// session ends (its error), once it left the membership (unless the
// session had ended: its key goes with the lease), every shard it ran is
// released and every fn returned. A delete of its membership key that
// etcd did not confirm is sent again in the background until it is, or
// the session ends. A replica that restarts within its TTL on its old
// lease (WithLease) stays a member throughout and runs its shards again at
// once, each as a new hold with a larger token: none moves meanwhile.
// It needs no clock agreement between replicas. Run one RunShards per
// Session and name.
func RunShards(ctx context.Context, s *Session, name string, n int, fn func(ctx context.Context, sh Shard) error, opts ...ShardOption) error {
	var o shardOptions
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return err
		}
	}
	switch {
	case s == nil:
		return errorf("%w: no Session", ErrSessionExpired)
	case fn == nil:
		return errorf("%w: RunShards needs a fn", ErrInvalidOption)
	case n < 1 || n > MaxShards:
		return errorf("%w: %d shards: RunShards spreads 1 to %d", ErrInvalidOption, n, MaxShards)
	}
	if err := CheckMutexOptions(o.mutex...); err != nil {
		return err // before it joins, not at each shard's Lock
	}
	for _, nm := range []string{name, shardName(name, n-1), name + "/members"} {
		if err := checkName(nm); err != nil {
			return err
		}
	}
	if o.identity != "" {
		o.mutex = append(o.mutex[:len(o.mutex):len(o.mutex)], WithIdentity(o.identity))
	}
	r := &shardRunner{s: s, name: name, n: n, fn: fn, opts: o.mutex, runs: map[int]*shardRun{}, ended: make(chan *shardRun)}
	// The runs outlive ctx by the moment it takes to leave (below):
	// stopAll ends them.
	r.base = context.WithoutCancel(ctx)
	r.me = fmt.Sprintf("%x", int64(s.Lease()))
	r.member = KeyMode{Shared: true}.value()
	if o.identity != "" {
		r.member += "\n" + o.identity
	}
	// Every read and wait of the membership ends with the session too:
	// a link that dies mid-read must not keep RunShards past its end.
	r.ctx = ctx
	lctx, stop := s.bound(ctx)
	err := r.join(lctx)
	if err == nil {
		err = r.loop(lctx)
	}
	stop()
	r.leave(ctx)
	r.stopAll()
	return err
}

// shardName returns the lock name of shard i of name.
func shardName(name string, i int) string { return name + "/" + strconv.Itoa(i) }

// A shardRunner is one RunShards: the shards this replica runs or waits
// for, and what it read of the membership.
type shardRunner struct {
	s         *Session
	name      string
	n         int
	fn        func(context.Context, Shard) error
	opts      []MutexOption
	runs      map[int]*shardRun // by shard: waiting for it, running it, or releasing it
	ended     chan *shardRun    // a run's goroutine has returned
	ctx       context.Context   // RunShards's: its end is the caller's doing
	base      context.Context   // the runs' context: ctx's values, not its end
	mine      []bool            // the shards this replica owns, as the membership last read says
	err       error             // the first fn error
	me        string            // this replica's member ID: its lease in hex
	memberRev int64             // the create revision of its membership key, once read
	member    string            // the value of its membership key: a read lock's
}

// memberKey is this replica's membership key, name/members/<lease>.
func (r *shardRunner) memberKey() string { return membersPrefix(r.name) + r.me }

// join puts this replica's membership key, bound to its session's lease:
// a read lock's key on name/members, as RWMutex.RLock would put it. A Put
// keeps a key that exists: a replica that restarts on its old lease
// (WithLease) is a member throughout, so no shard moves meanwhile.
//
// The Put waits for etcd's answer even once ctx ended (only the session's
// end cuts it short), so that leave knows whether there is a key to take
// away; ctx ends the pauses between attempts.
func (r *shardRunner) join(ctx context.Context) error {
	backoff := minBackoff
	for {
		if ctx.Err() != nil {
			return r.end(ctx.Err())
		}
		pctx, stop := r.s.bound(context.WithoutCancel(ctx))
		resp, err := r.s.Client().Put(pctx, r.memberKey(), r.member, clientv3.WithLease(r.s.Lease()), clientv3.WithPrevKV())
		stop()
		if refused(err) {
			return shardsRefusedErr(r.name, err)
		}
		if err == nil {
			// The key's create revision: the Put's, or the key's it kept.
			r.memberRev = resp.Header.Revision
			if resp.PrevKv != nil {
				r.memberRev = resp.PrevKv.CreateRevision
			}
		}
		if err == nil || !transient(err) || !pause(ctx, &backoff) {
			return r.end(err)
		}
	}
}

// leave deletes this replica's membership key, before its shards are
// released, so that the others queue for them at once. A delete that
// etcd does not confirm goes on in the session's releaser until it is,
// or the session ends: a key left behind would keep its share of the
// shards without an owner for as long as the session lives. The delete
// holds only while the key is the one this RunShards put or found (its
// create revision), so a later RunShards's key on the session is never
// taken.
// A session that ended (Orphan, its lease's end) leaves the key to the
// lease, or to a successor that adopts the lease (WithLease).
func (r *shardRunner) leave(ctx context.Context) {
	if r.s.Err() != nil {
		return
	}
	key, rev := r.memberKey(), r.memberRev
	del := func(ctx context.Context) bool {
		actx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		defer cancel()
		if rev == 0 {
			// A join whose outcome is unknown (it failed): is there a key?
			resp, err := r.s.Client().Get(actx, key)
			if err != nil {
				return !transient(err) || r.s.Err() != nil
			}
			if len(resp.Kvs) == 0 {
				return true
			}
			rev = resp.Kvs[0].CreateRevision
		}
		_, err := r.s.Client().Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", rev)).
			Then(clientv3.OpDelete(key)).Commit()
		return err == nil || !transient(err) || r.s.Err() != nil
	}
	if !del(context.WithoutCancel(ctx)) {
		r.s.releaser.add(func() bool { return del(r.s.endCtx) })
	}
}

// A shardRun is one goroutine that takes a shard, runs fn on it and
// releases it (Mutex.Do).
type shardRun struct {
	num     int
	cancel  context.CancelFunc // the shard moved: stop waiting, or stop fn
	stopped bool               // cancel was called
	err     error              // fn's error, once ended
}

// loop follows the membership and starts and stops runs to match it,
// until ctx ends, the session ends or a fn fails.
func (r *shardRunner) loop(ctx context.Context) error {
	cli := r.s.Client()
	backoff := minBackoff
	for {
		ms, rev, err := readMembers(ctx, cli, r.name, 0)
		if refused(err) {
			return shardsRefusedErr(r.name, err)
		}
		if err != nil {
			if !transient(err) || !pause(ctx, &backoff) {
				return r.end(err)
			}
			continue
		}
		backoff = minBackoff
		i := slices.IndexFunc(ms, func(m member) bool { return m.id == r.me })
		if i < 0 {
			// Its key was deleted (an operator, etcdlock break): join
			// again, or end with the session.
			if err := r.join(ctx); err != nil {
				return err
			}
			continue
		}
		r.memberRev = ms[i].rev
		r.reconcile(ctx, assign(r.n, ms, r.me))
		// A member that joins (its Put) or leaves, or a weight set: read
		// the membership again. So does a watch that ended.
		wctx, cancel := context.WithCancel(streams.RequireLeader(ctx))
		wch := cli.Watch(wctx, membersPrefix(r.name), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		changed := false
		for !changed {
			select {
			case <-ctx.Done():
				cancel()
				return r.end(nil)
			case <-r.s.Done():
				cancel()
				return r.end(r.s.Err())
			case run := <-r.ended:
				r.runEnded(ctx, run)
				if r.err != nil {
					cancel()
					return r.err
				}
			case wr, ok := <-wch:
				changed = !ok || wr.Err() != nil || len(wr.Events) > 0 || wr.Canceled
			}
		}
		cancel()
	}
}

// end returns why RunShards ends: nil when its caller's ctx ended, else
// the session's end if it has, else err.
func (r *shardRunner) end(err error) error {
	switch {
	case r.ctx.Err() != nil:
		return nil
	case r.s.Err() != nil:
		return r.s.Err()
	}
	return err
}

// reconcile starts a run for each shard of mine that has none, and stops
// each run of a shard not mine. A shard whose run is stopping is started
// again once it ended (runEnded).
func (r *shardRunner) reconcile(ctx context.Context, mine []bool) {
	for i, want := range mine {
		run := r.runs[i]
		switch {
		case want && run == nil:
			r.start(i)
		case !want && run != nil && !run.stopped:
			run.stopped = true
			run.cancel()
		}
	}
	r.mine = mine
}

// start starts the run of shard i.
func (r *shardRunner) start(i int) {
	rctx, cancel := context.WithCancel(r.base)
	run := &shardRun{num: i, cancel: cancel}
	r.runs[i] = run
	m := new(Mutex)
	m.init(r.s, shardName(r.name, i), KindShard, r.opts)
	go func() {
		defer cancel()
		run.err = m.Do(rctx, func(fctx context.Context) error {
			sh := Shard{Num: i, Token: m.Token(), m: m}
			backoff := minBackoff
			for {
				began := monotime()
				if err := r.fn(fctx, sh); err != nil || fctx.Err() != nil {
					return err
				}
				if monotime()-began >= maxBackoff {
					backoff = minBackoff // it ran a while: not a loop
				}
				if !pauseUpTo(fctx, &backoff, maxBackoff) {
					return nil
				}
			}
		})
		r.ended <- run
	}()
}

// runEnded takes in a run that returned: a fn's error ends RunShards; a
// shard that is still mine is started again.
func (r *shardRunner) runEnded(ctx context.Context, run *shardRun) {
	delete(r.runs, run.num)
	err := run.err
	if run.stopped || ctx.Err() != nil || errors.Is(err, ErrLockLost) || errors.Is(err, context.Canceled) {
		err = nil
	}
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("etcdlock: shard %d: %w", run.num, err)
	}
	if r.err == nil && ctx.Err() == nil && r.mine != nil && r.mine[run.num] {
		r.start(run.num)
	}
}

// stopAll stops every run and waits until each has ended.
func (r *shardRunner) stopAll() {
	for _, run := range r.runs {
		run.stopped = true
		run.cancel()
	}
	for len(r.runs) > 0 {
		run := <-r.ended
		delete(r.runs, run.num)
	}
}
