// Package etcdtest starts real embedded etcd clusters (one member or three)
// on loopback for etcdlock's tests, examples, benchmarks and demo. Nothing in
// it is a mock: every member is go.etcd.io/etcd/server/v3/embed with fsync on.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Cluster is a running embedded etcd cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	dir string

	mu      sync.Mutex // guards members
	members []*member
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// Start starts an n-member cluster in a directory of t.TempDir and stops it
// in t.Cleanup. It fails the test if the cluster does not come up.
func Start(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := StartDir(tb.TempDir(), n)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// StartDir starts an n-member cluster whose data lives under dir. The caller
// must call Close. It is for TestMain and commands, which have no testing.TB.
func StartDir(dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdtest: %d members", n)
	}
	c := &Cluster{dir: dir}
	var initial []string
	for i := range n {
		cport, err := freePort()
		if err != nil {
			return nil, err
		}
		pport, err := freePort()
		if err != nil {
			return nil, err
		}
		m := &member{
			name:      fmt.Sprintf("m%d", i),
			dir:       filepath.Join(dir, fmt.Sprintf("m%d", i)),
			clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)},
			peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)},
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	cluster := strings.Join(initial, ",")
	// All members must start concurrently: a member of a multi-member
	// cluster is not ready until a quorum has joined.
	errc := make(chan error, n)
	for _, m := range c.members {
		go func() { errc <- c.startMember(m, cluster, embed.ClusterStateFlagNew) }()
	}
	var errs []error
	for range n {
		errs = append(errs, <-errc)
	}
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startMember(m *member, cluster, state string) error {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = cluster
	cfg.InitialClusterToken = "etcdlock-test"
	cfg.ClusterState = state
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// Short elections keep leader-loss tests in seconds.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start member %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("member %s: %w", m.name, err)
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("member %s did not become ready in 30s", m.name)
	}
	c.mu.Lock()
	m.etcd = e
	c.mu.Unlock()
	return nil
}

// Close stops every member and removes nothing: data directories belong to
// the caller (t.TempDir removes its own).
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.etcd != nil {
			m.etcd.Close()
			m.etcd = nil
		}
	}
}

// Endpoints returns the client URLs of all members, running or not.
func (c *Cluster) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL.String()
	}
	return eps
}

// Endpoint returns the client URL of member i.
func (c *Cluster) Endpoint(i int) string { return c.Endpoints()[i] }

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Leader returns the index of the member that currently believes it leads,
// or -1 if none does.
func (c *Cluster) Leader() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range c.members {
		if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() {
			return i
		}
	}
	return -1
}

// StopMember stops member i; its data directory is kept for RestartMember.
func (c *Cluster) StopMember(i int) {
	c.mu.Lock()
	m := c.members[i]
	e := m.etcd
	m.etcd = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// RestartMember restarts a member stopped by StopMember.
func (c *Cluster) RestartMember(i int) error {
	c.mu.Lock()
	var initial []string
	for _, m := range c.members {
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	m := c.members[i]
	c.mu.Unlock()
	return c.startMember(m, strings.Join(initial, ","), embed.ClusterStateFlagExisting)
}

// Server returns member i's embedded etcd, or nil while it is stopped.
func (c *Cluster) Server(i int) *embed.Etcd {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].etcd
}

// NewClient returns a client of all members. The caller closes it.
func (c *Cluster) NewClient(cfg clientv3.Config) (*clientv3.Client, error) {
	if len(cfg.Endpoints) == 0 {
		cfg.Endpoints = c.Endpoints()
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return clientv3.New(cfg)
}

// Client returns a client of all members (or of cfg's endpoints when set),
// closed in t.Cleanup.
func (c *Cluster) Client(tb testing.TB, cfgs ...clientv3.Config) *clientv3.Client {
	tb.Helper()
	var cfg clientv3.Config
	if len(cfgs) > 0 {
		cfg = cfgs[0]
	}
	cli, err := c.NewClient(cfg)
	if err != nil {
		tb.Fatalf("etcdtest: client: %v", err)
	}
	tb.Cleanup(func() { cli.Close() })
	return cli
}

// EnableAuth creates the root user with rootPassword, grants it the root
// role and turns authentication on.
func EnableAuth(ctx context.Context, cli *clientv3.Client, rootPassword string) error {
	if _, err := cli.UserAdd(ctx, "root", rootPassword); err != nil {
		return err
	}
	if _, err := cli.RoleAdd(ctx, "root"); err != nil {
		return err
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return err
	}
	_, err := cli.AuthEnable(ctx)
	return err
}

// freePort asks the kernel for a free loopback port. Another process could
// take it before etcd binds it; on loopback in a test that is rare enough.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// MkdirTemp makes a temporary directory for StartDir; remove it with
// os.RemoveAll when done.
func MkdirTemp() (string, error) { return os.MkdirTemp("", "etcdlock-etcd-") }

// RPCCounter counts the gRPC calls a client makes: unary calls, and streams
// opened (a watch or keepalive stream counts once however many messages it
// carries). Pass DialOptions in clientv3.Config.DialOptions.
type RPCCounter struct {
	unary   atomic.Int64
	streams atomic.Int64
}

// DialOptions returns the interceptors that count.
func (c *RPCCounter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.unary.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.streams.Add(1)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// Unary returns the number of unary calls so far.
func (c *RPCCounter) Unary() int64 { return c.unary.Load() }

// Streams returns the number of streams opened so far.
func (c *RPCCounter) Streams() int64 { return c.streams.Load() }

// Total returns unary calls plus streams opened.
func (c *RPCCounter) Total() int64 { return c.Unary() + c.Streams() }
