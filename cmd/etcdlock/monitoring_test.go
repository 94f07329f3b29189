package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockprom"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

// monitoringDir holds the repository's alert rules and dashboard.
const monitoringDir = "../../monitoring/"

// TestAlertRules (issue 40): the alert rules are valid, and their unit
// tests pass, with Debian's promtool.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool := toolBinary(t, "promtool", "ETCDLOCK_TEST_PROMTOOL", "ETCDLOCK_TEST_REQUIRE_PROMETHEUS", "Debian's prometheus package has one")
	for _, args := range [][]string{
		{"check", "rules", "etcdlock-alerts.yml"},
		{"test", "rules", "etcdlock-alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = monitoringDir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
		require.Contains(t, string(out), "SUCCESS", "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// dashboardQueries returns every query of the dashboard, with Grafana's
// interval variables given values fit for a scrape every second.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(monitoringDir + "etcdlock-dashboard.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	var qs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			q := strings.NewReplacer("$__rate_interval", "20s", "$__interval", "5s", "$__range", "1m").Replace(tg.Expr)
			require.NotContains(t, q, "$", "%s: a variable the test does not give a value", p.Title)
			qs = append(qs, q)
		}
	}
	require.NotEmpty(t, qs)
	return qs
}

// TestDashboardQueries (issue 40): every query of the dashboard, run
// against a real Prometheus that scrapes a process with etcdlockprom's
// metrics (locking and unlocking in a loop, one hold lost) and an
// etcdlock serve, returns data: at least one series, with a number.
func TestDashboardQueries(t *testing.T) {
	t.Parallel()
	queries := dashboardQueries(t)
	cli := newClient(t)
	prefix := lockName(t) + "/"

	// This process: its locks' metrics on a port of its own.
	reg := prometheus.NewPedanticRegistry()
	m := etcdlockprom.New(etcdlockprom.Options{})
	reg.MustRegister(m)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	// A TTL of 3s renews every second: renewals in every 20s window.
	s, err := etcdlock.NewSession(t.Context(), cli, etcdlock.WithTTL(3*time.Second), etcdlock.WithHooks(m.Hooks()))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	lost := etcdlock.NewMutex(s, prefix+"lost")
	require.NoError(t, lost.Lock(t.Context()))
	require.NoError(t, etcdlock.Evict(t.Context(), cli, prefix+"lost", lost.Key(), lost.Token()))
	require.ErrorIs(t, lost.Unlock(t.Context()), etcdlock.ErrLockLost)
	held := etcdlock.NewMutex(s, prefix+"held")
	require.NoError(t, held.Lock(t.Context()))
	startWaiter(t, cli, prefix+"held")
	ctx, cancel := context.WithCancel(context.Background())
	looped := make(chan struct{})
	go func() {
		defer close(looped)
		for ctx.Err() == nil {
			mu := etcdlock.NewMutex(s, prefix+"loop")
			if mu.Lock(ctx) == nil {
				mu.Unlock(ctx)
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-looped })

	base, _ := startServe(t, prefix)
	serveTarget := strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/")
	prom := startPrometheus(t, serveTarget, fmt.Sprintf("  - job_name: app\n    static_configs:\n      - targets: [%q]\n", ln.Addr().String()))
	for _, q := range queries {
		eventually(t, q, func() (bool, string) {
			r := query(t, prom, q)
			for _, s := range r.Data.Result {
				if v, err := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64); err == nil && !math.IsNaN(v) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%+v", r.Data.Result)
		})
	}
}
