package etcdlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFencedWriteStaleHolder: a holder paused past its lease (its lease
// ends while it still believes it holds: here revoked by another client,
// which is what etcd does when it expires) writes after the next holder
// did. Its write is refused, and the resource keeps the next holder's
// value, though the two hold through different sessions.
func TestFencedWriteStaleHolder(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	name := lockName(t)
	fence, data := fenceKeys(t, cli)
	sa := newSession(t, cli)
	a := etcdlock.NewMutex(sa, name)
	require.NoError(t, a.Lock(ctx))
	tokenA := a.Token()
	_, err := cli.Revoke(ctx, sa.Lease())
	require.NoError(t, err)

	b := etcdlock.NewMutex(newSession(t, newClient(t)), name)
	require.NoError(t, b.Lock(ctx))
	require.Greater(t, b.Token(), tokenA)
	resp, err := etcdlock.FencedWrite(ctx, cli, fence, b.Token(), clientv3.OpPut(data, "b"))
	require.NoError(t, err)
	require.Len(t, resp.Responses, 1)
	require.NotNil(t, resp.Responses[0].GetResponsePut())

	require.Equal(t, tokenA, a.Token(), "a still believes it holds")
	_, err = etcdlock.FencedWrite(ctx, cli, fence, tokenA, clientv3.OpPut(data, "a"))
	require.ErrorIs(t, err, etcdlock.ErrStaleToken)
	requireValue(t, cli, data, "b")
	requireValue(t, cli, fence, etcdlock.FenceValue(b.Token()))

	// The same holder writes again with its token, and reads back.
	resp, err = etcdlock.FencedWrite(ctx, cli, fence, b.Token(), clientv3.OpPut(data, "b2"), clientv3.OpGet(data))
	require.NoError(t, err)
	require.Equal(t, "b2", string(resp.Responses[1].GetResponseRange().Kvs[0].Value))
	require.NoError(t, b.Unlock(ctx))
}

// TestFencedWriteOrder: writers with interleaved tokens, at once, on one
// fence: etcd's history of the resource shows only rising tokens, and the
// highest token's write is the last.
func TestFencedWriteOrder(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	fence, data := fenceKeys(t, cli)
	start, err := cli.Get(ctx, data)
	require.NoError(t, err)

	const n = 40
	tokens := rand.Perm(n)
	var wg sync.WaitGroup
	var mu sync.Mutex
	written, stale := 0, 0
	var unexpected []error
	for _, tk := range tokens {
		token := int64(tk + 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := etcdlock.FencedWrite(ctx, cli, fence, token, clientv3.OpPut(data, strconv.FormatInt(token, 10)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				written++
			case errors.Is(err, etcdlock.ErrStaleToken):
				stale++
			default:
				unexpected = append(unexpected, err)
			}
		}()
	}
	wg.Wait()
	require.Empty(t, unexpected)
	require.Equal(t, n, written+stale)
	t.Logf("%d writes landed, %d refused", written, stale)
	requireValue(t, cli, data, strconv.Itoa(n))
	requireValue(t, cli, fence, etcdlock.FenceValue(n))

	// Every write that landed, in etcd's order.
	var seen []int64
	for _, v := range valuesFrom(t, cli, data, start.Header.Revision+1, written) {
		token, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		seen = append(seen, token)
	}
	require.Len(t, seen, written)
	for i := 1; i < len(seen); i++ {
		require.Greater(t, seen[i], seen[i-1], "a lower token landed after a higher one: %v", seen)
	}
	require.Equal(t, int64(n), seen[len(seen)-1])
}

// TestFencedWriteSchedules: a newer holder's write put exactly before a
// stale holder's Txn goes out, and exactly after it was applied but before
// its answer came (lost: the stale holder sends it again). Either way the
// stale write never lands after the newer one: refused, or landed before.
func TestFencedWriteSchedules(t *testing.T) {
	cli := newClient(t)
	for _, tc := range []struct {
		name  string
		after bool // inject after the Txn was applied, and lose its answer
		want  []string
	}{
		{"NewerBefore", false, []string{"new"}},
		{"NewerAfterAnswerLost", true, []string{"old", "new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			fence, data := fenceKeys(t, cli)
			start, err := cli.Get(ctx, data)
			require.NoError(t, err)
			in := new(etcdtest.Injector)
			stale := cluster.Client(t, clientv3.Config{DialOptions: in.DialOptions()})
			newer := func() {
				if _, err := etcdlock.FencedWrite(ctx, cli, fence, 20, clientv3.OpPut(data, "new")); err != nil {
					t.Errorf("newer write: %v", err)
				}
			}
			act := etcdtest.Action{Before: func(etcdtest.RPC) { newer() }}
			if tc.after {
				act = etcdtest.Action{After: func(_ etcdtest.RPC, err error) error {
					require.NoError(t, err)
					newer()
					return errors.New("connection broken: answer lost")
				}}
			}
			fired := in.At(etcdtest.Nth(1, unary), act)
			_, err = etcdlock.FencedWrite(ctx, stale, fence, 10, clientv3.OpPut(data, "old"))
			<-fired
			if tc.after {
				require.ErrorContains(t, err, "answer lost")
				// Sent again, as the doc allows after an unknown outcome.
				_, err = etcdlock.FencedWrite(ctx, stale, fence, 10, clientv3.OpPut(data, "old"))
			}
			require.ErrorIs(t, err, etcdlock.ErrStaleToken)
			requireValue(t, cli, data, "new")
			require.Equal(t, tc.want, valuesFrom(t, cli, data, start.Header.Revision+1, len(tc.want)))
		})
	}
}

// fenceKeys returns a fence key and a data key of the test's own, free,
// and deleted when the test ends: a fence keeps the highest token it saw.
func fenceKeys(t *testing.T, cli *clientv3.Client) (fence, data string) {
	fence, data = lockName(t)+"-fence", lockName(t)+"-data"
	for _, k := range []string{fence, data} {
		_, err := cli.Delete(t.Context(), k)
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, k := range []string{fence, data} {
			if _, err := cli.Delete(context.Background(), k); err != nil {
				t.Errorf("delete %s: %v", k, err)
			}
		}
	})
	return fence, data
}

// valuesFrom returns the first n values key took from revision rev on,
// or fails the test when they do not come within 30s.
func valuesFrom(t *testing.T, cli *clientv3.Client, key string, rev int64, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var vs []string
	for wr := range cli.Watch(ctx, key, clientv3.WithRev(rev)) {
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			vs = append(vs, string(ev.Kv.Value))
		}
		if len(vs) >= n {
			return vs
		}
	}
	t.Fatalf("%s took only %q from revision %d within 30s", key, vs, rev)
	return nil
}

// TestFencedWriteBadInput: what no fence takes.
func TestFencedWriteBadInput(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	_, err := etcdlock.FencedWrite(ctx, cli, "", 1)
	require.ErrorIs(t, err, etcdlock.ErrInvalidName)
	_, err = etcdlock.FencedWrite(ctx, cli, "__etcdlock/x", 1)
	require.ErrorIs(t, err, etcdlock.ErrInvalidName)
	_, err = etcdlock.FencedWrite(ctx, cli, lockName(t), 0)
	require.ErrorContains(t, err, "positive")
	resp, err := cli.Get(ctx, lockName(t))
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "a refused call writes nothing")
}

// requireValue asserts key's value in etcd.
func requireValue(t *testing.T, cli *clientv3.Client, key, want string) {
	t.Helper()
	resp, err := cli.Get(t.Context(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key %s", key)
	require.Equal(t, want, string(resp.Kvs[0].Value), "key %s", key)
}

// TestFencedWriteAcrossLocksByToken: across locks a fence orders writers
// by token, the revision at which each joined its lock's queue, as
// FencedWrite's doc says, not by when they acquired. a queues for lock X
// behind a holder, then b takes lock Y (a later token) and writes; a,
// admitted last, is refused: its token is the older.
func TestFencedWriteAcrossLocksByToken(t *testing.T) {
	cli := newClient(t)
	ctx := t.Context()
	fence, data := fenceKeys(t, cli)
	x, y := lockName(t)+"-x", lockName(t)+"-y"
	holder := etcdlock.NewMutex(newSession(t, cli), x)
	require.NoError(t, holder.Lock(ctx))
	a := startWaiter(ctx, etcdlock.NewMutex(newSession(t, cli), x))
	a.waitIdle(t)
	b := etcdlock.NewMutex(newSession(t, cli), y)
	require.NoError(t, b.Lock(ctx))
	_, err := etcdlock.FencedWrite(ctx, cli, fence, b.Token(), clientv3.OpPut(data, "b"))
	require.NoError(t, err)

	require.NoError(t, holder.Unlock(ctx))
	require.NoError(t, a.result(t, 10*time.Second))
	require.Less(t, a.m.Token(), b.Token(), "a joined X before b joined Y")
	_, err = etcdlock.FencedWrite(ctx, cli, fence, a.m.Token(), clientv3.OpPut(data, "a"))
	require.ErrorIs(t, err, etcdlock.ErrStaleToken, "a acquired after b wrote, but its token is the older")
	requireValue(t, cli, data, "b")
	require.NoError(t, a.m.Unlock(ctx))
	require.NoError(t, b.Unlock(ctx))
}
