package bench

import (
	"context"
	"fmt"
	"time"
)

// IdleResult is what Idle measured of one implementation: the cost of
// keeping idle sessions' leases alive, over a window that begins once
// every session has renewed at least once.
type IdleResult struct {
	Sessions int
	Window   time.Duration
	// Renewals is the number of keepalive requests the clients sent in
	// the window, and Streams the number of keepalive streams they opened.
	Renewals, Streams int64
	// Unary is the number of unary calls the clients made in the window.
	Unary int64
	// ServerCPU is the user+system CPU time of the etcd members in the
	// window, and ServerIdleCPU what they use with no session at all over
	// a window as long (measured just before, without clients); ClientCPU
	// is that of this process (the clients and the sessions).
	ServerCPU, ServerIdleCPU, ClientCPU time.Duration
}

// Add returns the sums of r and o, measured over windows one after the
// other.
func (r IdleResult) Add(o IdleResult) IdleResult {
	return IdleResult{
		Sessions:      max(r.Sessions, o.Sessions),
		Window:        r.Window + o.Window,
		Renewals:      r.Renewals + o.Renewals,
		Streams:       r.Streams + o.Streams,
		Unary:         r.Unary + o.Unary,
		ServerCPU:     r.ServerCPU + o.ServerCPU,
		ServerIdleCPU: r.ServerIdleCPU + o.ServerIdleCPU,
		ClientCPU:     r.ClientCPU + o.ClientCPU,
	}
}

// StreamsPerSecond returns the keepalive streams opened per second.
func (r IdleResult) StreamsPerSecond() float64 { return float64(r.Streams) / r.Window.Seconds() }

// RenewalsPerSecond returns the renewals sent per second.
func (r IdleResult) RenewalsPerSecond() float64 { return float64(r.Renewals) / r.Window.Seconds() }

// perRenewal divides d by the renewals.
func (r IdleResult) perRenewal(d time.Duration) time.Duration {
	if r.Renewals == 0 {
		return 0
	}
	return d / time.Duration(r.Renewals)
}

// ServerCPUPerRenewal returns the members' CPU time per renewal.
func (r IdleResult) ServerCPUPerRenewal() time.Duration { return r.perRenewal(r.ServerCPU) }

// ServerNetCPUPerRenewal returns the members' CPU time per renewal beyond
// what they use idle.
func (r IdleResult) ServerNetCPUPerRenewal() time.Duration {
	return r.perRenewal(max(0, r.ServerCPU-r.ServerIdleCPU))
}

// ClientCPUPerRenewal returns this process's CPU time per renewal.
func (r IdleResult) ClientCPUPerRenewal() time.Duration { return r.perRenewal(r.ClientCPU) }

// Idle opens n sessions of impl with the given lease TTL, spread over
// clients clients, waits until each has renewed its lease at least once
// (a TTL), and measures the renewals over window: how many were sent, the
// keepalive streams opened, and the CPU time of the etcd members and of
// this process. Before the sessions start it measures the members' CPU
// time with nothing to do, over window too.
//
// Idle measures the whole process and the whole cluster: nothing else may
// run on env meanwhile.
func Idle(ctx context.Context, env *Env, impl Impl, n, clients int, ttl, window time.Duration) (IdleResult, error) {
	r := IdleResult{Sessions: n, Window: window}
	s0, err := serverCPU(env)
	if err != nil {
		return r, err
	}
	if err := sleep(ctx, window); err != nil {
		return r, err
	}
	s1, err := serverCPU(env)
	if err != nil {
		return r, err
	}
	r.ServerIdleCPU = s1 - s0

	cs, err := env.newClients(clients, 0)
	if err != nil {
		return r, err
	}
	defer cs.close()
	ss := make([]Session, n)
	errs := make([]error, n)
	forEach(n, func(i int) { ss[i], errs[i] = impl.NewSessionTTL(ctx, cs.clis[i%clients], ttl) })
	defer closeSessions(ss)
	for _, err := range errs {
		if err != nil {
			return r, fmt.Errorf("bench: %s session: %w", impl.Name, err)
		}
	}
	if err := sleep(ctx, ttl); err != nil {
		return r, err
	}

	st0, ren0, un0 := cs.rpcs.keepAlive.Load(), cs.rpcs.renewals.Load(), cs.rpcs.all.Unary()
	c0, err := clientCPU()
	if err != nil {
		return r, err
	}
	s0, err = serverCPU(env)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	if err := sleep(ctx, window); err != nil {
		return r, err
	}
	s1, err = serverCPU(env)
	if err != nil {
		return r, err
	}
	c1, err := clientCPU()
	if err != nil {
		return r, err
	}
	r.Window = time.Since(t0)
	r.Streams = cs.rpcs.keepAlive.Load() - st0
	r.Renewals = cs.rpcs.renewals.Load() - ren0
	r.Unary = cs.rpcs.all.Unary() - un0
	r.ServerCPU, r.ClientCPU = s1-s0, c1-c0
	return r, nil
}

// serverCPU returns the CPU time the running members of env have used.
func serverCPU(env *Env) (time.Duration, error) {
	var sum time.Duration
	for _, pid := range env.ServerPIDs() {
		if pid == 0 {
			continue
		}
		d, err := processCPU(pid)
		if err != nil {
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
