package etcdlock

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
	k := &keeper{pending: make(map[clientv3.LeaseID][]*renewal)}
	t0 := time.Now()
	mk := func(id clientv3.LeaseID, sent time.Time) *renewal {
		r := &renewal{id: id, sent: sent, res: make(chan renewed, 1)}
		k.pending[id] = append(k.pending[id], r)
		return r
	}
	a1, b1, a2 := mk(1, t0), mk(2, t0.Add(time.Second)), mk(1, t0.Add(2*time.Second))

	k.answer(&pb.LeaseKeepAliveResponse{ID: 3, TTL: 5}) // no request of ours: ignored
	k.answer(&pb.LeaseKeepAliveResponse{ID: 1, TTL: 5})
	k.answer(&pb.LeaseKeepAliveResponse{ID: 2, TTL: 0})
	for _, c := range []struct {
		r    *renewal
		sent time.Time
		ttl  int64
	}{{a1, t0, 5}, {b1, t0.Add(time.Second), 0}} {
		select {
		case res := <-c.r.res:
			if !res.sent.Equal(c.sent) || res.ttl != c.ttl || res.err != nil {
				t.Errorf("lease %d: got sent %v ttl %d err %v, want sent %v ttl %d", c.r.id, res.sent.Sub(t0), res.ttl, res.err, c.sent.Sub(t0), c.ttl)
			}
		default:
			t.Errorf("lease %d sent at +%v: no answer", c.r.id, c.sent.Sub(t0))
		}
	}
	select {
	case res := <-a2.res:
		t.Fatalf("the second request for lease 1 was answered by the first's answer: %+v", res)
	default:
	}
	k.answer(&pb.LeaseKeepAliveResponse{ID: 1, TTL: 4})
	if res := <-a2.res; !res.sent.Equal(t0.Add(2*time.Second)) || res.ttl != 4 {
		t.Errorf("second request for lease 1: got %+v", res)
	}
	if len(k.pending) != 0 {
		t.Errorf("pending left: %v", k.pending)
	}
}

// TestKeeperStuck: the keeper takes its stream for stuck when a request
// has waited for its patience and the stream has delivered nothing for as
// long, and not before: an answer to another request shows the stream is
// alive, however late the one waited for is. Until then it looks again
// when the next request is due.
func TestKeeperStuck(t *testing.T) {
	t0 := time.Now()
	newKeeper := func() *keeper {
		k := &keeper{pending: make(map[clientv3.LeaseID][]*renewal), check: time.NewTimer(time.Hour), sending: true}
		t.Cleanup(func() { k.check.Stop() })
		return k
	}
	send := func(k *keeper, id clientv3.LeaseID, sent time.Time, patience time.Duration) {
		k.pending[id] = append(k.pending[id], &renewal{id: id, sent: sent, patience: patience})
	}
	for _, c := range []struct {
		name   string
		sends  func(k *keeper)
		heard  time.Duration // after t0; 0: nothing heard
		now    time.Duration // after t0
		stuck  bool
		nextAt time.Duration // after t0, when not stuck; 0: nothing pending
	}{
		{name: "NothingPending", now: time.Hour},
		{name: "Waiting", sends: func(k *keeper) { send(k, 1, t0, time.Second) }, now: 999 * time.Millisecond, nextAt: time.Second},
		{name: "Due", sends: func(k *keeper) { send(k, 1, t0, time.Second) }, now: time.Second, stuck: true},
		{name: "HeardBeforeSent", sends: func(k *keeper) { send(k, 1, t0, time.Second) }, heard: -time.Second, now: time.Second, stuck: true},
		{name: "HeardSince", sends: func(k *keeper) { send(k, 1, t0, time.Second) }, heard: 500 * time.Millisecond, now: time.Second, nextAt: 1500 * time.Millisecond},
		{name: "HeardLongAgo", sends: func(k *keeper) { send(k, 1, t0, time.Second) }, heard: 500 * time.Millisecond, now: 1500 * time.Millisecond, stuck: true},
		{
			name: "ShortPatienceSentLater",
			sends: func(k *keeper) {
				send(k, 1, t0, 10*time.Second)
				send(k, 2, t0.Add(time.Second), time.Second)
			},
			now:    1500 * time.Millisecond,
			nextAt: 2 * time.Second,
		},
		{
			name: "ShortPatienceDue",
			sends: func(k *keeper) {
				send(k, 1, t0, 10*time.Second)
				send(k, 2, t0.Add(time.Second), time.Second)
			},
			now:   2 * time.Second,
			stuck: true,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newKeeper()
			if c.sends != nil {
				c.sends(k)
			}
			if c.heard != 0 {
				k.heard = t0.Add(c.heard)
			}
			if got := k.stuck(t0.Add(c.now)); got != c.stuck {
				t.Fatalf("stuck = %v, want %v", got, c.stuck)
			}
			if c.stuck {
				if k.sending {
					t.Error("the sender may still send on a stuck stream")
				}
				return
			}
			var want time.Time
			if c.nextAt != 0 {
				want = t0.Add(c.nextAt)
			}
			if !k.checkAt.Equal(want) {
				t.Errorf("next check at %v, want %v", k.checkAt.Sub(t0), c.nextAt)
			}
		})
	}
}
