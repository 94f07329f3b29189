package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// serveCostEnv runs TestServeCost, which takes a minute and is a
// measurement, not a check: ETCDLOCK_SERVE_COST=1 go test -run
// TestServeCost -v ./cmd/etcdlock/
const serveCostEnv = "ETCDLOCK_SERVE_COST"

// TestServeCost measures what etcdlock serve costs (issue 40): 10 000
// locks under its prefix, each held (a key bound to a lease), and 1 000
// of them changing every second (a waiter's key joins or leaves); for 20
// seconds, the RPCs per second the etcd member handles for serve, by
// method, serve's CPU and its resident memory, and how long its first
// read of all of them took.
func TestServeCost(t *testing.T) {
	if os.Getenv(serveCostEnv) == "" {
		t.Skipf("a measurement: set %s=1 to run it", serveCostEnv)
	}
	const locks, changesPerSecond, window = 10000, 1000, 20 * time.Second
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	ctx := t.Context()
	lease, err := cli.Grant(ctx, 600)
	require.NoError(t, err)
	prefix := "cost/"
	key := func(i, j int) string { return fmt.Sprintf("%slock%05d/%x", prefix, i, int64(lease.ID)+int64(j)) }
	for i := 0; i < locks; i += 100 {
		var ops []clientv3.Op
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(key(j, 0), "", clientv3.WithLease(lease.ID)))
		}
		_, err := cli.Txn(ctx).Then(ops...).Commit()
		require.NoError(t, err)
	}

	port, err := etcdtest.FreePort()
	require.NoError(t, err)
	started := time.Now()
	p := startProc(t, nil, "serve", "--endpoints="+c.Endpoint(0), "--listen", fmt.Sprintf("127.0.0.1:%d", port), prefix)
	p.stdout.waitFor(t, "serving the locks")
	firstRead := time.Since(started)
	base := fmt.Sprintf("http://127.0.0.1:%d/", port)
	require.Contains(t, get(t, base+"metrics"), fmt.Sprintf("etcdlock_fleet_locks %d\n", locks))

	// 1 000 changes a second: each tick, 100 waiters' keys join or
	// leave, in Txns of 100 operations.
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		next, in := 0, false
		for {
			select {
			case <-lctx.Done():
				return
			case <-tick.C:
			}
			var ops []clientv3.Op
			for n := 0; n < changesPerSecond/10; n++ {
				k := key(next, 1)
				if in {
					ops = append(ops, clientv3.OpDelete(k))
				} else {
					ops = append(ops, clientv3.OpPut(k, "", clientv3.WithLease(lease.ID)))
				}
				if next++; next == locks {
					next, in = 0, !in
				}
			}
			cli.Txn(lctx).Then(ops...).Commit()
		}
	}()
	time.Sleep(2 * time.Second) // in steady state
	rpcs0 := grpcHandled(t, c.Endpoint(0))
	cpu0 := procCPU(t, p.cmd.Process.Pid)
	time.Sleep(window)
	rpcs1 := grpcHandled(t, c.Endpoint(0))
	cpu1 := procCPU(t, p.cmd.Process.Pid)
	rss := procRSS(t, p.cmd.Process.Pid)
	cancel()
	<-loaded

	var total float64
	var methods []string
	for m, n := range rpcs1 {
		d := (n - rpcs0[m]) / window.Seconds()
		if d > 0 {
			methods = append(methods, fmt.Sprintf("%s %.0f/s", m, d))
		}
		total += d
	}
	t.Logf("serve over %d locks, %d changes a second, for %v:", locks, changesPerSecond, window)
	t.Logf("  first read of every lock: %v", firstRead.Round(time.Millisecond))
	t.Logf("  etcd RPCs handled: %.0f/s (%s; the load's own Txns: 10/s)", total, strings.Join(methods, ", "))
	t.Logf("  serve's CPU: %.0f%% of a core; resident memory: %d MiB", 100*(cpu1-cpu0).Seconds()/window.Seconds(), rss>>20)
}

// grpcHandled reads grpc_server_handled_total of the member at ep, summed
// by method.
func grpcHandled(t *testing.T, ep string) map[string]float64 {
	return grpcCounter(t, ep, "grpc_server_handled_total")
}

// grpcCounter reads the counter metric (one of gRPC's, labelled by
// grpc_method) of the member at ep, summed by method.
func grpcCounter(t *testing.T, ep, metric string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(ep + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		i := strings.Index(line, `grpc_method="`)
		j := strings.LastIndexByte(line, ' ')
		if i < 0 || j < 0 {
			continue
		}
		m := line[i+len(`grpc_method="`):]
		m = m[:strings.IndexByte(m, '"')]
		v, err := strconv.ParseFloat(line[j+1:], 64)
		require.NoError(t, err)
		out[m] += v
	}
	require.NoError(t, sc.Err())
	return out
}

// procCPU is the user+system CPU time of process pid, from /proc.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err)
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+1:])
	u, err := strconv.ParseInt(f[11], 10, 64)
	require.NoError(t, err)
	s, err := strconv.ParseInt(f[12], 10, 64)
	require.NoError(t, err)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// procRSS is the resident memory of process pid in bytes, from /proc.
func procRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
