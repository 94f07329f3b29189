package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStatusFree(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^lock "`+regexp.QuoteMeta(name)+`" is free \(etcd revision \d+\)\n$`, r.stdout)

	r = runProc(t, nil, "status", ep(), name, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, name, st["name"])
	require.Nil(t, st["holder"])
	require.Equal(t, []any{}, st["waiters"])
}

// status shows the holder, as recorded by etcdlock run, and the waiters in
// queue order; a nested lock's key does not count.
func TestStatusQueue(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	before := time.Now()
	p := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "started $ETCDLOCK_KEY"; cat >/dev/null`)
	holderKey := strings.Fields(p.stdout.waitFor(t, "started"))[1]
	holderKV := waitRecorded(t, cli, holderKey)

	w := watchQueue(t, cli, name)
	w1 := startWaiter(t, cli, name)
	require.Equal(t, w1.m.Key(), w.next(t))
	// A nested lock's key, between the waiters.
	_, err := cli.Put(t.Context(), name+"/sub/1234", "")
	require.NoError(t, err)
	w2 := startWaiter(t, cli, name)
	require.Equal(t, w2.m.Key(), w.next(t))
	keys := queueKeys(t, cli, name)
	require.Equal(t, []string{holderKey, w1.m.Key(), w2.m.Key()}, keys)
	tokens := revisions(t, cli, keys)

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	out := r.stdout
	t.Logf("status:\n%s", out)
	require.Regexp(t, `^lock "`+regexp.QuoteMeta(name)+`" is held, 2 waiting \(etcd revision \d+\)\n`, out)
	require.Regexp(t, `\nPOSITION +KEY +LEASE +TOKEN\n`, out)
	for i, key := range keys {
		pos := "holder"
		if i > 0 {
			pos = strconv.Itoa(i)
		}
		lease := strings.TrimPrefix(key, name+"/")
		require.Regexp(t, `\n`+pos+` +`+regexp.QuoteMeta(key)+` +`+lease+` +`+strconv.FormatInt(tokens[i], 10)+`\n`, out)
	}
	require.NotContains(t, out, "sub")
	require.Regexp(t, `\nholder's lease: TTL 15s, \d+s left\n`, out)
	require.Regexp(t, `\nheld since: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \(.+ ago\), as recorded by the holder's clock\n`, out)
	require.Contains(t, out, "holder: etcdlock run running sh as pid "+strconv.Itoa(p.cmd.Process.Pid)+" on ")

	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, name, st.Name)
	require.GreaterOrEqual(t, st.Revision, holderKV.ModRevision)
	h := st.Holder
	require.NotNil(t, h)
	require.Equal(t, holderKey, h.Key)
	require.Equal(t, strconv.FormatInt(holderKV.Lease, 16), h.Lease)
	require.Equal(t, tokens[0], h.Token)
	require.NotNil(t, h.LeaseTTL)
	require.Equal(t, int64(15), *h.LeaseTTL)
	require.NotNil(t, h.HeldSince)
	require.False(t, h.HeldSince.Before(before.Add(-time.Second)), "held since %v, started %v", h.HeldSince, before)
	require.False(t, h.HeldSince.After(time.Now()))
	require.Equal(t, p.cmd.Process.Pid, h.PID)
	require.Equal(t, "sh", h.Command)
	require.Len(t, st.Waiters, 2)
	for i, wt := range st.Waiters {
		require.Equal(t, i+1, wt.Position)
		require.Equal(t, keys[i+1], wt.Key)
		require.Equal(t, tokens[i+1], wt.Token)
		require.Equal(t, strings.TrimPrefix(keys[i+1], name+"/"), wt.Lease)
	}

	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
	w1.unlock(t)
	w2.unlock(t)
}

// A holder that recorded nothing (etcdctl lock, a library user): status
// says the time is unknown rather than guessing.
func TestStatusUnknownSince(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	m, _ := holdLock(t, cli, name)
	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "held since: unknown (etcd keeps no timestamps and the holder recorded none); key created at revision "+strconv.FormatInt(m.Token(), 10)+"\n")

	r = runProc(t, nil, "status", ep(), "--json", name)
	require.Equal(t, 0, r.code, r.stderr)
	var st struct{ Holder map[string]any }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.NotContains(t, st.Holder, "held_since")
	require.Equal(t, float64(m.Token()), st.Holder["token"])
}

// waitRecorded waits until etcdlock run has recorded itself in key, and
// returns the key.
func waitRecorded(t *testing.T, cli *clientv3.Client, key string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	if len(resp.Kvs[0].Value) > 0 {
		return resp.Kvs[0]
	}
	wch := cli.Watch(t.Context(), key, clientv3.WithRev(resp.Header.Revision+1))
	for {
		select {
		case wr := <-wch:
			require.NoError(t, wr.Err())
			for _, ev := range wr.Events {
				require.Equal(t, clientv3.EventTypePut, ev.Type, "key deleted")
				if len(ev.Kv.Value) > 0 {
					return ev.Kv
				}
			}
		case <-time.After(procTimeout):
			t.Fatal("holder not recorded")
		}
	}
}

// revisions returns the create revisions of keys.
func revisions(t *testing.T, cli *clientv3.Client, keys []string) []int64 {
	t.Helper()
	var revs []int64
	for _, k := range keys {
		resp, err := cli.Get(t.Context(), k)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		revs = append(revs, resp.Kvs[0].CreateRevision)
	}
	return revs
}

// An RWMutex's readers hold together: status shows each of them as a
// holder, and the writer queued behind them, and the reader behind that
// writer, as waiters, with each key's mode.
func TestStatusRWMutex(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	var keys []string
	for range 3 {
		rw := etcdlock.NewRWMutex(newSession(t, cli), name)
		require.NoError(t, rw.RLock(t.Context()))
		keys = append(keys, rw.Key())
	}
	w := watchQueue(t, cli, name)
	writer := goWait(t, etcdlock.NewRWMutex(newSession(t, cli), name).Lock)
	keys = append(keys, w.next(t))
	reader := goWait(t, etcdlock.NewRWMutex(newSession(t, cli), name).RLock)
	keys = append(keys, w.next(t))
	tokens := revisions(t, cli, keys)
	modes := []string{"shared", "shared", "shared", "exclusive", "shared"}

	out := statusText(t, name)
	require.Regexp(t, `^lock "`+regexp.QuoteMeta(name)+`" is held by 3, 2 waiting \(etcd revision \d+\)\n`, out)
	require.Regexp(t, `\nPOSITION +KEY +LEASE +TOKEN +MODE\n`, out)
	for i, key := range keys {
		pos := "holder"
		if i >= 3 {
			pos = strconv.Itoa(i - 2)
		}
		lease := strings.TrimPrefix(key, name+"/")
		require.Regexp(t, `\n`+pos+` +`+regexp.QuoteMeta(key)+` +`+lease+` +`+strconv.FormatInt(tokens[i], 10)+` +`+modes[i]+`\n`, out)
		if i < 3 {
			require.Regexp(t, `\nlease of `+regexp.QuoteMeta(key)+`: TTL 15s, \d+s left\n`, out)
		}
	}
	require.NotContains(t, out, "permits")
	require.Contains(t, out, "held since: unknown (etcd keeps no timestamps and the holders recorded none)")

	st := statusOf(t, name)
	require.Len(t, st.Holders, 3)
	require.Equal(t, st.Holders[0], st.Holder, "holder is the oldest holder")
	for i, h := range st.Holders {
		require.Equal(t, keys[i], h.Key)
		require.Equal(t, tokens[i], h.Token)
		require.Equal(t, modeJSON{Mode: "shared"}, h.modeJSON)
		require.NotNil(t, h.LeaseTTL)
	}
	require.Len(t, st.Waiters, 2)
	for i, wt := range st.Waiters {
		require.Equal(t, i+1, wt.Position)
		require.Equal(t, keys[3+i], wt.Key)
		require.Equal(t, tokens[3+i], wt.Token)
		require.Equal(t, modeJSON{Mode: modes[3+i]}, wt.modeJSON)
	}
	// The raw JSON: the fields scripts read, and none for weights here.
	raw := rawStatus(t, name)
	require.Equal(t, "shared", raw["holder"].(map[string]any)["mode"])
	require.NotContains(t, raw["holder"], "weight")
	require.Equal(t, "exclusive", raw["waiters"].([]any)[0].(map[string]any)["mode"])
	require.Len(t, raw["holders"], 3)

	requireWaiting(t, writer, reader)
}

// A Semaphore's holders are the longest prefix of the queue whose permits
// fit: status shows the permits of each key, the total held, and clients
// that disagree on the capacity.
func TestStatusSemaphore(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	var keys []string
	for _, n := range []int64{2, 3} {
		sem := etcdlock.NewSemaphore(newSession(t, cli), name, 5)
		require.NoError(t, sem.Acquire(t.Context(), n))
		keys = append(keys, sem.Key())
	}
	w := watchQueue(t, cli, name)
	// 4 do not fit beside 5 held; 1 would, but waits behind them (FIFO).
	big := goWait(t, func(ctx context.Context) error {
		return etcdlock.NewSemaphore(newSession(t, cli), name, 5).Acquire(ctx, 4)
	})
	keys = append(keys, w.next(t))
	small := goWait(t, func(ctx context.Context) error {
		return etcdlock.NewSemaphore(newSession(t, cli), name, 10).Acquire(ctx, 1)
	})
	keys = append(keys, w.next(t))
	tokens := revisions(t, cli, keys)
	modes := []modeJSON{
		{Mode: "permits", Weight: 2, Capacity: 5},
		{Mode: "permits", Weight: 3, Capacity: 5},
		{Mode: "permits", Weight: 4, Capacity: 5},
		{Mode: "permits", Weight: 1, Capacity: 10},
	}

	out := statusText(t, name)
	require.Regexp(t, `^lock "`+regexp.QuoteMeta(name)+`" is held by 2, 2 waiting \(etcd revision \d+\)\n`, out)
	require.Regexp(t, `\nPOSITION +KEY +LEASE +TOKEN +MODE\n`, out)
	for i, key := range keys {
		pos := "holder"
		if i >= 2 {
			pos = strconv.Itoa(i - 1)
		}
		mode := regexp.QuoteMeta(modes[i].String())
		require.Regexp(t, `\n`+pos+` +`+regexp.QuoteMeta(key)+` +\S+ +`+strconv.FormatInt(tokens[i], 10)+` +`+mode+`\n`, out)
	}
	require.Contains(t, out, "\npermits held: 5 of 5\n")
	require.Contains(t, out, "\ncapacities disagree (5, 10): ")

	st := statusOf(t, name)
	require.Len(t, st.Holders, 2)
	require.Equal(t, st.Holders[0], st.Holder)
	for i, h := range st.Holders {
		require.Equal(t, keys[i], h.Key)
		require.Equal(t, tokens[i], h.Token)
		require.Equal(t, modes[i], h.modeJSON)
	}
	require.Len(t, st.Waiters, 2)
	for i, wt := range st.Waiters {
		require.Equal(t, i+1, wt.Position)
		require.Equal(t, keys[2+i], wt.Key)
		require.Equal(t, modes[2+i], wt.modeJSON)
	}
	raw := rawStatus(t, name)
	h := raw["holder"].(map[string]any)
	require.Equal(t, "permits", h["mode"])
	require.Equal(t, float64(2), h["weight"])
	require.Equal(t, float64(5), h["capacity"])

	requireWaiting(t, big, small)
}

// A Mutex's queue has no MODE column and no permits: its status reads as
// it did before RWMutex and Semaphore; --json gives every key its mode.
func TestStatusMutexModes(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	startWaiter(t, cli, name)
	w.next(t)

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `^lock "`+regexp.QuoteMeta(name)+`" is held, 1 waiting \(etcd revision \d+\)\nPOSITION +KEY +LEASE +TOKEN\n`, r.stdout)
	require.NotContains(t, r.stdout, "exclusive")
	require.NotContains(t, r.stdout, "permits")

	st := statusOf(t, name)
	require.Len(t, st.Holders, 1)
	require.Equal(t, st.Holder, st.Holders[0])
	require.Equal(t, modeJSON{Mode: "exclusive"}, st.Holder.modeJSON)
	require.Equal(t, modeJSON{Mode: "exclusive"}, st.Waiters[0].modeJSON)
}

// newSession returns a session of cli, closed at the end of the test.
func newSession(t *testing.T, cli *clientv3.Client) *etcdlock.Session {
	t.Helper()
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// goWait runs lock, which is to wait in a queue, in a goroutine, and
// returns a channel closed when it returned. It is cancelled and waited
// for at the end of the test.
func goWait(t *testing.T, lock func(ctx context.Context) error) <-chan struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		lock(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return done
}

// requireWaiting checks that none of the goWait calls has returned.
func requireWaiting(t *testing.T, waiters ...<-chan struct{}) {
	t.Helper()
	for i, done := range waiters {
		select {
		case <-done:
			t.Fatalf("waiter %d returned: it should still wait", i)
		default:
		}
	}
}

// statusText runs status for name and returns what it printed.
func statusText(t *testing.T, name string) string {
	t.Helper()
	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	t.Logf("status:\n%s", r.stdout)
	return r.stdout
}

// statusOf runs status --json for name and decodes it.
func statusOf(t *testing.T, name string) *statusJSON {
	t.Helper()
	r := runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	return &st
}

// rawStatus runs status --json for name and decodes it as scripts would.
func rawStatus(t *testing.T, name string) map[string]any {
	t.Helper()
	r := runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	return st
}

// TestStatusElection: status shows an election leader's proposal, as
// Campaign put it and as Proclaim changed it; a Mutex holder shows none.
func TestStatusElection(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	e := etcdlock.NewElection(newSession(t, cli), name)
	require.NoError(t, e.Campaign(t.Context(), "primary at 10.0.0.7:8080"))

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "\nvalue: \"primary at 10.0.0.7:8080\" (an election leader's proposal, or what the holder put)\n")
	st := statusOf(t, name)
	require.NotNil(t, st.Holder.Value)
	require.Equal(t, "primary at 10.0.0.7:8080", *st.Holder.Value)

	require.NoError(t, e.Proclaim(t.Context(), "line one\nline two"))
	r = runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, `value: "line one\nline two"`)
	require.NoError(t, e.Resign(t.Context()))

	other := name + "-mutex"
	holdLock(t, cli, other)
	require.Nil(t, statusOf(t, other).Holder.Value)
	r = runProc(t, nil, "status", ep(), other)
	require.NotContains(t, r.stdout, "value:")
}
