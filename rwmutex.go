package etcdlock

// admitShared is the rule of an RWMutex's read lock: it holds when every
// key ahead is a read lock. The blocker is the newest other key ahead, "the
// last writer ahead": readers between it and me cannot keep me out, so
// their release must not wake me. When that writer goes, I am admitted or
// the next writer ahead becomes my blocker.
func admitShared(_ entry, ahead []entry) []entry {
	for i, e := range ahead {
		if !e.mode.Shared {
			return ahead[i : i+1]
		}
	}
	return nil
}
