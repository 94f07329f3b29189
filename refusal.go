package etcdlock

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Refusals: etcd answers "permission denied" without saying which key it
// refused. The errors here find out, with requests that change nothing,
// and name only the prefixes refused, with the grants that fix them.

// probeRefused returns the prefixes (keyPrefix) of those of keys that
// etcd refuses cli's user to read and write, and whether it could tell.
// Each key gets a Txn whose compare never holds (a version below 0) and
// whose Then puts the key: etcd checks the permission of every operation
// of a Txn, whichever branch runs, and of its compares (read), and this
// one writes nothing, not even a revision. Any other error leaves the
// answer unknown.
func probeRefused(ctx context.Context, cli *clientv3.Client, keys ...string) (pfxs []string, ok bool) {
	for _, k := range keys {
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(k), "<", 0)).Then(clientv3.OpPut(k, "")).Commit()
		switch {
		case refused(err):
			if p := keyPrefix(k); !slices.Contains(pfxs, p) {
				pfxs = append(pfxs, p)
			}
		case err != nil:
			return nil, false
		}
	}
	return pfxs, true
}

// keyPrefix is key up to its last "/", included: a lock's key
// (NAME/<lease>) gives the lock's prefix, a record's the record's.
func keyPrefix(key string) string {
	return key[:strings.LastIndex(key, "/")+1]
}

// quoteAll returns each of ss quoted, joined by sep.
func quoteAll(ss []string, sep string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, sep)
}

// refusedErr explains etcd's refusal err of a Lock of q: the prefixes of
// the keys the Lock reads and writes that etcd refuses (probeRefused), or,
// when that cannot be told, every one of them; and the command that
// prints the grants.
func (q *queue) refusedErr(ctx context.Context, err error) error {
	var keys, all []string
	for _, p := range q.parts() {
		keys, all = append(keys, p.key), append(all, p.prefix())
	}
	grants := "etcdlock grants"
	if q.opts.records {
		keys, all = append(keys, delayKey(q.key)), append(all, q.delayPfx())
		if q.opts.delay > 0 {
			grants += " --lock-delay"
		} else {
			grants += " --min-hold"
		}
	}
	pctx, cancel := q.s.bound(ctx)
	defer cancel()
	if pfxs, ok := probeRefused(pctx, q.s.cli, keys...); ok && len(pfxs) > 0 {
		return errorf("a lock of %s needs readwrite permission on the keys with prefix %s, which etcd refuses its user ('%s NAME...' prints the etcdctl lines; with --prefix PREFIX, for every lock under it): %w",
			q.label(), quoteAll(pfxs, " and "), grants, err)
	}
	return errorf("a lock of %s reads and writes the keys with prefix %s, and its user needs readwrite permission on each ('%s NAME...' prints the etcdctl lines; with --prefix PREFIX, for every lock under it): %w",
		q.label(), quoteAll(all, " and "), grants, err)
}

// requestRefusedErr explains etcd's refusal err of a release request on
// name: the lock's keys are read, its request keys written; it names
// those etcd refuses, or both when that cannot be told.
func requestRefusedErr(ctx context.Context, cli *clientv3.Client, name string, err error) error {
	lock, reqs := name+"/", ReleaseRequestPrefix+name+"/"
	var pfxs []string
	ok := true
	if _, rerr := cli.Get(ctx, lock, clientv3.WithPrefix(), clientv3.WithCountOnly()); refused(rerr) {
		pfxs = append(pfxs, lock)
	} else if rerr != nil {
		ok = false
	}
	if ok {
		var w []string
		w, ok = probeRefused(ctx, cli, reqs+"probe")
		pfxs = append(pfxs, w...)
	}
	const grants = "('etcdlock grants --requests NAME...' prints the etcdctl lines; with --prefix PREFIX, for every lock under it)"
	switch {
	case ok && len(pfxs) == 1 && pfxs[0] == lock:
		return errorf("a release request on %s reads the keys with prefix %q, which etcd refuses its user %s: %w", name, lock, grants, err)
	case ok && len(pfxs) == 1:
		return errorf("a release request on %s writes the keys with prefix %q, which etcd refuses its user %s: %w", name, reqs, grants, err)
	}
	return errorf("a release request on %s reads the keys with prefix %q and writes those with prefix %q, and its user needs permission for both %s: %w",
		name, lock, reqs, grants, err)
}

// shardsRefusedErr explains etcd's refusal err of a write of shard set
// name (RunShards's membership, SetShardWeight): every key of the set
// lies under name/.
func shardsRefusedErr(name string, err error) error {
	return errorf("the shard set %s reads and writes the keys with prefix %q, which etcd refuses its user ('etcdlock grants NAME' prints the etcdctl lines; with --prefix PREFIX, for every lock under it): %w", name, name+"/", err)
}

// readRefusedErr explains etcd's refusal err of a read of the keys with
// prefix pfx, which what (a lock, a listing) reads.
func readRefusedErr(what, pfx string, err error) error {
	return errorf("%s reads the keys with prefix %q, which etcd refuses its user ('etcdlock grants --observe-only' prints the etcdctl lines): %w", what, pfx, err)
}

// notWritten is the error of a write that etcd refused at its first
// attempt: it wrote nothing, and there is nothing to remove after it.
// (A refusal after an attempt whose outcome is unknown proves nothing of
// that one.)
type notWritten struct{ error }

func (e notWritten) Unwrap() error { return e.error }

// isNotWritten reports whether err says its write wrote nothing.
func isNotWritten(err error) bool {
	var nw notWritten
	return errors.As(err, &nw)
}
