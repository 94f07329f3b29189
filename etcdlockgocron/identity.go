package etcdlockgocron

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Who a replica is: what its locks record (etcdlock status shows it), and
// what a skipped tick says of the replica that holds.

// WithIdentity names this replica: a Locker records it with every lock it
// takes, and an Elector made with an empty value campaigns with it as its
// value. `etcdlock status` and `etcdlock ls` show it, and a tick this
// replica skips says which replica holds the job's lock. Give each
// replica its own (a pod's name, say); at most etcdlock.MaxIdentityLen
// bytes. Default: the host name and the process ID, "HOST:PID".
func WithIdentity(id string) Option {
	return func(o *options) error {
		if len(id) > etcdlock.MaxIdentityLen {
			return fmt.Errorf("etcdlockgocron: %w: identity is %d bytes, longer than %d", etcdlock.ErrInvalidOption, len(id), etcdlock.MaxIdentityLen)
		}
		o.identity, o.identitySet = id, true
		return nil
	}
}

// defaultIdentity is "HOST:PID".
func defaultIdentity() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// record is what a Locker's lock records of its replica, as the key's
// identity (etcdlock.WithIdentity): the fields of `etcdlock run`'s
// record that `etcdlock status` reads (when it joined the queue, by its
// clock; its host and process), with the program that wrote it and the
// replica's name.
type record struct {
	Queued time.Time `json:"queued"`
	Host   string    `json:"host,omitempty"`
	PID    int       `json:"pid,omitempty"`
	By     string    `json:"by"`
	Name   string    `json:"name,omitempty"`
}

// recordBy is the By of the records a Locker writes.
const recordBy = "etcdlockgocron"

// newRecord returns the record of a lock taken now by replica id.
func newRecord(id string) string {
	host, _ := os.Hostname()
	b, err := json.Marshal(record{Queued: time.Now().UTC(), Host: host, PID: os.Getpid(), By: recordBy, Name: id})
	if err != nil {
		return ""
	}
	return string(b)
}

// whoHolds says, for a Lock refused with err (etcdlock.ErrLocked), which
// replica holds the lock name, or that the record of a hold that ended
// without its key (its session closed or expired) keeps the tick out
// until its minimum hold has passed: one read, bounded by ctx. It
// returns err as it is when the read fails, or tells nothing.
func whoHolds(ctx context.Context, cli *clientv3.Client, name string, err error) error {
	if !errors.Is(err, etcdlock.ErrLocked) {
		return err
	}
	q, rerr := etcdlock.InspectLock(ctx, cli, name, etcdlock.WithoutLeases())
	if rerr != nil {
		return err
	}
	if hs := q.Holders(); len(hs) > 0 {
		h := hs[0]
		if h.MinHold > 0 {
			// etcd cannot tell a run under way from one that ended
			// within the minimum hold: the key stays for both.
			return fmt.Errorf("held by %s, for its run and at least its minimum hold of %v: %w", describe(h), h.MinHold, err)
		}
		return fmt.Errorf("held by %s: %w", describe(h), err)
	}
	for _, d := range q.Delays {
		if d.MinHold > 0 {
			return fmt.Errorf("kept out by the minimum hold of a run that ended (%v of %v left): %w", d.Left.Round(time.Millisecond), d.MinHold, err)
		}
	}
	return err
}

// describe says who holder k is, as it recorded itself.
func describe(k etcdlock.QueueKey) string {
	var rec record
	switch {
	case json.Unmarshal([]byte(k.Identity), &rec) == nil && rec.By == recordBy && rec.Name != "":
		return fmt.Sprintf("replica %q (since %s by its clock)", rec.Name, rec.Queued.Format(time.RFC3339Nano))
	case k.Identity != "":
		return fmt.Sprintf("%q", k.Identity)
	}
	return "key " + k.Key + ", which recorded no identity"
}
