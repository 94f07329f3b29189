package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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
