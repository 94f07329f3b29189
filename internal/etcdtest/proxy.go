package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy sits between clients and a member's client URL: clients that dial
// URL instead of the member reach it through the proxy, whose faults the
// test turns on and off.
//
// It is etcd's own fault-injection proxy (go.etcd.io/etcd/pkg/v3/proxy),
// embedded, behind a delay line of ours. In the etcd proxy's terms Tx is
// the direction client to etcd (requests) and Rx etcd to client (answers,
// watch events): BlackholeRx drops answers, PauseRx holds them.
//
// For late answers use DelayAnswers, not the embedded DelayRx: the etcd
// proxy holds each chunk it reads for the delay before it reads the next,
// so a chunk that arrives while another waits is late by up to twice the
// delay. gRPC sends small frames of its own (pings, window updates) next to
// every answer, so with DelayRx(1s) lease keepalives are answered up to 2s
// late, not 1s (a 3s lease then cannot be kept alive).
//
// A fault applies to the bytes read after the call: bytes already read
// and held by a delay are still delivered. Blackhole drops bytes in the
// middle of the TCP stream, which corrupts it for good, so a test must not
// expect a link to work again after Cut.
type Proxy struct {
	proxy.Server
	line    *delayLine
	drained chan struct{} // closed when the etcd proxy's errors are no longer read
	once    sync.Once
}

// NewProxy starts a proxy to target (a client URL such as Endpoint(i)) on
// free loopback ports and closes it in tb.Cleanup.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	to, err := url.Parse(target)
	if err != nil {
		tb.Fatalf("etcdtest: proxy target %q: %v", target, err)
	}
	// A port FreePort found free can be taken before the etcd proxy binds
	// it (the check and the bind are apart, and the proxy can only be
	// given a port, not a listener): then it takes another. Only a failed
	// bind is tried again.
	var from url.URL
	var srv proxy.Server
	for try := 1; ; try++ {
		port, err := FreePort()
		if err != nil {
			tb.Fatalf("etcdtest: proxy port: %v", err)
		}
		from = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
		srv = proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: *to})
		// NewServer reports a failed listen on Error and closes itself.
		select {
		case <-srv.Ready():
		case err := <-srv.Error():
			srv.Close()
			if errors.Is(err, syscall.EADDRINUSE) && try < 3 {
				continue
			}
			tb.Fatalf("etcdtest: proxy to %s: %v", target, err)
		}
		break
	}
	// The etcd proxy reports every I/O error on a channel of 16; once that
	// is full, the connection that hit the error stops moving bytes. Drain
	// it so that only the faults the test asks for disturb the traffic.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-srv.Error():
			case <-srv.Done():
				return
			}
		}
	}()
	line, err := newDelayLine(from.Host)
	if err != nil {
		srv.Close()
		<-drained
		tb.Fatalf("etcdtest: proxy delay line: %v", err)
	}
	p := &Proxy{Server: srv, line: line, drained: drained}
	tb.Cleanup(func() { p.Close() })
	return p
}

// Close closes the proxy and the connections through it; clients that use
// it see their connections end. It returns nil.
func (p *Proxy) Close() error {
	p.once.Do(func() {
		// The line first: closing its connections ends those of the etcd
		// proxy, whose Close waits for them.
		p.line.close()
		p.Server.Close()
		<-p.drained
	})
	return nil
}

// URL returns the client URL of the proxy, to use as a client's endpoint.
func (p *Proxy) URL() string { return "http://" + p.line.ln.Addr().String() }

// Cut drops all traffic through the proxy both ways from now on, like a
// network partition: requests never reach etcd and answers never come
// back, while the TCP connections stay open. Answers DelayAnswers already
// holds still arrive, as packets already on the wire would.
func (p *Proxy) Cut() {
	p.BlackholeTx()
	p.BlackholeRx()
}

// DelayAnswers makes every byte etcd sends reach the clients d after the
// proxy received it, however many there are; 0 turns the delay off.
// Requests are not delayed.
func (p *Proxy) DelayAnswers(d time.Duration) { p.line.delay.Store(int64(d)) }

// delayLine relays TCP connections to target and delivers what target
// sends a fixed delay after it arrived. It keeps reading while earlier
// bytes wait, so each byte is late by the delay and no more.
type delayLine struct {
	ln     net.Listener
	target string
	delay  atomic.Int64 // time.Duration
	done   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

// chunk is bytes read from target and when to deliver them.
type chunk struct {
	data []byte
	due  time.Time
}

func newDelayLine(target string) (*delayLine, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &delayLine{ln: ln, target: target, done: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.accept()
	}()
	return l, nil
}

func (l *delayLine) accept() {
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		out, err := net.Dial("tcp", l.target)
		if err != nil {
			in.Close()
			continue
		}
		if !l.track(in, out) {
			return
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.relay(in, out)
		}()
	}
}

// track records the connections so that close can end them; it reports
// false, having closed them, when the line is closing.
func (l *delayLine) track(conns ...net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done:
		for _, c := range conns {
			c.Close()
		}
		return false
	default:
	}
	for _, c := range conns {
		l.conns[c] = struct{}{}
	}
	return true
}

// relay copies in to out as it comes and out to in late. Either side
// ending ends both.
func (l *delayLine) relay(in, out net.Conn) {
	var once sync.Once
	end := func() {
		once.Do(func() {
			in.Close()
			out.Close()
			l.mu.Lock()
			delete(l.conns, in)
			delete(l.conns, out)
			l.mu.Unlock()
		})
	}
	var wg sync.WaitGroup
	defer func() {
		end()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer end()
		buf := make([]byte, 32<<10)
		for {
			n, err := in.Read(buf)
			if n > 0 {
				if _, werr := out.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()

	// The reader stamps each chunk as it arrives; the writer delivers the
	// chunks in order, each at its time.
	chunks := make(chan chunk, 1024)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := out.Read(buf)
			if n > 0 {
				c := chunk{data: buf[:n], due: time.Now().Add(time.Duration(l.delay.Load()))}
				select {
				case chunks <- c:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range chunks {
		if wait := time.Until(c.due); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
		}
		if _, err := in.Write(c.data); err != nil {
			end()
			// The reader sees the closed connection and stops.
			for range chunks {
			}
			return
		}
	}
}

// close stops accepting, ends every connection and waits for the relays.
func (l *delayLine) close() {
	l.mu.Lock()
	close(l.done)
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.ln.Close()
	l.wg.Wait()
}
