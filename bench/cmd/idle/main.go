// Command idle measures what idle sessions cost to keep alive, for this
// library's Session and etcd's concurrency.Session on one etcd (server
// processes): the lease keepalive streams opened per second, and the CPU
// time per renewal of the etcd members and of the clients.
//
//	go run ./bench/cmd/idle -sessions 100,1000 -ttl 6s -window 20s
//
// Flags:
//
//	-sessions list  numbers of sessions, comma-separated (default 100,1000)
//	-clients n      clients the sessions are spread over (default 4)
//	-ttl d          lease TTL (default 6s)
//	-window d       how long each run is measured (default 20s)
//	-members n      members of the etcd cluster: 1 or 3 (default 1)
//
// Each run first measures the members with no session, over the window,
// then starts the sessions, waits a TTL, and measures. "server net" is
// the members' CPU time beyond that idle baseline. CPU times count in
// 10ms ticks on the server side: the longer the window, the finer.
//
// The command exits 1 if a run fails or goroutines are left behind.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/etcdlock/etcdlock/bench"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/etcdlock/etcdlock/internal/leakcheck"
	"go.uber.org/goleak"
)

func main() {
	sessions := flag.String("sessions", "100,1000", "numbers of sessions, comma-separated")
	clients := flag.Int("clients", 4, "clients the sessions are spread over")
	ttl := flag.Duration("ttl", 6*time.Second, "lease TTL")
	window := flag.Duration("window", 20*time.Second, "how long each run is measured")
	members := flag.Int("members", 1, "members of the etcd cluster: 1 or 3")
	flag.Parse()
	if err := run(*sessions, *clients, *ttl, *window, *members); err != nil {
		fmt.Fprintln(os.Stderr, "idle:", err)
		os.Exit(1)
	}
}

func run(sessions string, clients int, ttl, window time.Duration, members int) error {
	var ns []int
	for _, f := range strings.Split(sessions, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-sessions %q: want positive numbers", sessions)
		}
		ns = append(ns, n)
	}
	if clients < 1 || ttl < time.Second || window <= 0 || (members != 1 && members != 3) {
		return fmt.Errorf("want -clients >= 1, -ttl >= 1s, -window > 0, -members 1 or 3")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	before := goleak.IgnoreCurrent()

	results, version, err := measure(ctx, ns, clients, ttl, window, members)
	if err != nil {
		return err
	}
	fmt.Printf("idle sessions: etcd %s, %d member(s), %d clients, TTL %v, window %v\n\n", version, members, clients, ttl, window)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "sessions\timpl\trenewals/s\tstreams/s\tunary/s\tserver CPU/renewal\tserver net/renewal\tclient CPU/renewal\t")
	for i, n := range ns {
		for _, r := range results[i] {
			fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.2f\t%.2f\t%v\t%v\t%v\t\n", n, r.impl, r.RenewalsPerSecond(), r.StreamsPerSecond(),
				float64(r.Unary)/r.Window.Seconds(), r.ServerCPUPerRenewal(), r.ServerNetCPUPerRenewal(), r.ClientCPUPerRenewal())
		}
		ours, theirs := results[i][0], results[i][1]
		fmt.Fprintf(tw, "%d\tours/etcd\t\t\t\t%.2f\t%.2f\t%.2f\t\n", n,
			ratio(ours.ServerCPUPerRenewal(), theirs.ServerCPUPerRenewal()),
			ratio(ours.ServerNetCPUPerRenewal(), theirs.ServerNetCPUPerRenewal()),
			ratio(ours.ClientCPUPerRenewal(), theirs.ClientCPUPerRenewal()))
	}
	tw.Flush()
	return leakcheck.Find(before)
}

type result struct {
	impl string
	bench.IdleResult
}

func measure(ctx context.Context, ns []int, clients int, ttl, window time.Duration, members int) ([][]result, string, error) {
	dir, err := etcdtest.MkdirTemp()
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	env, err := bench.NewEnv(filepath.Join(dir, "idle"), members)
	if err != nil {
		return nil, "", err
	}
	defer env.Close()
	results := make([][]result, len(ns))
	for i, n := range ns {
		for _, impl := range bench.Impls {
			fmt.Fprintf(os.Stderr, "%d sessions of %s...\n", n, impl.Name)
			r, err := bench.Idle(ctx, env, impl, n, clients, ttl, window)
			if err != nil {
				return nil, "", err
			}
			results[i] = append(results[i], result{impl.Name, r})
		}
	}
	return results, env.ServerVersion(), nil
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
