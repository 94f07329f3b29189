package etcdlock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// qwaiter is a Lock, RLock or Acquire of any primitive, run in a
// goroutine: the waiter of helpers_test.go for every primitive.
type qwaiter struct {
	idle chan []string // receives the watched keys each time it blocks
	done chan error    // receives the call's result
}

// startQ starts acquire(ctx) in a goroutine; l is the primitive whose
// waits it reports.
func startQ(ctx context.Context, l etcdlock.Hooked, acquire func(context.Context) error) *qwaiter {
	w := &qwaiter{idle: make(chan []string, 64), done: make(chan error, 1)}
	etcdlock.SetTestHookWaitKeys(l, func(keys []string) {
		select {
		case w.idle <- keys:
		default:
		}
	})
	go func() { w.done <- acquire(ctx) }()
	return w
}

// waitIdle waits until w has set up its watches and blocks, and returns
// the keys it watches. It fails if the call returned first.
func (w *qwaiter) waitIdle(t *testing.T) []string {
	t.Helper()
	select {
	case keys := <-w.idle:
		return keys
	case err := <-w.done:
		t.Fatalf("returned %v while it should wait", err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter did not start waiting in 10s")
	}
	return nil
}

// result waits for w's call to return.
func (w *qwaiter) result(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case err := <-w.done:
		return err
	case <-time.After(within):
		t.Fatalf("did not return within %v", within)
	}
	return nil
}

// returned reports whether w's call has returned, and with what.
func (w *qwaiter) returned() (bool, error) {
	select {
	case err := <-w.done:
		w.done <- err
		return true, err
	default:
		return false, nil
	}
}

// assertWaiting asserts w's call has not returned.
func (w *qwaiter) assertWaiting(t *testing.T) {
	t.Helper()
	select {
	case err := <-w.done:
		t.Fatalf("returned %v while it should still wait", err)
	default:
	}
}

// modes returns the direct children of name + "/" in etcd, oldest first,
// and their modes.
func modes(t *testing.T, cli *clientv3.Client, name string) ([]string, []etcdlock.KeyMode) {
	t.Helper()
	resp, err := cli.Get(t.Context(), name+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	require.NoError(t, err)
	var ks []string
	var ms []etcdlock.KeyMode
	for _, kv := range resp.Kvs {
		if rest := string(kv.Key)[len(name)+1:]; rest == "" || strings.Contains(rest, "/") {
			continue
		}
		ks = append(ks, string(kv.Key))
		ms = append(ms, etcdlock.ParseKeyMode(kv.Value))
	}
	return ks, ms
}

// holding returns the keys of name that hold, by etcdlock.Holders.
func holding(t *testing.T, cli *clientv3.Client, name string) []string {
	t.Helper()
	ks, ms := modes(t, cli, name)
	return ks[:etcdlock.Holders(ms)]
}
