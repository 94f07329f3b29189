package etcdlock

// admitWeighted is the rule of a Semaphore's permits: they hold when the
// weights ahead plus their own fit the smallest capacity among themselves
// and every entry ahead (so whenever a client holds, the total held is at
// most its own capacity, whatever capacity the others were configured
// with). The blockers are the nearest entries ahead that, with me, already
// exceed it: "the window". While each of them exists I am out, whatever
// else leaves (the window's own excess stays), so a waiter watches only
// its window. A key that is not a permit (weight infinite) excludes me
// alone.
func admitWeighted(me entry, ahead []entry) []entry {
	limit := me.mode.Capacity
	var sum int64 // weights of ahead[:i]; never above limit-me.mode.Weight
	for i, e := range ahead {
		if e.mode.Weight == 0 {
			return ahead[i : i+1]
		}
		limit = min(limit, e.mode.Capacity)
		// Written as a difference: weights up to MaxInt64 cannot overflow.
		if limit < me.mode.Weight || e.mode.Weight > limit-me.mode.Weight-sum {
			return ahead[:i+1]
		}
		sum += e.mode.Weight
	}
	return nil
}
