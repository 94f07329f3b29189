// Package etcdtest starts real etcd clusters (one member or three) on
// loopback for etcdlock's tests, examples and benchmarks. Nothing in it is a
// mock: every member is an etcd server process, started from the binary
// that Binary names, with fsync on.
//
// Members run as processes rather than embedded so that the library's own
// module never requires go.etcd.io/etcd/server/v3 (which would raise its
// users' minimum etcd client version), and so that the same tests run
// against any etcd release: see Binary.
package etcdtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Cluster is a running etcd cluster of server processes. Its methods are
// safe for concurrent use.
type Cluster struct {
	dir     string
	bin     string
	version string   // the server's version, as "3.7.3"
	flags   []string // given to every member after the usual ones (StartFlags)

	mu      sync.Mutex // guards members
	members []*member
}

type member struct {
	name      string
	dir       string
	clientURL url.URL
	peerURL   url.URL
	proc      *process // nil while stopped
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

// StartFlags is Start with flags given to every member's etcd after the
// usual ones, such as "--auth-token-ttl=1".
func StartFlags(tb testing.TB, n int, flags ...string) *Cluster {
	tb.Helper()
	c, err := startDir(tb.TempDir(), n, flags)
	if err != nil {
		tb.Fatalf("etcdtest: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// StartDir starts an n-member cluster whose data lives under dir. The caller
// must call Close. It is for TestMain and commands, which have no testing.TB.
func StartDir(dir string, n int) (*Cluster, error) { return startDir(dir, n, nil) }

func startDir(dir string, n int, flags []string) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdtest: %d members", n)
	}
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	version, err := binaryVersion(bin)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("etcdtest: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, version: version, flags: flags}
	var initial []string
	for i := range n {
		cport, err := FreePort()
		if err != nil {
			return nil, err
		}
		pport, err := FreePort()
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
		go func() { errc <- c.startMember(m, cluster, "new") }()
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
	args := []string{
		"--name=" + m.name,
		"--data-dir=" + m.dir,
		"--listen-client-urls=" + m.clientURL.String(),
		"--advertise-client-urls=" + m.clientURL.String(),
		"--listen-peer-urls=" + m.peerURL.String(),
		"--initial-advertise-peer-urls=" + m.peerURL.String(),
		"--initial-cluster=" + cluster,
		"--initial-cluster-token=etcdlock-test",
		"--initial-cluster-state=" + state,
		// Short elections keep leader-loss tests in seconds.
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--log-level=error",
	}
	if strings.HasPrefix(c.version, "3.4.") {
		args = append(args, "--logger=zap") // 3.4 defaults to capnslog, which ignores --log-level
	}
	args = append(args, c.flags...)
	p, err := startProcess(c.bin, args, filepath.Join(filepath.Dir(m.dir), m.name+".log"))
	if err != nil {
		return fmt.Errorf("start member %s: %w", m.name, err)
	}
	if err := waitReady(p, m.clientURL.String(), 30*time.Second); err != nil {
		p.kill()
		return fmt.Errorf("member %s (etcd %s): %w%s", m.name, c.version, err, p.logTail())
	}
	c.mu.Lock()
	m.proc = p
	c.mu.Unlock()
	return nil
}

// waitReady waits until the member at ep has a leader and serves a
// linearizable read, or its process exits, or timeout passes.
func waitReady(p *process, ep string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(rctx, ep)
		if err == nil && st.Leader != 0 {
			_, err = cli.Get(rctx, "etcdtest-ready")
		}
		rcancel()
		if err == nil && st.Leader != 0 {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("etcd exited: %v", p.err)
		case <-ctx.Done():
			return fmt.Errorf("not ready in %v: %v", timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Close stops every member and removes nothing: data directories belong to
// the caller (t.TempDir removes its own). Members are killed, not stopped
// gracefully: their data is thrown away.
func (c *Cluster) Close() {
	c.mu.Lock()
	procs := make([]*process, 0, len(c.members))
	for _, m := range c.members {
		if m.proc != nil {
			procs = append(procs, m.proc)
			m.proc = nil
		}
	}
	c.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
}

// Version returns the etcd server's version, such as "3.7.3".
func (c *Cluster) Version() string { return c.version }

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

// PIDs returns the process ID of each member, 0 for a member that is
// stopped: for reading a member's CPU time, for instance.
func (c *Cluster) PIDs() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	pids := make([]int, len(c.members))
	for i, m := range c.members {
		if m.proc != nil {
			pids[i] = m.proc.cmd.Process.Pid
		}
	}
	return pids
}

// Endpoint returns the client URL of member i.
func (c *Cluster) Endpoint(i int) string { return c.Endpoints()[i] }

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Leader returns the index of the running member that the running members
// agree leads, or -1 if there is none right now.
func (c *Cluster) Leader() int {
	eps := c.runningEndpoints()
	if len(eps) == 0 {
		return -1
	}
	cli, err := c.NewClient(clientv3.Config{Endpoints: eps})
	if err != nil {
		return -1
	}
	defer cli.Close()
	for i, ep := range c.Endpoints() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return i
		}
	}
	return -1
}

// MoveLeader makes member i etcd's leader, as an operator's
// `etcdctl move-leader` does: the leader hands its leadership over, and
// requests in flight meanwhile may fail with "leader changed" or
// "proposal dropped". It returns once member i leads, or the error.
func (c *Cluster) MoveLeader(ctx context.Context, i int) error {
	eps := c.runningEndpoints()
	if len(eps) == 0 {
		return errors.New("etcdtest: no member running")
	}
	cli, err := c.NewClient(clientv3.Config{Endpoints: eps})
	if err != nil {
		return err
	}
	defer cli.Close()
	to, err := cli.Status(ctx, c.Endpoint(i))
	if err != nil {
		return err
	}
	for _, ep := range eps {
		st, err := cli.Status(ctx, ep)
		if err != nil || st.Leader != st.Header.MemberId {
			continue
		}
		if st.Leader == to.Header.MemberId {
			return nil // i leads already
		}
		// The request must reach the leader itself.
		lcli, err := c.NewClient(clientv3.Config{Endpoints: []string{ep}})
		if err != nil {
			return err
		}
		defer lcli.Close()
		_, err = lcli.MoveLeader(ctx, to.Header.MemberId)
		return err
	}
	return errors.New("etcdtest: no leader to move")
}

func (c *Cluster) runningEndpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var eps []string
	for _, m := range c.members {
		if m.proc != nil {
			eps = append(eps, m.clientURL.String())
		}
	}
	return eps
}

// StopMember stops member i gracefully (SIGTERM: a leader hands over its
// leadership first); its data directory is kept for RestartMember.
func (c *Cluster) StopMember(i int) { c.takeProc(i).stop() }

// KillMember kills member i with SIGKILL, as a crash would; its data
// directory is kept for RestartMember.
func (c *Cluster) KillMember(i int) { c.takeProc(i).kill() }

func (c *Cluster) takeProc(i int) *process {
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.members[i].proc
	c.members[i].proc = nil
	return p
}

// RestartMember restarts a member stopped by StopMember or KillMember.
func (c *Cluster) RestartMember(i int) error {
	c.mu.Lock()
	var initial []string
	for _, m := range c.members {
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	m := c.members[i]
	c.mu.Unlock()
	return c.startMember(m, strings.Join(initial, ","), "existing")
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

// A Grant is what a role may do under a prefix.
type Grant struct {
	Prefix string
	Perm   clientv3.PermissionType
}

// AddUser creates role with grants and user with password in it, through
// root (a client allowed to, before EnableAuth).
func AddUser(ctx context.Context, root *clientv3.Client, user, password, role string, grants ...Grant) error {
	if _, err := root.RoleAdd(ctx, role); err != nil {
		return err
	}
	for _, g := range grants {
		if _, err := root.RoleGrantPermission(ctx, role, g.Prefix, clientv3.GetPrefixRangeEnd(g.Prefix), g.Perm); err != nil {
			return err
		}
	}
	if _, err := root.UserAdd(ctx, user, password); err != nil {
		return err
	}
	_, err := root.UserGrantRole(ctx, user, role)
	return err
}

// FreePort returns a port, free now on every address, that this process
// has not returned before. The caller (etcd, a proxy) binds it a moment
// later, so the port must not be taken meanwhile: ports come from below
// the kernel's ephemeral range (32768 and up on Linux), from which the
// kernel picks the port of every bind to port 0 and of every outgoing
// connection. From the kernel, a port freed a moment ago came back within
// 20 binds once in 250, and the clients and proxies of tests that run in
// parallel bind and connect all the time. Only another process that picks
// ports this way could take it (CI runs four test binaries side by side),
// and from it a test binary claims each port with a lock file (claimPort): an etcd
// member binds its ports only once started, seconds later under load,
// and a check by listening alone let another process hand the same port
// out meanwhile.
func FreePort() (int, error) {
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.given == nil {
		ports.given = make(map[int]bool)
	}
	for range 4 * (portsTo - portsFrom) {
		p := portsFrom + rand.IntN(portsTo-portsFrom)
		// Only test binaries claim ports: the etcdlock demo picks its two
		// alone, and leaves no file behind.
		if ports.given[p] || testing.Testing() && !claimPort(p) {
			continue
		}
		ports.given[p] = true // claimed for good, used or not
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err == nil {
			l.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("etcdtest: no free port in %d-%d", portsFrom, portsTo-1)
}

// FreePort's ports: [portsFrom, portsTo), below the ephemeral range.
const portsFrom, portsTo = 20000, 32768

// ports is FreePort's state.
var ports struct {
	mu    sync.Mutex
	given map[int]bool // the ports returned so far
}

// MkdirTemp makes a temporary directory for StartDir; remove it with
// os.RemoveAll when done.
func MkdirTemp() (string, error) { return os.MkdirTemp("", "etcdlock-etcd-") }

// process is one running etcd server process.
type process struct {
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{} // closed when the process has exited
	err     error         // Wait's result; set before exited is closed
}

func startProcess(bin string, args []string, logPath string) (*process, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &process{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// stop asks the process to exit (SIGTERM) and waits; after 10s it kills it.
func (p *process) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.kill()
	}
}

// kill kills the process (SIGKILL) and waits for it.
func (p *process) kill() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// logTail returns the end of the process's log, for an error message.
func (p *process) logTail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "\netcd's log ends:\n" + string(bytes.TrimSpace(b))
}

// RPCCounter counts the gRPC calls a client makes: unary calls, and streams
// opened (a watch or keepalive stream counts once however many messages it
// carries). Pass DialOptions in clientv3.Config.DialOptions.
type RPCCounter struct {
	unary   atomic.Int64
	streams atomic.Int64

	mu      sync.Mutex
	methods []string // of the unary calls, in order
}

// DialOptions returns the interceptors that count.
func (c *RPCCounter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			call := method
			if serializableTxn(req) {
				call += " serializable"
			}
			c.mu.Lock()
			c.unary.Add(1)
			c.methods = append(c.methods, call)
			c.mu.Unlock()
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

// UnaryMethods returns the methods of the unary calls from the from-th on
// (from a number Unary returned), in order: what a test that counts calls
// prints when the count is off. A Txn whose reads are all serializable
// says so: "/etcdserverpb.KV/Txn serializable".
func (c *RPCCounter) UnaryMethods(from int64) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if from >= int64(len(c.methods)) {
		return nil
	}
	return slices.Clone(c.methods[from:])
}

// Reads returns how many reads the unary calls from the from-th on made
// (from a number Unary returned), counting as one a serializable Txn and
// the linearizable Txn right after it. That pair is one read: a waiter
// that reads at least a revision it has seen (a watch event's) asks any
// member first, serializable, and asks again, linearizable, when that
// member has not applied the revision yet, as a loaded etcd can answer
// right after it sent the event (it notifies watchers before it ends the
// write transaction).
func (c *RPCCounter) Reads(from int64) int64 {
	ms := c.UnaryMethods(from)
	n := int64(0)
	for i := 0; i < len(ms); i++ {
		if ms[i] == txnMethod+" serializable" && i+1 < len(ms) && ms[i+1] == txnMethod {
			i++
		}
		n++
	}
	return n
}

const txnMethod = "/etcdserverpb.KV/Txn"

// serializableTxn reports whether req is a Txn whose every read is
// serializable.
func serializableTxn(req any) bool {
	txn, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	reads := 0
	for _, op := range append(txn.Success, txn.Failure...) {
		if r := op.GetRequestRange(); r != nil {
			if !r.Serializable {
				return false
			}
			reads++
		}
	}
	return reads > 0
}

// Streams returns the number of streams opened so far.
func (c *RPCCounter) Streams() int64 { return c.streams.Load() }

// Total returns unary calls plus streams opened.
func (c *RPCCounter) Total() int64 { return c.Unary() + c.Streams() }
