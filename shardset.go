package etcdlock

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A shard set's data: its members and their weights as RunShards reads
// them, the assignment every replica computes from them, the weight
// records (SetShardWeight), and InspectShards.

// FullShardWeight is a member's weight unless SetShardWeight set another:
// a full share of the shards.
const FullShardWeight = 100

// membersPrefix returns the prefix of the keys of shard set name's
// members: name/members/<lease ID in hex>, a read lock's key on
// name/members, and beside it a member's weight record, when it has one,
// name/members/<lease ID in hex>/weight. Both lie under name/, so a role
// that may use the set's shards may use these too, and one range and one
// watch cover both.
func membersPrefix(name string) string { return name + "/members/" }

// weightSuffix ends the key of a member's weight record.
const weightSuffix = "/weight"

// parseWeight reads a weight record's value: a decimal from 0 to
// FullShardWeight, as SetShardWeight writes it.
func parseWeight(v []byte) (int, bool) {
	w, err := strconv.Atoi(string(v))
	return w, err == nil && w >= 0 && w <= FullShardWeight && strconv.Itoa(w) == string(v)
}

// SetShardWeight sets the weight of member (a replica's lease, its
// Session's Lease) in the shard set name, from 0 to FullShardWeight: the
// member's share of the shards is its weight over the sum of the
// members' weights. 0 drains it: its shards are handed over to the
// others (gracefully: each fn's ctx is cancelled, as for any move), and
// it keeps running none until its weight rises again. FullShardWeight,
// every member's weight unless set, gives it its share back. When every
// member's weight is 0 they count as equal: a set keeps running when all
// its members drain.
//
// A replica may set its own weight (s.Lease() of the Session it gave
// RunShards), and so may an operator who knows the member's lease
// (InspectShards, `etcdlock shards status`). The weight is kept in a
// record bound to the member's lease, name/members/<lease>/weight, so it
// goes with the member, and a successor that adopts the lease
// (WithLease) keeps it. It returns an error matching ErrNotInQueue when
// member is not in the set, and ErrInvalidOption for a weight out of
// range.
func SetShardWeight(ctx context.Context, cli *clientv3.Client, name string, member clientv3.LeaseID, weight int) error {
	if weight < 0 || weight > FullShardWeight {
		return errorf("%w: shard weight %d: it is from 0 to %d", ErrInvalidOption, weight, FullShardWeight)
	}
	if err := checkName(name); err != nil {
		return err
	}
	id := fmt.Sprintf("%x", int64(member))
	mkey := membersPrefix(name) + id
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(mkey), "=", member)).
		Then(clientv3.OpPut(mkey+weightSuffix, strconv.Itoa(weight), clientv3.WithLease(member))).
		Commit()
	if refused(err) {
		return shardsRefusedErr(name, err)
	}
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return errorf("%w: %s is not a member of the shard set %q", ErrNotInQueue, id, name)
	}
	return nil
}

// ShardSet is a shard set at one etcd revision, as InspectShards reads it.
type ShardSet struct {
	Name     string
	Revision int64 // the etcd revision at which everything was read
	// Members are the replicas in the set, by ID.
	Members []ShardMember
	// Shards are the n shards, by number.
	Shards []ShardState
}

// A ShardMember is one replica of a shard set.
type ShardMember struct {
	ID       string           // its lease in hex, the last part of its keys
	Lease    clientv3.LeaseID // its Session's lease
	Identity string           // WithShardIdentity's, or ""
	Weight   int              // FullShardWeight unless SetShardWeight set another
	Owns     int              // how many shards it holds
	Assigned int              // how many shards the assignment gives it
}

// A ShardState is one shard of a shard set.
type ShardState struct {
	Num int
	// Owner is the ID of the member that holds the shard ("" for none:
	// nobody has taken it yet, or a lock delay keeps it free), Token its
	// hold's token, and Identity what WithShardIdentity recorded.
	Owner    string
	Token    int64
	Identity string
	// Assigned is the member the assignment gives the shard to, as every
	// replica computes it from the members read: when it is not Owner,
	// the shard is moving there (or Owner is not yet done).
	Assigned string
	// Waiting is how many keys wait in the shard's queue.
	Waiting int
}

// Moving reports whether the shard is not yet where the assignment puts
// it: another member holds it, or nobody does while the assignment gives
// it to one. A shard of a set without members is free, not moving.
func (s ShardState) Moving() bool { return s.Owner != s.Assigned }

// InspectShards reads the shard set name of n shards through cli: its
// members with their weights, and each shard's owner, where the
// assignment puts it, and how many wait for it. It needs no Session and
// writes nothing. The shards are read as ListLocks reads locks (a lock
// delay pending keeps a shard without owner), the members and weights at
// the same revision. It returns etcd's error if a read fails.
func InspectShards(ctx context.Context, cli *clientv3.Client, name string, n int) (*ShardSet, error) {
	if n < 1 || n > MaxShards {
		return nil, errorf("%w: %d shards: a shard set has 1 to %d", ErrInvalidOption, n, MaxShards)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	l, err := ListLocks(ctx, cli, name+"/")
	if err != nil {
		return nil, err
	}
	ms, _, err := readMembers(ctx, cli, name, l.Revision)
	if refused(err) {
		return nil, readRefusedErr("a shard set's members", membersPrefix(name), err)
	}
	if err != nil {
		return nil, err
	}
	set := &ShardSet{Name: name, Revision: l.Revision, Shards: make([]ShardState, n)}
	byID := map[string]*ShardMember{}
	set.Members = make([]ShardMember, len(ms))
	for j, mb := range ms {
		lease, _ := strconv.ParseInt(mb.id, 16, 64)
		set.Members[j] = ShardMember{ID: mb.id, Lease: clientv3.LeaseID(lease), Weight: mb.weight}
		byID[mb.id] = &set.Members[j]
	}
	for i := range set.Shards {
		set.Shards[i].Num = i
	}
	for i, j := range assignAll(n, ms) {
		if j >= 0 {
			set.Shards[i].Assigned = ms[j].id
			set.Members[j].Assigned++
		}
	}
	set.read(l.Locks, byID)
	return set, nil
}

// read fills in the members' identities and the shards' owners and
// waiters from the set's locks, as ListLocks read them.
func (set *ShardSet) read(locks []LockSummary, byID map[string]*ShardMember) {
	n := len(set.Shards)
	for _, lk := range locks {
		rest := strings.TrimPrefix(lk.Name, set.Name+"/")
		if rest == "members" {
			for _, k := range lk.Holders {
				if m := byID[keyID(k.Key)]; m != nil {
					m.Identity = k.Identity
				}
			}
			continue
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || i >= n || strconv.Itoa(i) != rest {
			continue // a lock of no shard
		}
		sh := &set.Shards[i]
		sh.Waiting = lk.Waiters
		if len(lk.Holders) > 0 {
			h := lk.Holders[0]
			sh.Owner, sh.Token, sh.Identity = keyID(h.Key), h.Token, h.Identity
			if m := byID[sh.Owner]; m != nil {
				m.Owns++
			}
		}
	}
}

// keyID returns the last part of a lock's key: its lease in hex.
func keyID(key string) string { return key[strings.LastIndexByte(key, '/')+1:] }

// A member is a replica in the membership: its ID (its lease in hex, the
// last part of its key under name/members/) and its weight.
type member struct {
	id     string
	weight int
	rev    int64 // its key's create revision
}

// readMembers reads the members of shard set name and their weights, in
// one range, at revision rev (0: the latest), and returns them sorted by
// ID, with the revision read.
func readMembers(ctx context.Context, cli *clientv3.Client, name string, rev int64) ([]member, int64, error) {
	pfx := membersPrefix(name)
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev != 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := cli.Get(ctx, pfx, opts...)
	if err != nil {
		return nil, 0, err
	}
	weights := map[string]int{}
	var ms []member
	for _, kv := range resp.Kvs {
		key := strings.TrimPrefix(string(kv.Key), pfx)
		if id, ok := strings.CutSuffix(key, weightSuffix); ok && id != "" && !strings.Contains(id, "/") {
			if w, ok := parseWeight(kv.Value); ok {
				weights[id] = w
			}
		} else if key != "" && !strings.Contains(key, "/") {
			ms = append(ms, member{id: key, weight: FullShardWeight, rev: kv.CreateRevision})
		}
	}
	for i := range ms {
		if w, ok := weights[ms[i].id]; ok {
			ms[i].weight = w
		}
	}
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.id, b.id) })
	return ms, resp.Header.Revision, nil
}

// assign returns which of n shards member me owns among members (sorted
// by ID, distinct): each shard, in order, goes to the member ranked
// highest for it (rendezvous hashing) that has room. A member's room is
// its share of n by weight, rounded down, and one more for as many
// members as the rounding left shards over, among those it rounded down:
// with equal weights, ⌊n/m⌋ each and n mod m of them one more. When every
// weight is 0 they count as equal (a set whose every member drains keeps
// running). Every replica that read the same members computes the same
// assignment.
func assign(n int, members []member, me string) []bool {
	mine := make([]bool, n)
	for i, j := range assignAll(n, members) {
		mine[i] = j >= 0 && members[j].id == me
	}
	return mine
}

// assignAll returns, for each of n shards, the index in members of the
// member assign gives it (-1 when there are no members).
func assignAll(n int, members []member) []int {
	owner := make([]int, n)
	m := len(members)
	if m == 0 {
		for i := range owner {
			owner[i] = -1
		}
		return owner
	}
	total := 0
	for _, mb := range members {
		total += mb.weight
	}
	equal := total == 0
	if equal {
		total = m
	}
	weight := func(j int) int {
		if equal {
			return 1
		}
		return members[j].weight
	}
	quota, round := make([]int, m), make([]bool, m)
	extra := n
	for j := range members {
		quota[j] = n * weight(j) / total
		round[j] = n*weight(j)%total != 0
		extra -= quota[j]
	}
	count := make([]int, m)
	order := make([]int, m)
	score := make([]uint64, m)
	for i := range n {
		for j, mb := range members {
			order[j], score[j] = j, rank(mb.id, i)
		}
		slices.SortFunc(order, func(a, b int) int {
			switch {
			case score[a] > score[b]:
				return -1
			case score[a] < score[b]:
				return 1
			}
			return strings.Compare(members[a].id, members[b].id)
		})
		for _, j := range order {
			if count[j] < quota[j] || (count[j] == quota[j] && round[j] && extra > 0) {
				if count[j] == quota[j] {
					extra--
				}
				count[j]++
				owner[i] = j
				break
			}
		}
	}
	return owner
}

// rank is member's rendezvous score for shard i.
func rank(member string, i int) uint64 {
	h := fnv.New64a()
	h.Write([]byte(member))
	h.Write([]byte{'/'})
	h.Write([]byte(strconv.Itoa(i)))
	return mix(h.Sum64())
}

// mix spreads the bits of x (FNV's low bits are weak for short inputs).
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
