package etcdlock

import (
	"errors"
	"testing"
)

// An Unlock that comes while the owner of a hold's release is finishing
// it (the release has ended; the hold is still the queue's until finishNow)
// must leave the finishing to the owner: finishing twice gives the
// session's name back twice, which lets a second Lock of the session and
// name in while another holds it. Concurrent Unlocks reach that window;
// the test builds it directly.
func TestUnlockWhileOwnerFinishes(t *testing.T) {
	for _, lost := range []error{nil, errorf("%w: gone", ErrLockLost)} {
		s := &Session{names: map[string]nameLock{}}
		q := &queue{s: s, key: "n/", plen: 2}
		// The hold has the name; its release's owner has claimed the
		// finishing and not yet run it.
		s.names["n"] = nameLock{held: true, refs: 1}
		q.h = &hold{state: holdFinished, err: lost}
		for i := range 3 {
			if err := q.unlock(t.Context(), nil, "Unlock"); !errors.Is(err, ErrLockReleased) {
				t.Errorf("lost %v: Unlock %d returned %v, want ErrLockReleased", lost, i, err)
			}
		}
		if !s.names["n"].held {
			t.Errorf("lost %v: the name was given back before the owner finished the hold", lost)
		}
	}
}
