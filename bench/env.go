package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// An Env is a running etcd cluster and what the scenarios need
// around it. It is safe for concurrent use, but scenarios sharing an Env
// should run one at a time: they measure the whole process.
type Env struct {
	cluster *etcdtest.Cluster
	obs     *clientv3.Client // uncounted: reads revisions and polls the queue
	seq     atomic.Int64     // makes lock names unique

	// hold, if set, is what the contention scenarios' holders do inside
	// the critical section instead of yielding. Only tests set it: those
	// that check a scenario fails a broken lock keep holders inside until
	// an intruder is caught, so that catching it is not left to chance.
	hold func(context.Context) error
}

// NewEnv starts an etcd cluster of the given number of members,
// with its data under dir (fsync on, as etcdtest always has it). The caller
// must call Close.
//
// The members serve Go's profiling endpoints (etcd's --enable-pprof), so
// that the scenarios that read a member's heap can collect its garbage
// first; see serverSnapshot.
func NewEnv(dir string, members int) (*Env, error) {
	c, err := startWithPprof(dir, members)
	if err != nil {
		return nil, err
	}
	obs, err := c.NewClient(clientv3.Config{})
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("bench: observer client: %w", err)
	}
	return &Env{cluster: c, obs: obs}, nil
}

// pprofEnv is the environment variable that sets etcd's --enable-pprof:
// etcd reads every flag from ETCD_<FLAG> too, and its processes inherit
// this process's environment.
const pprofEnv = "ETCD_ENABLE_PPROF"

// envMu serializes startWithPprof's changes to the process's environment.
var envMu sync.Mutex

// startWithPprof starts the cluster with pprofEnv set, unless it is set
// already (then etcd does what it says), and restores the environment.
// The profiling endpoints cost nothing until asked; enabling them also
// makes etcd sample 1 in 5 contended mutex events, too few to show in
// these benchmarks.
func startWithPprof(dir string, members int) (*etcdtest.Cluster, error) {
	envMu.Lock()
	defer envMu.Unlock()
	if _, set := os.LookupEnv(pprofEnv); !set {
		if err := os.Setenv(pprofEnv, "true"); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
		defer os.Unsetenv(pprofEnv)
	}
	return etcdtest.StartDir(dir, members)
}

// Close closes the observer client and stops the cluster.
func (e *Env) Close() {
	e.obs.Close()
	e.cluster.Close()
}

// ServerVersion returns the version of the etcd server, such as "3.7.3".
func (e *Env) ServerVersion() string { return e.cluster.Version() }

// ServerPIDs returns the process ID of each member (0 if stopped).
func (e *Env) ServerPIDs() []int { return e.cluster.PIDs() }

// Members returns the number of members of the cluster.
func (e *Env) Members() int { return e.cluster.Size() }

// lockName returns a lock name no other run uses.
func (e *Env) lockName(scenario string, impl Impl) string {
	return fmt.Sprintf("bench/%s/%s/%d", scenario, impl.Name, e.seq.Add(1))
}

// revision returns the current revision of the store.
func (e *Env) revision(ctx context.Context) (int64, error) {
	resp, err := e.obs.Get(ctx, "bench-revision")
	if err != nil {
		return 0, fmt.Errorf("bench: read revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// countKeys returns the number of keys under name + "/".
func (e *Env) countKeys(ctx context.Context, name string) (int64, error) {
	resp, err := e.obs.Get(ctx, name+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("bench: count keys of %s: %w", name, err)
	}
	return resp.Count, nil
}

// queue returns the keys under name + "/" in create-revision order: the
// holder first, then the waiters in the order they get the lock.
func (e *Env) queue(ctx context.Context, name string) ([]string, error) {
	resp, err := e.obs.Get(ctx, name+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("bench: read queue of %s: %w", name, err)
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys, nil
}

// singleMember is the member a scenario with one client talks to: a
// follower when there is one, so that on three members a write goes
// through a forwarding member as it does for most clients of a cluster.
func (e *Env) singleMember() int {
	if e.cluster.Size() == 1 {
		return 0
	}
	return (max(e.cluster.Leader(), 0) + 1) % e.cluster.Size()
}

// keepAliveMethod is the gRPC method of lease keepalives.
const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// rpcCount counts the RPCs of a scenario's clients: etcdtest's counter of
// unary calls and streams opened, plus, apart, how many of those streams
// were lease keepalives (both etcdlock's sessions and etcd's send their
// renewals on one stream per client).
//
// It also counts the keepalive requests sent on those streams: the
// renewals, whichever way they are sent.
type rpcCount struct {
	all       etcdtest.RPCCounter
	keepAlive atomic.Int64
	renewals  atomic.Int64
}

func (c *rpcCount) dialOptions() []grpc.DialOption {
	return append(c.all.DialOptions(),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if method != keepAliveMethod {
				return streamer(ctx, desc, cc, method, opts...)
			}
			c.keepAlive.Add(1)
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return &renewalStream{ClientStream: cs, n: &c.renewals}, nil
		}))
}

// renewalStream counts the requests sent on a keepalive stream.
type renewalStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (s *renewalStream) SendMsg(m any) error {
	err := s.ClientStream.SendMsg(m)
	if err == nil {
		s.n.Add(1)
	}
	return err
}

// clients are the counted clients of one scenario run.
type clients struct {
	rpcs rpcCount
	clis []*clientv3.Client
}

// newClients opens n clients counted in one rpcCount. Client i talks only
// to member (first+i) mod members, spreading them over the cluster.
func (e *Env) newClients(n, first int) (*clients, error) {
	cs := &clients{}
	for i := range n {
		cli, err := e.cluster.NewClient(clientv3.Config{
			Endpoints:   []string{e.cluster.Endpoint((first + i) % e.cluster.Size())},
			DialOptions: cs.rpcs.dialOptions(),
		})
		if err != nil {
			cs.close()
			return nil, fmt.Errorf("bench: client: %w", err)
		}
		cs.clis = append(cs.clis, cli)
	}
	return cs, nil
}

func (cs *clients) close() {
	for _, cli := range cs.clis {
		cli.Close()
	}
}

// sessionParallelism bounds how many sessions are created or closed at once.
const sessionParallelism = 32

// newSessions creates n sessions of impl, session i on client i mod
// len(clis), at most sessionParallelism at a time. On failure it closes
// those it created.
func newSessions(ctx context.Context, impl Impl, clis []*clientv3.Client, n int) ([]Session, error) {
	ss := make([]Session, n)
	errs := make([]error, n)
	forEach(n, func(i int) {
		ss[i], errs[i] = impl.NewSession(ctx, clis[i%len(clis)])
	})
	if err := errors.Join(errs...); err != nil {
		closeSessions(ss)
		return nil, fmt.Errorf("bench: %s session: %w", impl.Name, err)
	}
	return ss, nil
}

// closeSessions closes the non-nil sessions, at most sessionParallelism at
// a time. Errors are ignored: a lease that cannot be revoked expires.
func closeSessions(ss []Session) {
	forEach(len(ss), func(i int) {
		if ss[i] != nil {
			ss[i].Close()
		}
	})
}

// forEach calls f(0) ... f(n-1), sessionParallelism at a time, and returns
// when all have returned.
func forEach(n int, f func(i int)) {
	sem := make(chan struct{}, sessionParallelism)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

// poll calls cond every interval until it returns true or an error, or ctx
// ends.
func poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// serverWatchers returns the number of watchers of all members, and how
// many of them are unsynced (catching up with the store, their events
// delayed), from the metrics each member serves on its client URL.
func (e *Env) serverWatchers(ctx context.Context) (watchers, slow int64, err error) {
	for _, ep := range e.cluster.Endpoints() {
		w, s, err := scrapeWatchers(ctx, ep)
		if err != nil {
			return 0, 0, err
		}
		watchers += w
		slow += s
	}
	return watchers, slow, nil
}

// metricsClient reads members' metrics, one connection per request. A
// member that keeps 10 000 waiters' watches, on a loaded machine, has
// taken over 5 seconds to answer.
var metricsClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

// scrapeWatchers reads etcd's two watcher gauges from the Prometheus text
// that the member at ep serves on /metrics.
func scrapeWatchers(ctx context.Context, ep string) (watchers, slow int64, err error) {
	v, err := scrapeMetrics(ctx, ep, "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_slow_watcher_total")
	if err != nil {
		return 0, 0, err
	}
	return int64(v[0]), int64(v[1]), nil
}

// scrapeMetrics reads the values of the unlabelled metrics called names
// from the Prometheus text that the member at ep serves on /metrics, in
// the order of names. It fails if one is missing.
func scrapeMetrics(ctx context.Context, ep string, names ...string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ep+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: metrics of %s: %w", ep, err)
	}
	defer resp.Body.Close()
	values := make([]float64, len(names))
	found := make([]bool, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		i := slices.Index(names, name)
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("bench: metrics of %s: %q: %w", ep, sc.Text(), err)
		}
		values[i], found[i] = v, true
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: metrics of %s: %w", ep, err)
	}
	if i := slices.Index(found, false); i >= 0 {
		return nil, fmt.Errorf("bench: etcd's metric %s not found at %s/metrics", names[i], ep)
	}
	return values, nil
}
