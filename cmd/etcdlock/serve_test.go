package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// startServe starts 'etcdlock serve PREFIX' on a free port and returns
// its base URL once it serves.
func startServe(t *testing.T, prefix string) (string, *proc) {
	t.Helper()
	port, err := etcdtest.FreePort()
	require.NoError(t, err)
	p := startProc(t, nil, "serve", ep(), "--listen", fmt.Sprintf("127.0.0.1:%d", port), prefix)
	line := p.stdout.waitFor(t, "serving the locks")
	m := regexp.MustCompile(`on (http://\S+/) `).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	return m[1], p
}

// get returns the body of url, which must answer 200.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", url, b)
	return string(b)
}

// eventually polls cond every 20ms until it holds, or fails the test
// after procTimeout with what cond said last.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v; last: %s", what, procTimeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fleetOf reads serve's /state.
func fleetOf(t *testing.T, base string) fleetState {
	t.Helper()
	var st fleetState
	require.NoError(t, json.Unmarshal([]byte(get(t, base+"state")), &st))
	return st
}

// lockIn returns the lock called name of st, or nil.
func lockIn(st fleetState, name string) *fleetLock {
	for _, lk := range st.Locks {
		if lk.Name == name {
			return lk
		}
	}
	return nil
}

// TestServe (issue 40): serve follows every lock under its prefix: its
// state and metrics show a holder, then a waiter, then the waiter holding
// after the handover, then the lock gone; a lock outside the prefix is
// never shown.
func TestServe(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	prefix := lockName(t) + "/"
	name := prefix + "jobs/a"
	holdLock(t, cli, lockName(t)+"-outside/x")
	base, p := startServe(t, prefix)

	first, _ := holdLock(t, cli, name)
	eventually(t, "the holder shown", func() (bool, string) {
		lk := lockIn(fleetOf(t, base), name)
		return lk != nil && lk.Holder != nil && lk.Holder.Key == first.Key(), fmt.Sprintf("%+v", lk)
	})
	w := startWaiter(t, cli, name)
	eventually(t, "the waiter shown", func() (bool, string) {
		lk := lockIn(fleetOf(t, base), name)
		return lk != nil && len(lk.Waiters) == 1 && lk.Waiters[0].Key == w.m.Key(), fmt.Sprintf("%+v", lk)
	})
	metrics := get(t, base+"metrics")
	for _, line := range []string{
		fmt.Sprintf("etcdlock_fleet_holders{name=%q} 1\n", name),
		fmt.Sprintf("etcdlock_fleet_waiters{name=%q} 1\n", name),
		fmt.Sprintf("etcdlock_fleet_pending_delays{name=%q} 0\n", name),
		fmt.Sprintf("etcdlock_fleet_release_requests{name=%q} 0\n", name),
		"etcdlock_fleet_locks 1\n",
	} {
		require.Contains(t, metrics, line)
	}
	require.Regexp(t, regexp.MustCompile(`etcdlock_fleet_hold_age_seconds\{name="`+regexp.QuoteMeta(name)+`"\} [0-9.e+-]+\n`), metrics)
	require.NotContains(t, metrics, "-outside", "only the prefix's locks")

	// The holder asked, then released: the waiter holds.
	require.NoError(t, etcdlock.RequestRelease(t.Context(), cli, name))
	eventually(t, "the request shown", func() (bool, string) {
		m := get(t, base+"metrics")
		return strings.Contains(m, fmt.Sprintf("etcdlock_fleet_release_requests{name=%q} 1\n", name)), m
	})
	require.NoError(t, first.Unlock(t.Context()))
	select {
	case <-w.finished:
	case <-time.After(procTimeout):
		t.Fatal("the waiter did not get the lock")
	}
	require.NoError(t, w.err)
	eventually(t, "the handover shown", func() (bool, string) {
		lk := lockIn(fleetOf(t, base), name)
		return lk != nil && lk.Holder != nil && lk.Holder.Key == w.m.Key() && len(lk.Waiters) == 0, fmt.Sprintf("%+v", lk)
	})
	w.unlock(t)
	eventually(t, "the lock gone", func() (bool, string) {
		st := fleetOf(t, base)
		return lockIn(st, name) == nil && len(st.Locks) == 0, fmt.Sprintf("%+v", st)
	})
	require.Contains(t, get(t, base+"metrics"), "etcdlock_fleet_locks 0\n")
	require.NoError(t, p.cmd.Process.Signal(os.Interrupt))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// prometheusBinary returns the prometheus the tests run (ETCDLOCK_TEST_PROMETHEUS,
// else prometheus on PATH), or skips the test; with
// ETCDLOCK_TEST_REQUIRE_PROMETHEUS set (CI sets it), a missing one fails.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	return toolBinary(t, "prometheus", "ETCDLOCK_TEST_PROMETHEUS", "ETCDLOCK_TEST_REQUIRE_PROMETHEUS", "Debian's prometheus package has one")
}

// toolBinary returns the path of the tool name: env's value, else name
// on PATH; it skips the test when there is none, or fails it when the
// variable require is set.
func toolBinary(t *testing.T, name, env, require, where string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv(require) != "" {
			t.Fatalf("no %s (set %s, or put it on PATH): %v", name, env, err)
		}
		t.Skipf("no %s (set %s, or put it on PATH; %s)", name, env, where)
	}
	return p
}

// startPrometheus starts a Prometheus server that scrapes target (host:port)
// every second, with config extra appended (rule_files, say), and returns
// its base URL once it is ready.
func startPrometheus(t *testing.T, target string, extra string) string {
	t.Helper()
	bin := prometheusBinary(t)
	dir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: etcdlock\n    static_configs:\n      - targets: [%q]\n%s", target, extra)
	require.NoError(t, os.WriteFile(dir+"/prometheus.yml", []byte(cfg), 0o644))
	port, err := etcdtest.FreePort()
	require.NoError(t, err)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.Command(bin, "--config.file="+dir+"/prometheus.yml", "--storage.tsdb.path="+dir+"/data", "--web.listen-address="+addr)
	out, err := os.Create(dir + "/prometheus.log")
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(dir + "/prometheus.log")
			t.Logf("prometheus's log:\n%s", b)
		}
	})
	base := "http://" + addr + "/"
	eventually(t, "prometheus ready", func() (bool, string) {
		resp, err := http.Get(base + "-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return base
}

// promResult is the answer of Prometheus's query API.
type promResult struct {
	Status string `json:"status"`
	Data   struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	} `json:"data"`
	Error string `json:"error"`
}

// query runs an instant query on the Prometheus at base.
func query(t *testing.T, base, q string) promResult {
	t.Helper()
	var r promResult
	require.NoError(t, json.Unmarshal([]byte(get(t, base+"api/v1/query?query="+url.QueryEscape(q))), &r))
	require.Equal(t, "success", r.Status, r.Error)
	return r
}

// TestServeScrapedByPrometheus (issue 40): Debian's prometheus scrapes
// serve, and the fleet's series come back from its query API as they are:
// a lock held with a waiter.
func TestServeScrapedByPrometheus(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	prefix := lockName(t) + "/"
	name := prefix + "backup"
	holdLock(t, cli, name)
	startWaiter(t, cli, name)
	base, _ := startServe(t, prefix)
	prom := startPrometheus(t, strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/"), "")
	for q, want := range map[string]string{
		fmt.Sprintf(`etcdlock_fleet_holders{name=%q}`, name): "1",
		fmt.Sprintf(`etcdlock_fleet_waiters{name=%q}`, name): "1",
		`etcdlock_fleet_locks`:                               "1",
	} {
		eventually(t, q, func() (bool, string) {
			r := query(t, prom, q)
			return len(r.Data.Result) == 1 && r.Data.Result[0].Value[1] == want, fmt.Sprintf("%+v", r.Data.Result)
		})
	}
}
