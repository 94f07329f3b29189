package main

import (
	"flag"
	"math"
	"runtime"
	"time"
)

// How run and elect fit stopping CMD into the lease. etcd can expire the
// lease, and let the next holder in, TTL after etcd received the newest
// renewal; the session counts that from when the renewal was sent
// (Session.Expiry), which is no later. CMD must be gone, SIGKILL
// included, killMargin before that. So when renewals have failed for
// TTL − killMargin − grace (etcd out of reach or paused: Chubby's
// jeopardy), CMD gets SIGTERM, and SIGKILL grace later. A --grace is
// refused if it would stop CMD while renewals had failed for less than
// half the TTL, as a slow answer or two can make them; the default grace
// stops it after two thirds.

// defaultGrace is --grace's upper bound when not given.
const defaultGrace = 10 * time.Second

// killMargin is how long before its lease can expire CMD gets SIGKILL at
// the latest: for the kill to take effect and what is left of CMD to be
// reaped, and for this host's clock and etcd's to run at different rates.
func killMargin(ttl time.Duration) time.Duration {
	return max(500*time.Millisecond, ttl/20)
}

// maxGrace is the longest --grace that ttl leaves room for.
func maxGrace(ttl time.Duration) time.Duration {
	return max(0, ttl/2-killMargin(ttl))
}

// graceFor returns the grace --grace (given, or not) means with ttl, or
// a usage error for a grace that does not fit in it.
func graceFor(fset *flag.FlagSet, command string, grace, ttl time.Duration) (time.Duration, error) {
	ttl = leaseTTL(ttl)
	if !given(fset, "grace") {
		return min(grace, max(0, ttl/3-killMargin(ttl))), nil
	}
	if grace > maxGrace(ttl) {
		return 0, usageErr(command, "--grace %v does not fit in --ttl %v: CMD is stopped when renewals have failed for --ttl less --grace less %v (so that it is gone before the lock can pass on), which must leave at least half the TTL; give --grace at most %v, or --ttl at least %v",
			grace, ttl, killMargin(ttl), maxGrace(ttl), ttlFor(grace))
	}
	return grace, nil
}

// leaseTTL is the TTL etcd grants for ttl: whole seconds, rounded up.
func leaseTTL(ttl time.Duration) time.Duration {
	return time.Duration(math.Ceil(ttl.Seconds())) * time.Second
}

// ttlFor returns the shortest whole-second TTL whose maxGrace is at least
// grace.
func ttlFor(grace time.Duration) time.Duration {
	ttl := leaseTTL(2 * grace)
	for maxGrace(ttl) < grace {
		ttl += time.Second
	}
	return ttl
}

// given reports whether flag name was set on the command line.
func given(fset *flag.FlagSet, name string) bool {
	set := false
	fset.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// checkPIDNamespace returns a usage error for --pid-namespace where it
// means nothing or cannot be had.
func checkPIDNamespace(command string, pidns, keep, hasCmd bool) error {
	switch {
	case !pidns:
		return nil
	case runtime.GOOS != "linux":
		return usageErr(command, "--pid-namespace is for Linux only")
	case !hasCmd:
		return usageErr(command, "--pid-namespace is about the processes CMD starts: give CMD")
	case keep:
		return usageErr(command, "--pid-namespace and --keep-children exclude each other: nothing outlives the namespace")
	}
	return nil
}
