package main

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestLsEmpty(t *testing.T) {
	t.Parallel()
	pfx := lockName(t) + "/"
	r := runProc(t, nil, "ls", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^no locks under "`+regexp.QuoteMeta(pfx)+`" \(etcd revision \d+\)\n$`, r.stdout)

	r = runProc(t, nil, "ls", "--json", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	var ls map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Equal(t, []any{}, ls["locks"])

	r = runProc(t, nil, "ls", ep())
	require.Equal(t, exitUsage, r.code)
	requireOneLineError(t, r, `missing PREFIX ("" lists every lock)`)
}

// ls "" lists every lock in etcd; one lock is "1 lock".
func TestLsEverything(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)

	r := runProc(t, nil, "ls", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^1 lock under "`+regexp.QuoteMeta(name)+`" \(etcd revision \d+\)\n`, r.stdout)

	r = runProc(t, nil, "ls", ep(), "")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^\d+ locks? \(etcd revision \d+\)\n`, r.stdout)
	require.Regexp(t, `(?m)^`+regexp.QuoteMeta(name)+` +`+regexp.QuoteMeta(m.Key())+` +\? +0$`, r.stdout)
	r = runProc(t, nil, "ls", "--json", ep(), "")
	require.Equal(t, 0, r.code, r.stderr)
	var ls lsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Equal(t, "", ls.Prefix)
	require.True(t, slices.ContainsFunc(ls.Locks, func(l lsLockJSON) bool { return l.Name == name }), r.stdout)
}

// ls shows an election leader by its value, and an identity that is a
// JSON object as one in JSON.
func TestLsElectionAndIdentity(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	pfx := lockName(t) + "/"
	e := etcdlock.NewElection(newSession(t, cli), pfx+"election")
	require.NoError(t, e.Campaign(t.Context(), "primary at 10.0.0.7:8080"))
	require.NoError(t, identityMutex(t, cli, pfx+"object", `{"service": "billing", "shard": 7}`).Lock(t.Context()))
	require.NoError(t, identityMutex(t, cli, pfx+"text", `42 workers`).Lock(t.Context()))

	r := runProc(t, nil, "ls", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `(?m)^`+regexp.QuoteMeta(pfx)+`election +value "primary at 10\.0\.0\.7:8080" +\? +0$`, r.stdout)

	r = runProc(t, nil, "ls", "--json", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	var raw struct {
		Locks []struct {
			Holders []map[string]any
		}
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	require.Len(t, raw.Locks, 3)
	require.Equal(t, "primary at 10.0.0.7:8080", raw.Locks[0].Holders[0]["value"])
	require.Equal(t, map[string]any{"service": "billing", "shard": float64(7)}, raw.Locks[1].Holders[0]["identity"])
	require.Equal(t, "42 workers", raw.Locks[2].Holders[0]["identity"])
	var ls lsJSON // and it reads back
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.JSONEq(t, `{"service": "billing", "shard": 7}`, string(ls.Locks[1].Holders[0].Identity))
}

// identityMutex takes lock name with identity, through a session of its
// own that ends with the test.
func identityMutex(t *testing.T, cli *clientv3.Client, name, identity string) *etcdlock.Mutex {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return etcdlock.NewMutex(s, name, etcdlock.WithIdentity(identity))
}

// TestLs: a line per lock under the prefix, nested locks apart, with the
// holder's identity and how long it holds as far as it can be known, and
// the number of waiters.
func TestLs(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	ctx := t.Context()
	pfx := lockName(t) + "/"

	// at-once: etcdlock run's identity, admitted the moment it queued; a
	// waiter behind it.
	atOnce := identityMutex(t, cli, pfx+"at-once", newRunRecord("backup"))
	require.NoError(t, atOnce.Lock(ctx))
	w := startWaiter(t, cli, pfx+"at-once")
	// at-once/sub: a nested lock with a plain identity.
	sub := identityMutex(t, cli, pfx+"at-once/sub", "billing worker 7\nsecond line")
	require.NoError(t, sub.Lock(ctx))
	// waited: run's identity, admitted after it waited.
	first, _ := holdLock(t, cli, pfx+"waited")
	waited := identityMutex(t, cli, pfx+"waited", newRunRecord("report"))
	waitedDone := make(chan error, 1)
	go func() { waitedDone <- waited.Lock(ctx) }()
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, pfx+"waited")) == 2 }, procTimeout, 10*time.Millisecond)
	require.NoError(t, first.Unlock(ctx))
	require.NoError(t, <-waitedDone)
	// plain: no identity (etcdctl lock, etcd's Mutex).
	plain, _ := holdLock(t, cli, pfx+"plain")
	// rw: two readers.
	for range 2 {
		s, err := etcdlock.NewSession(ctx, cli)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		require.NoError(t, etcdlock.NewRWMutex(s, pfx+"rw").RLock(ctx))
	}
	// run: a holder that etcdlock run started.
	p := startProc(t, nil, "run", ep(), pfx+"run", "--", "sh", "-c", `echo started; cat >/dev/null`)
	p.stdout.waitFor(t, "started")
	waitRecorded(t, cli, queueKeys(t, cli, pfx+"run")[0])

	r := runProc(t, nil, "ls", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	out := r.stdout
	t.Logf("ls:\n%s", out)
	host, _ := os.Hostname()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 8, out)
	require.Regexp(t, `^6 locks under "`+regexp.QuoteMeta(pfx)+`" \(etcd revision \d+\)$`, lines[0])
	require.Regexp(t, `^NAME +HOLDER +HELD FOR +WAITERS$`, lines[1])
	row := func(i int, name, holder, heldFor string, waiters int) {
		t.Helper()
		require.Regexp(t, `^`+regexp.QuoteMeta(pfx+name)+` +`+regexp.QuoteMeta(holder)+` +`+heldFor+` +`+strconv.Itoa(waiters)+`$`, lines[i])
	}
	dur := `\d[\d.]*(ms|s|m\d+s)`
	row(2, "at-once", "etcdlock run backup, pid "+strconv.Itoa(os.Getpid())+" on "+host, dur, 1)
	row(3, "at-once/sub", `"billing worker 7\nsecond line"`, `\?`, 0)
	row(4, "plain", plain.Key(), `\?`, 0)
	row(5, "run", "etcdlock run sh, pid "+strconv.Itoa(p.cmd.Process.Pid)+" on "+host, dur, 0)
	row(6, "rw", "", `.*`, 0)
	require.Regexp(t, `\(\+1 more\) +\? +0$`, lines[6])
	row(7, "waited", "etcdlock run report, pid "+strconv.Itoa(os.Getpid())+" on "+host, `<=`+dur, 0)

	r = runProc(t, nil, "ls", "--json", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	var ls lsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Equal(t, pfx, ls.Prefix)
	require.Len(t, ls.Locks, 6)
	l := ls.Locks[0]
	require.Equal(t, pfx+"at-once", l.Name)
	require.Equal(t, 1, l.Waiters)
	require.Len(t, l.Holders, 1)
	h := l.Holders[0]
	require.Equal(t, atOnce.Key(), h.Key)
	require.Equal(t, atOnce.Token(), h.Token)
	require.Equal(t, "exclusive", h.Mode)
	require.Equal(t, "backup", h.Command)
	require.NotNil(t, h.QueuedAt)
	require.NotNil(t, h.HeldSince)
	require.Equal(t, *h.QueuedAt, *h.HeldSince)
	require.Equal(t, identityJSON("billing worker 7\nsecond line"), ls.Locks[1].Holders[0].Identity)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &raw))
	id := raw["locks"].([]any)[0].(map[string]any)["holders"].([]any)[0].(map[string]any)["identity"]
	require.Equal(t, "backup", id.(map[string]any)["command"], "run's record, an object")
	require.Nil(t, ls.Locks[2].Holders[0].QueuedAt)
	require.Nil(t, ls.Locks[2].Holders[0].HeldSince)
	require.Len(t, ls.Locks[4].Holders, 2)
	require.Equal(t, "shared", ls.Locks[4].Holders[1].Mode)
	wh := ls.Locks[5].Holders[0]
	require.Equal(t, waited.Key(), wh.Key)
	require.NotNil(t, wh.QueuedAt)
	require.Nil(t, wh.HeldSince, "it waited: the hold began after it queued, when is not known")

	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	_ = w // waits behind atOnce until the test ends
}
