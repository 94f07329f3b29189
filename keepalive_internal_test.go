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
