package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runRecord is the identity etcdlock run gives its key, through
// etcdlock.WithIdentity: the Put that joins the queue writes it, at no
// extra cost. etcd records no time of its own; Queued is when run joined
// the queue, by its own clock, not when it got the lock. Other programs
// write it too (the gocron adapter), and say so in By.
type runRecord struct {
	Queued time.Time `json:"queued"`
	whoJSON
}

// whoJSON is who a key's holder says it is, in its record (runRecord),
// and in status and ls --json.
type whoJSON struct {
	Host    string `json:"host,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Command string `json:"command,omitempty"` // run's CMD's name, without arguments
	// By is the program that wrote the record when it is not etcdlock
	// run ("etcdlockgocron"), and Name the name it gave itself (a
	// replica's WithIdentity).
	By   string `json:"by,omitempty"`
	Name string `json:"name,omitempty"`
}

// newRunRecord returns run's identity, queued now, for CMD cmdName ("":
// none).
func newRunRecord(cmdName string) string {
	host, _ := os.Hostname()
	b, err := json.Marshal(runRecord{Queued: time.Now().UTC(), whoJSON: whoJSON{Host: host, PID: os.Getpid(), Command: cmdName}})
	if err != nil {
		return ""
	}
	return string(b)
}

// parseRunRecord reads a key's identity as etcdlock run writes it.
func parseRunRecord(identity string) (runRecord, bool) {
	var rec runRecord
	if !strings.HasPrefix(identity, "{") || json.Unmarshal([]byte(identity), &rec) != nil || rec.Queued.IsZero() {
		return runRecord{}, false
	}
	return rec, true
}

// who describes the holder of a record: "etcdlock run sh, pid 12 on host",
// or "etcdlockgocron "replica-1", pid 12 on host", its command, name and
// host as safeText shows them.
func (rec whoJSON) who() string {
	s := "etcdlock run"
	if rec.By != "" {
		s = safeText(rec.By)
	}
	if rec.Name != "" {
		s += " " + strconv.Quote(rec.Name)
	}
	if rec.Command != "" {
		s += " " + safeText(rec.Command)
	}
	if rec.PID != 0 {
		s += fmt.Sprintf(", pid %d", rec.PID)
	}
	if rec.Host != "" {
		s += " on " + safeText(rec.Host)
	}
	return s
}

// A selfRecord is what a holder recorded about itself, as status and ls
// show it.
type selfRecord struct {
	whoJSON
	// Queued is when it joined the queue (etcdlock run's identity), and
	// HeldSince when its hold began, when that is known: run's Queued if
	// it got the lock the moment it joined, or the time an older etcdlock
	// run wrote into its key once it held the lock. Both by its clock.
	Queued, HeldSince *time.Time
}

// A recordReader reads what holder k of lock name recorded about itself:
// readSelfRecord, or a watch's selfRecords.read that reads each once.
type recordReader func(ctx context.Context, cli *clientv3.Client, name string, k etcdlock.QueueKey) (selfRecord, bool)

// readSelfRecord reads what holder k of lock name recorded about itself;
// false if nothing that etcdlock run writes. For run's identity it asks
// etcd's history whether k got the lock the moment it joined (one read).
func readSelfRecord(ctx context.Context, cli *clientv3.Client, name string, k etcdlock.QueueKey) (selfRecord, bool) {
	if rec, ok := parseRunRecord(k.Identity); ok {
		r := selfRecord{whoJSON: rec.whoJSON, Queued: &rec.Queued}
		if heldFromQueued(ctx, cli, name, k) {
			r.HeldSince = r.Queued
		}
		return r, true
	}
	// Before WithIdentity, etcdlock run wrote its record, the value, once
	// it held the lock.
	var old holderRecord
	if k.Identity == "" && k.Mode.Exclusive() && json.Unmarshal(k.Value, &old) == nil && !old.Since.IsZero() {
		return selfRecord{whoJSON: whoJSON{Host: old.Host, PID: old.PID, Command: old.Command}, HeldSince: &old.Since}, true
	}
	return selfRecord{}, false
}

// heldFromQueued reports whether holder k, which holds the lock of name,
// has held it since it joined the queue: whether its key was admitted at
// its create revision (then the queued time of its record is when the hold
// began). One read of the queue at that revision; false if it waited, or
// if etcd has compacted that revision or cannot be read.
func heldFromQueued(ctx context.Context, cli *clientv3.Client, name string, k etcdlock.QueueKey) bool {
	q, err := etcdlock.InspectLock(ctx, cli, name, etcdlock.AtRevision(k.Token), etcdlock.WithoutLeases())
	if err != nil {
		return false
	}
	for _, h := range q.Holders() {
		if h.Key == k.Key && h.Token == k.Token {
			return true
		}
	}
	return false
}
