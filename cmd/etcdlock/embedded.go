package main

import (
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"
)

// embeddedEtcd is a one-member etcd running inside this process, for the
// demo: it needs no etcd installed. Its data lives in a directory the
// caller owns.
type embeddedEtcd struct {
	etcd     *embed.Etcd
	endpoint string
}

// demoWALSegment is the size of the embedded etcd's WAL segments, which
// etcd preallocates (64 MB, and the next one too, by default): the demo
// writes a few kilobytes, and what a killed demo leaves behind until the
// next one removes it stays small.
const demoWALSegment = 1 << 20

// startEmbedded starts a one-member etcd on a free loopback port with its
// data under dir (fsync on, as any etcd). It sets etcd's WAL segment size
// for the whole process: call it once.
func startEmbedded(dir string) (*embeddedEtcd, error) {
	wal.SegmentSizeBytes = demoWALSegment
	cport, err := etcdtest.FreePort()
	if err != nil {
		return nil, err
	}
	pport, err := etcdtest.FreePort()
	if err != nil {
		return nil, err
	}
	curl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cport)}
	purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pport)}
	cfg := embed.NewConfig()
	cfg.Name = "demo"
	cfg.Dir = filepath.Join(dir, "demo.etcd")
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
	cfg.InitialCluster = cfg.Name + "=" + purl.String()
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd did not become ready in 30s")
	}
	return &embeddedEtcd{etcd: e, endpoint: curl.String()}, nil
}

// Endpoint returns the member's client URL.
func (e *embeddedEtcd) Endpoint() string { return e.endpoint }

// NewClient returns a client of the member. The caller closes it.
func (e *embeddedEtcd) NewClient() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// Close stops the member; its data directory is left to the caller.
func (e *embeddedEtcd) Close() { e.etcd.Close() }

// demoDirPattern names the demo's temporary directories (os.MkdirTemp's
// pattern, and a glob).
const demoDirPattern = "etcdlock-demo-*"
