package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The serve command: every lock under a prefix, followed with watches
// and served as Prometheus metrics of the whole fleet and a live page.

const serveHelp = `Usage: etcdlock serve [flags] PREFIX

Follows every lock whose name starts with PREFIX ("" for every lock in
etcd) and serves, on --listen:

  /          a live page of the queues: per lock its holder (who, host,
             pid, how long, token), its waiters in order, pending lock
             delays and open release requests, updated as they change,
             without a reload (server-sent events; no script but the
             page's own)
  /metrics   Prometheus metrics of the whole fleet, per lock (label name):
             etcdlock_fleet_holders, etcdlock_fleet_waiters,
             etcdlock_fleet_hold_age_seconds (the oldest holder's),
             etcdlock_fleet_pending_delays, etcdlock_fleet_release_requests;
             and etcdlock_fleet_locks, etcdlock_fleet_revision
  /state     the same as JSON: each lock as 'etcdlock status --json' has it
  /events    the page's stream: the state, then each lock that changed

It never polls. It reads the locks once, then watches the keys under
PREFIX, and the lock delay and release request records of those locks,
and reads a lock again only when one of its keys changes. A watch that
breaks, or history etcd compacted, makes it read everything again.

etcd keeps no timestamps: a hold's age is what its holder recorded
(etcdlock run, the gocron adapter), else the time since this serve saw it
held, which is less than its true age.

It runs until SIGINT, SIGTERM or SIGHUP, then exits 0. It needs read
permission on the keys under PREFIX, and to show delays and requests on
__etcdlock/delay/PREFIX and __etcdlock/release/PREFIX ('etcdlock grants
--observe-only --lock-delay --requests --prefix PREFIX').

  --listen ADDR   the address to serve on (default 127.0.0.1:9479; ":9479"
                  for every interface). Whoever reaches it sees the lock
                  names and what their holders recorded: serve asks for no
                  login; put it behind what guards your other endpoints.
` + connHelp + "\n" + exitCodesHelp

func cmdServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve")
	var conn connFlags
	conn.register(fs)
	listen := fs.String("listen", "127.0.0.1:9479", "the `ADDR` to serve on")
	pos, rest, _, err := parseArgs(fs, args, 1, serveHelp, stdout)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("serve", `missing PREFIX ("" follows every lock)`)
	}
	if len(rest) > 0 {
		return usageErr("serve", "unexpected argument %q after PREFIX", rest[0])
	}
	prefix := pos[0]
	cli, err := openConn(fs, &conn, "serve", prefix, stderr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return failf(exitUsage, "--listen %s: %v", *listen, err)
	}
	v := newFleet(cli, prefix, conn.commandTimeout, stderr)
	ctx, stop := watchContext()
	defer stop()
	if err := v.resync(ctx); err != nil {
		ln.Close()
		return fmt.Errorf("read the locks%s: %w", under(prefix), conn.explain(err, "read the keys with prefix", prefix, nil))
	}
	srv := &http.Server{Handler: v.handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "serving the locks%s on http://%s/ (metrics: /metrics)\n", under(prefix), ln.Addr())
	v.follow(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v.closeSubscribers()
	srv.Shutdown(sctx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// fleetLock is a lock as serve shows it: status --json's object, and,
// for a holder that recorded no time, when serve first saw it hold.
type fleetLock struct {
	statusJSON
	SeenSince *time.Time `json:"seen_since,omitempty"`
	// Gone marks, in an update, a lock that has no key left.
	Gone bool `json:"gone,omitempty"`
}

// since is when lk's oldest hold began, as far as serve knows, or nil
// when nobody holds.
func (lk *fleetLock) since() *time.Time {
	h := lk.Holder
	switch {
	case h == nil:
		return nil
	case h.HeldSince != nil:
		return h.HeldSince
	}
	return lk.SeenSince
}

// fleetState is what /state and the first event of /events send.
type fleetState struct {
	Prefix   string       `json:"prefix"`
	Revision int64        `json:"revision"`
	Locks    []*fleetLock `json:"locks"`
}

// A fleet follows the locks under a prefix (see serveHelp).
type fleet struct {
	cli     *clientv3.Client
	prefix  string
	timeout time.Duration
	stderr  io.Writer
	records lockedRecords

	mu    sync.Mutex
	rev   int64
	locks map[string]*fleetLock // by name; only locks with a key
	subs  map[chan []byte]bool  // the /events streams, each a channel of messages
}

func newFleet(cli *clientv3.Client, prefix string, timeout time.Duration, stderr io.Writer) *fleet {
	return &fleet{cli: cli, prefix: prefix, timeout: timeout, stderr: stderr,
		records: lockedRecords{m: selfRecords{}}, locks: map[string]*fleetLock{}, subs: map[chan []byte]bool{}}
}

// lockedRecords is a selfRecords safe for the concurrent reads of a
// resync.
type lockedRecords struct {
	mu sync.Mutex
	m  selfRecords
}

func (r *lockedRecords) read(ctx context.Context, cli *clientv3.Client, name string, k etcdlock.QueueKey) (selfRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m.read(ctx, cli, name, k)
}

// readParallelism bounds the reads of a resync made at once.
const readParallelism = 16

// resync reads every lock under the prefix anew, at one revision, and
// sends the new state to every stream.
func (f *fleet) resync(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	list, err := etcdlock.ListLocks(rctx, f.cli, f.prefix)
	if err != nil {
		return err
	}
	locks := make([]*fleetLock, len(list.Locks))
	errs := make([]error, len(list.Locks))
	sem := make(chan struct{}, readParallelism)
	var wg sync.WaitGroup
	for i, s := range list.Locks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			locks[i], errs[i] = f.read(ctx, s.Name, list.Revision)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	f.mu.Lock()
	old := f.locks
	f.locks = map[string]*fleetLock{}
	for _, lk := range locks {
		if lk != nil {
			f.keepSeen(lk, old[lk.Name])
			f.locks[lk.Name] = lk
		}
	}
	f.rev = list.Revision
	msg := f.message("state", f.stateLocked())
	f.broadcastLocked(msg)
	f.mu.Unlock()
	return nil
}

// read reads lock name at revision rev (0: now), as status does; nil when
// it has no key.
func (f *fleet) read(ctx context.Context, name string, rev int64) (*fleetLock, error) {
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var opts []etcdlock.InspectOption
	if rev > 0 {
		opts = append(opts, etcdlock.AtRevision(rev))
	}
	q, err := etcdlock.InspectLock(rctx, f.cli, name, append(opts, etcdlock.WithoutLeases())...)
	if err != nil {
		return nil, err
	}
	if len(q.Keys) == 0 {
		return nil, nil
	}
	return &fleetLock{statusJSON: *newStatus(rctx, f.cli, q, f.records.read)}, nil
}

// keepSeen sets lk's SeenSince: old's, if the same hold held then, else
// now. Called with f.mu held.
func (f *fleet) keepSeen(lk *fleetLock, old *fleetLock) {
	if lk.Holder == nil || lk.Holder.HeldSince != nil {
		return
	}
	if old != nil && old.Holder != nil && old.Holder.Key == lk.Holder.Key && old.Holder.Token == lk.Holder.Token && old.SeenSince != nil {
		lk.SeenSince = old.SeenSince
		return
	}
	now := time.Now().UTC()
	lk.SeenSince = &now
}

// follow watches the locks' keys and records from the revision read last,
// reads each lock whose keys change, and sends it to the streams, until
// ctx ends. A broken watch is made again after a resync.
func (f *fleet) follow(ctx context.Context) {
	for ctx.Err() == nil {
		err := f.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(f.stderr, "etcdlock: watching the locks%s: %s; reading them again\n", under(f.prefix), detail(err))
		for ctx.Err() == nil {
			if err := f.resync(ctx); err == nil {
				break
			} else {
				fmt.Fprintf(f.stderr, "etcdlock: reading the locks%s: %s\n", under(f.prefix), detail(err))
			}
			select {
			case <-ctx.Done():
			case <-time.After(watchRetry):
			}
		}
	}
}

// watch watches the three prefixes from the revision after the last read
// until a watch breaks, and reads each lock an event names.
func (f *fleet) watch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	f.mu.Lock()
	from := f.rev + 1
	f.mu.Unlock()
	type batch struct {
		rev   int64
		names []string
		err   error
	}
	out := make(chan batch)
	for _, p := range []string{f.prefix, etcdlock.LockDelayPrefix + f.prefix, etcdlock.ReleaseRequestPrefix + f.prefix} {
		strip := strings.TrimSuffix(p, f.prefix)
		wch := f.cli.Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(from))
		go func() {
			for resp := range wch {
				var b batch
				switch {
				case resp.CompactRevision != 0:
					b.err = fmt.Errorf("etcd compacted its history past revision %d", resp.CompactRevision-1)
				case resp.Err() != nil:
					b.err = resp.Err()
				}
				for _, ev := range resp.Events {
					if name, ok := etcdlock.LockOfKey(strings.TrimPrefix(string(ev.Kv.Key), strip)); ok && strings.HasPrefix(name, f.prefix) {
						b.names = append(b.names, name)
					}
					b.rev = max(b.rev, ev.Kv.ModRevision)
				}
				select {
				case out <- b:
				case <-wctx.Done():
					return
				}
				if b.err != nil {
					return
				}
			}
			select {
			case out <- batch{err: errors.New("the watch ended")}:
			case <-wctx.Done():
			}
		}()
	}
	for {
		var b batch
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b = <-out:
		}
		if b.err != nil {
			return b.err
		}
		if len(b.names) > 0 {
			if err := f.update(ctx, b.names); err != nil {
				return err
			}
		}
	}
}

// update reads the locks names (each once) as they are now, and sends
// those that changed to the streams.
func (f *fleet) update(ctx context.Context, names []string) error {
	sort.Strings(names)
	var changed []*fleetLock
	var rev int64
	for i, name := range names {
		if i > 0 && name == names[i-1] {
			continue
		}
		lk, err := f.read(ctx, name, 0)
		if err != nil {
			return err
		}
		f.mu.Lock()
		old := f.locks[name]
		switch {
		case lk == nil && old == nil:
		case lk == nil:
			delete(f.locks, name)
			changed = append(changed, &fleetLock{statusJSON: statusJSON{Name: name, Holders: []*holderJSON{}, Waiters: []waiterJSON{}}, Gone: true})
		default:
			f.keepSeen(lk, old)
			f.locks[name] = lk
			changed = append(changed, lk)
			rev = max(rev, lk.Revision)
		}
		f.mu.Unlock()
	}
	f.mu.Lock()
	f.rev = max(f.rev, rev)
	if len(changed) > 0 {
		f.broadcastLocked(f.message("locks", changed))
	}
	f.mu.Unlock()
	return nil
}

// stateLocked is the whole state, locks by name. Called with f.mu held.
func (f *fleet) stateLocked() fleetState {
	st := fleetState{Prefix: f.prefix, Revision: f.rev, Locks: make([]*fleetLock, 0, len(f.locks))}
	for _, lk := range f.locks {
		st.Locks = append(st.Locks, lk)
	}
	sort.Slice(st.Locks, func(i, j int) bool { return st.Locks[i].Name < st.Locks[j].Name })
	return st
}

// message is a server-sent event of type event with v as its JSON data.
func (f *fleet) message(event string, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte("null")
	}
	return []byte("event: " + event + "\ndata: " + string(b) + "\n\n")
}

// subscriberBuffer is how many messages a stream may fall behind before it
// is dropped (its page reconnects, and gets the whole state).
const subscriberBuffer = 64

// broadcastLocked sends msg to every stream. Called with f.mu held.
func (f *fleet) broadcastLocked(msg []byte) {
	for ch := range f.subs {
		select {
		case ch <- msg:
		default:
			close(ch)
			delete(f.subs, ch)
		}
	}
}

// closeSubscribers ends every stream.
func (f *fleet) closeSubscribers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for ch := range f.subs {
		close(ch)
		delete(f.subs, ch)
	}
}

func (f *fleet) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'")
		io.WriteString(w, fleetPage)
	})
	mux.HandleFunc("GET /state", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		st := f.stateLocked()
		b, err := json.Marshal(st)
		f.mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	mux.HandleFunc("GET /events", f.serveEvents)
	mux.HandleFunc("GET /metrics", f.serveMetrics)
	return mux
}

// serveEvents streams the state, then each change, as server-sent events.
func (f *fleet) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	ch := make(chan []byte, subscriberBuffer)
	f.mu.Lock()
	first := f.message("state", f.stateLocked())
	f.subs[ch] = true
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if f.subs[ch] {
			delete(f.subs, ch)
			close(ch)
		}
		f.mu.Unlock()
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	if _, err := w.Write(first); err != nil {
		return
	}
	fl.Flush()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			if _, err := w.Write(msg); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// serveMetrics writes the fleet's metrics in Prometheus's text format.
func (f *fleet) serveMetrics(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	st := f.stateLocked()
	f.mu.Unlock()
	now := time.Now()
	var b strings.Builder
	family := func(name, typ, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	perLock := func(name, help string, value func(*fleetLock) (float64, bool)) {
		family(name, "gauge", help)
		for _, lk := range st.Locks {
			if v, ok := value(lk); ok {
				fmt.Fprintf(&b, "%s{name=\"%s\"} %s\n", name, labelValue(lk.Name), strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
	}
	family("etcdlock_fleet_locks", "gauge", "Locks under the prefix that have a key.")
	fmt.Fprintf(&b, "etcdlock_fleet_locks %d\n", len(st.Locks))
	family("etcdlock_fleet_revision", "gauge", "The etcd revision of the newest read of a lock.")
	fmt.Fprintf(&b, "etcdlock_fleet_revision %d\n", st.Revision)
	perLock("etcdlock_fleet_holders", "Holders of the lock.", func(lk *fleetLock) (float64, bool) { return float64(len(lk.Holders)), true })
	perLock("etcdlock_fleet_waiters", "Keys waiting in the lock's queue.", func(lk *fleetLock) (float64, bool) { return float64(len(lk.Waiters)), true })
	perLock("etcdlock_fleet_hold_age_seconds", "Age of the lock's oldest hold: since the time its holder recorded, else since this serve saw it held (less than its true age). Absent when free.",
		func(lk *fleetLock) (float64, bool) {
			s := lk.since()
			if s == nil {
				return 0, false
			}
			return max(0, now.Sub(*s).Seconds()), true
		})
	perLock("etcdlock_fleet_pending_delays", "Lock delays and minimum holds pending: holds that ended, whose record keeps the lock free.", func(lk *fleetLock) (float64, bool) { return float64(len(lk.Delays)), true })
	perLock("etcdlock_fleet_release_requests", "Holders asked to release the lock that have not yet.", func(lk *fleetLock) (float64, bool) {
		n := 0
		for _, h := range lk.Holders {
			if h.ReleaseRequested {
				n++
			}
		}
		return float64(n), true
	})
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	io.WriteString(w, b.String())
}

// labelValue escapes s for a label value of the text format.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}
