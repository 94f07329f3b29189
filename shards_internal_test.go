package etcdlock

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// owners returns, for each of n shards, the member assign gives it.
func owners(t *testing.T, n int, members []string) []string {
	t.Helper()
	ms := make([]member, len(members))
	for i, id := range members {
		ms[i] = member{id: id, weight: FullShardWeight}
	}
	return weighted(t, n, ms)
}

// weighted returns, for each of n shards, the member assign gives it.
func weighted(t *testing.T, n int, ms []member) []string {
	t.Helper()
	own := make([]string, n)
	for _, mb := range ms {
		m := mb.id
		for i, mine := range assign(n, ms, m) {
			if mine {
				if own[i] != "" {
					t.Fatalf("shard %d assigned to %s and %s", i, own[i], m)
				}
				own[i] = m
			}
		}
	}
	return own
}

// TestAssignBalancedAndStable: every shard has exactly one owner, each
// member owns ⌊n/m⌋ or ⌈n/m⌉, and a member that joins or leaves moves few
// shards: reported against the least that must move (a joiner's share;
// a leaver's own), over random memberships.
func TestAssignBalancedAndStable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	id := func() string { return fmt.Sprintf("%016x", rng.Uint64()) }
	for _, n := range []int{1, 7, 64, 1000} {
		var moved, least, worst float64
		worst = 1
		for trial := 0; trial < 50; trial++ {
			m := 1 + rng.IntN(8)
			members := make([]string, m)
			for i := range members {
				members[i] = id()
			}
			sortStrings(members)
			before := owners(t, n, members)
			checkBalanced(t, n, members, before)

			joined := append(append([]string(nil), members...), id())
			sortStrings(joined)
			after := owners(t, n, joined)
			checkBalanced(t, n, joined, after)
			mv := diff(before, after)
			need := n / len(joined) // the joiner's share, at least
			moved, least = moved+float64(mv), least+float64(need)
			if need > 0 && float64(mv)/float64(need) > worst {
				worst = float64(mv) / float64(need)
			}

			gone := joined[rng.IntN(len(joined))]
			left := slicesDelete(joined, gone)
			if len(left) == 0 {
				continue
			}
			again := owners(t, n, left)
			checkBalanced(t, n, left, again)
			mv, need = diff(after, again), count(after, gone)
			moved, least = moved+float64(mv), least+float64(need)
			if need > 0 && float64(mv)/float64(need) > worst {
				worst = float64(mv) / float64(need)
			}
		}
		t.Logf("n=%d: shards moved %.0f, at least %.0f (%.2fx); worst change %.2fx its least", n, moved, least, moved/max(least, 1), worst)
		if n >= 64 && moved > 1.5*least {
			t.Errorf("n=%d: %.0f shards moved where %.0f had to", n, moved, least)
		}
	}
}

// TestAssignWeights: a member's share follows its weight (drained: none;
// half: about half a full one's), every shard keeps one owner, a drain
// moves only the drained member's shards, and a set whose members all
// drained runs as if none had.
func TestAssignWeights(t *testing.T) {
	ids := []string{"1a", "2b", "3c", "4d"}
	full := func() []member {
		ms := make([]member, len(ids))
		for i, id := range ids {
			ms[i] = member{id: id, weight: FullShardWeight}
		}
		return ms
	}
	const n = 64
	before := weighted(t, n, full())
	for _, c := range []struct {
		weights []int
		want    []int // shards each member owns
	}{
		{[]int{100, 100, 100, 0}, []int{21, 21, 21, 0}}, // 64/3: one gets 22
		{[]int{100, 100, 50, 50}, []int{21, 21, 11, 11}},
		{[]int{0, 0, 0, 0}, []int{16, 16, 16, 16}},
		{[]int{0, 0, 0, 1}, []int{0, 0, 0, 64}},
	} {
		ms := full()
		for i, w := range c.weights {
			ms[i].weight = w
		}
		own := weighted(t, n, ms)
		got := make([]int, len(ids))
		sum := 0
		for i, id := range ids {
			got[i] = count(own, id)
			sum += got[i]
			if got[i] < c.want[i] || got[i] > c.want[i]+1 {
				t.Errorf("weights %v: %s owns %d shards, want %d or one more", c.weights, id, got[i], c.want[i])
			}
		}
		if sum != n || slices.Contains(own, "") {
			t.Errorf("weights %v: %d of %d shards owned", c.weights, sum, n)
		}
		if slices.Equal(c.weights, []int{100, 100, 100, 0}) {
			// The drained member's shards move, and few others.
			mv, least := diff(before, own), count(before, ids[3])
			t.Logf("a drain: %d shards moved, %d at least", mv, least)
			if float64(mv) > 1.5*float64(least) {
				t.Errorf("a drain moved %d shards where %d had to", mv, least)
			}
		}
	}
}

func checkBalanced(t *testing.T, n int, members, own []string) {
	t.Helper()
	lo, hi := n/len(members), (n+len(members)-1)/len(members)
	for _, m := range members {
		if c := count(own, m); c < lo || c > hi {
			t.Fatalf("%d shards over %d members: %s owns %d", n, len(members), m, c)
		}
	}
	for i, o := range own {
		if o == "" {
			t.Fatalf("shard %d has no owner", i)
		}
	}
}

func diff(a, b []string) int {
	d := 0
	for i := range a {
		if a[i] != b[i] {
			d++
		}
	}
	return d
}

func count(own []string, m string) int {
	c := 0
	for _, o := range own {
		if o == m {
			c++
		}
	}
	return c
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

func slicesDelete(s []string, x string) []string {
	out := make([]string, 0, len(s))
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}
