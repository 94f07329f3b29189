package etcdlock

import (
	"bytes"
	"strconv"
	"strings"
)

// Key modes and grant rules: what a key of a queue asks for, read from its
// value, and, for each mode, which keys ahead keep it out.

// A KeyMode is what one key of a lock's queue asks for, as etcdlock reads
// it from the key's value with ParseKeyMode.
type KeyMode struct {
	Shared   bool  // a read lock of an RWMutex
	Weight   int64 // permits of a Semaphore, at least 1; 0 for the other modes
	Capacity int64 // that Semaphore's capacity, as its client was configured; 0 otherwise
}

// Exclusive reports whether the key excludes every other key of the lock:
// a Mutex, an RWMutex write lock, etcd's concurrency.Mutex, `etcdctl lock`,
// or any value etcdlock does not recognise.
func (m KeyMode) Exclusive() bool { return !m.Shared && m.Weight == 0 }

// String returns "exclusive", "shared", or a Semaphore's "3 of 10".
func (m KeyMode) String() string {
	switch {
	case m.Shared:
		return "shared"
	case m.Weight > 0:
		return strconv.FormatInt(m.Weight, 10) + " of " + strconv.FormatInt(m.Capacity, 10)
	}
	return "exclusive"
}

// modeHeader starts the value of every key that is not exclusive.
const modeHeader = "etcdlock/1 "

// value is what a key of mode m holds: "" for exclusive (exactly a Mutex's
// key, and etcd's), "etcdlock/1 shared", or "etcdlock/1 permits 3 of 10".
func (m KeyMode) value() string {
	switch {
	case m.Shared:
		return modeHeader + "shared"
	case m.Weight > 0:
		return modeHeader + "permits " + strconv.FormatInt(m.Weight, 10) + " of " + strconv.FormatInt(m.Capacity, 10)
	}
	return ""
}

// value is the value of this queue's key in mode m: m.value(), then, when
// the queue has an identity (WithIdentity), "\n" and the identity.
func (q *queue) value(m KeyMode) string {
	if q.opts.identity == "" {
		return m.value()
	}
	return m.value() + "\n" + q.opts.identity
}

// setHeader starts the first line of the value of a MultiMutex's key,
// "etcdlock/1 set " and the quoted name of the set's next name: from any
// one key of a set, the names lead round the whole set, so that a reader
// of one queue can tell whether the set holds (readLock). It reads as
// exclusive (ParseKeyMode), to etcdlock releases before it too.
const setHeader = modeHeader + "set "

// setLine is the first line of a set's key whose next name is next.
func setLine(next string) string { return setHeader + strconv.Quote(next) }

// setNext returns the next name that a set's key's value names, and
// false for a key of no set.
func setNext(value []byte) (next string, ok bool) {
	line, _, _ := bytes.Cut(value, []byte("\n"))
	q, ok := strings.CutPrefix(string(line), setHeader)
	if !ok {
		return "", false
	}
	next, err := strconv.Unquote(q)
	return next, err == nil && next != ""
}

// identityOf returns the identity recorded in a key's value by
// WithIdentity: what follows the first "\n", when the first line is a mode
// line as etcdlock writes it (empty for exclusive). Any other value (etcd's
// empty one, an election's proposal, a JSON record) has none: "".
func identityOf(value []byte) string {
	line, rest, ok := bytes.Cut(value, []byte("\n"))
	if _, set := setNext(value); !ok || (len(line) > 0 && ParseKeyMode(value).Exclusive() && !set) {
		return ""
	}
	return string(rest)
}

// ParseKeyMode reads the mode from the value of a key of a lock's queue.
// Only its first line counts (what follows a "\n" is room for a holder's
// own record), and only in exactly the form etcdlock writes: anything else
// (the empty value of a Mutex, a JSON record, a newer format) is
// exclusive, the mode that can never admit more than it should.
//
// InspectLock gives each key's mode already (QueueKey.Mode). This is for
// a tool that watches a lock's keys itself, whose events carry only the
// values.
func ParseKeyMode(value []byte) KeyMode {
	line, _, _ := bytes.Cut(value, []byte("\n"))
	s, ok := strings.CutPrefix(string(line), modeHeader)
	if !ok {
		return KeyMode{}
	}
	var m KeyMode
	if s == "shared" {
		m = KeyMode{Shared: true}
	} else if rest, ok := strings.CutPrefix(s, "permits "); ok {
		ns, cs, _ := strings.Cut(rest, " of ")
		n, err1 := strconv.ParseInt(ns, 10, 64)
		c, err2 := strconv.ParseInt(cs, 10, 64)
		if err1 != nil || err2 != nil || n < 1 || n > c {
			return KeyMode{}
		}
		m = KeyMode{Weight: n, Capacity: c}
	}
	// Canonical only: "+3", "03" or trailing blanks are not ours.
	if m.value() != string(line) {
		return KeyMode{}
	}
	return m
}

// An entry is one direct child of the lock's prefix: a holder or a waiter.
type entry struct {
	key  string
	rev  int64   // create revision: the place in line, and the token
	mode KeyMode // from the value; exclusive when the queue was read keys only
}

// A rule is a grant rule. Given the entries ahead of me, newest first (the
// whole list, or the newest part of it read so far), it returns the
// blockers: entries of ahead that keep me out for as long as each of them
// exists unchanged, whatever else happens in the queue. None: nothing read
// keeps me out; me is admitted once the whole list has been read. The
// waiter watches exactly its blockers.
//
// Every rule has two properties the queue relies on:
//   - blockers found in a newest-first part stay blockers of the whole
//     list, so a scan stops at the first page that yields some;
//   - fewer entries ahead never turn "admitted" into "blocked" (entries
//     only leave the part of the queue ahead of me: new ones join behind,
//     and no key changes its mode in place).
type rule func(me entry, ahead []entry) (blockers []entry)

// rule returns the grant rule of a key of mode m.
func (m KeyMode) rule() rule {
	switch {
	case m.Shared:
		return admitShared
	case m.Weight > 0:
		return admitWeighted
	}
	return admitExclusive
}

// admitExclusive is the rule of a Mutex and of an RWMutex's write lock:
// it holds when nothing is ahead. The blocker is the key just ahead: when
// it goes, the next key ahead (if any) becomes the blocker, so a release
// wakes exactly one waiter. It reads no modes: any key ahead blocks.
func admitExclusive(_ entry, ahead []entry) []entry {
	if len(ahead) == 0 {
		return nil
	}
	return ahead[:1]
}

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

// holdersOf reports how many keys of a lock's queue, given by their modes
// oldest create revision first, hold the lock: the longest prefix that
// Lock, RLock and Acquire admit. The rest wait, in that order.
// (LockQueue.Holders gives a tool the keys it counts.)
func holdersOf(queue []KeyMode) int {
	ahead := make([]entry, 0, len(queue)) // newest first
	for i, m := range queue {
		if len(m.rule()(entry{mode: m}, ahead)) > 0 {
			return i
		}
		ahead = append([]entry{{mode: m}}, ahead...)
	}
	return len(queue)
}
