package streams

import (
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestKeeperMatchesOldestSend: an answer for a lease goes to the oldest
// unanswered request for that lease on the stream, with that request's
// send time, since etcd answers a stream's requests in order. Were it
// matched to a later request, a late answer would extend the session's
// deadline past the one etcd keeps.
func TestKeeperMatchesOldestSend(t *testing.T) {
	ks := &keptStream{pending: make(map[clientv3.LeaseID][]*renewal)}
	t0 := time.Now()
	mk := func(id clientv3.LeaseID, sent time.Time) *renewal {
		r := &renewal{id: id, sent: sent}
		ks.pending[id] = append(ks.pending[id], r)
		return r
	}
	a1, b1, a2 := mk(1, t0), mk(2, t0.Add(time.Second)), mk(1, t0.Add(2*time.Second))

	if r := ks.answer(&pb.LeaseKeepAliveResponse{ID: 3, TTL: 5}); r != nil { // no request of ours: ignored
		t.Fatalf("an answer for a lease not asked for went to the renewal of lease %d", r.id)
	}
	for _, c := range []struct {
		id clientv3.LeaseID
		r  *renewal
	}{{1, a1}, {2, b1}, {1, a2}} {
		if r := ks.answer(&pb.LeaseKeepAliveResponse{ID: int64(c.id), TTL: 5}); r != c.r {
			t.Errorf("answer for lease %d went to the request sent at +%v, want the one sent at +%v", c.id, r.sent.Sub(t0), c.r.sent.Sub(t0))
		}
	}
	if len(ks.pending) != 0 {
		t.Errorf("pending left: %v", ks.pending)
	}
}

// TestKeeperStuck: the Keeper takes its stream for stuck when a request
// has waited for its patience and the stream has delivered nothing for as
// long, and not before: an answer to another request shows the stream is
// alive, however late the one waited for is. Until then it looks again
// when the next request is due.
func TestKeeperStuck(t *testing.T) {
	t0 := time.Now()
	send := func(ks *keptStream, id clientv3.LeaseID, sent time.Time, patience time.Duration) {
		ks.pending[id] = append(ks.pending[id], &renewal{id: id, sent: sent, patience: patience})
	}
	for _, c := range []struct {
		name   string
		sends  func(ks *keptStream)
		heard  time.Duration // after t0; 0: nothing heard
		now    time.Duration // after t0
		stuck  bool
		nextAt time.Duration // after t0, when not stuck; 0: nothing pending
	}{
		{name: "NothingPending", now: time.Hour},
		{name: "Waiting", sends: func(ks *keptStream) { send(ks, 1, t0, time.Second) }, now: 999 * time.Millisecond, nextAt: time.Second},
		{name: "Due", sends: func(ks *keptStream) { send(ks, 1, t0, time.Second) }, now: time.Second, stuck: true},
		{name: "HeardBeforeSent", sends: func(ks *keptStream) { send(ks, 1, t0, time.Second) }, heard: -time.Second, now: time.Second, stuck: true},
		{name: "HeardSince", sends: func(ks *keptStream) { send(ks, 1, t0, time.Second) }, heard: 500 * time.Millisecond, now: time.Second, nextAt: 1500 * time.Millisecond},
		{name: "HeardLongAgo", sends: func(ks *keptStream) { send(ks, 1, t0, time.Second) }, heard: 500 * time.Millisecond, now: 1500 * time.Millisecond, stuck: true},
		{
			name: "ShortPatienceSentLater",
			sends: func(ks *keptStream) {
				send(ks, 1, t0, 10*time.Second)
				send(ks, 2, t0.Add(time.Second), time.Second)
			},
			now:    1500 * time.Millisecond,
			nextAt: 2 * time.Second,
		},
		{
			name: "ShortPatienceDue",
			sends: func(ks *keptStream) {
				send(ks, 1, t0, 10*time.Second)
				send(ks, 2, t0.Add(time.Second), time.Second)
			},
			now:   2 * time.Second,
			stuck: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			ks := &keptStream{pending: make(map[clientv3.LeaseID][]*renewal)}
			if c.sends != nil {
				c.sends(ks)
			}
			if c.heard != 0 {
				ks.heard = t0.Add(c.heard)
			}
			stuck, next := ks.stuck(t0.Add(c.now))
			if stuck != c.stuck {
				t.Fatalf("stuck = %v, want %v", stuck, c.stuck)
			}
			if c.stuck {
				return
			}
			var want time.Time
			if c.nextAt != 0 {
				want = t0.Add(c.nextAt)
			}
			if !next.Equal(want) {
				t.Errorf("next check at %v, want %v", next.Sub(t0), c.nextAt)
			}
		})
	}
}
