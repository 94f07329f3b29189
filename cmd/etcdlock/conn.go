package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"github.com/etcdlock/etcdlock"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// connFlags are the etcdctl connection settings shared by run and status.
type connFlags struct {
	endpoints      string
	user           string
	password       string
	cacert         string
	cert           string
	key            string
	skipVerify     bool
	dialTimeout    time.Duration
	commandTimeout time.Duration // bounds each short request, as in etcdctl
}

// connEnv maps each connection flag to the etcdctl environment variable
// that sets it when the flag is not given.
var connEnv = []struct{ flag, env string }{
	{"endpoints", "ETCDCTL_ENDPOINTS"},
	{"user", "ETCDCTL_USER"},
	{"password", "ETCDCTL_PASSWORD"},
	{"cacert", "ETCDCTL_CACERT"},
	{"cert", "ETCDCTL_CERT"},
	{"key", "ETCDCTL_KEY"},
	{"insecure-skip-tls-verify", "ETCDCTL_INSECURE_SKIP_TLS_VERIFY"},
	{"dial-timeout", "ETCDCTL_DIAL_TIMEOUT"},
	{"command-timeout", "ETCDCTL_COMMAND_TIMEOUT"},
}

const connHelp = `
Connection flags are etcdctl's, with its defaults. Each flag not given is
read from its environment variable: ETCDCTL_ENDPOINTS, ETCDCTL_USER,
ETCDCTL_PASSWORD, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY,
ETCDCTL_INSECURE_SKIP_TLS_VERIFY, ETCDCTL_DIAL_TIMEOUT,
ETCDCTL_COMMAND_TIMEOUT. Durations take a unit (10s, 1m30s) or are
seconds (10, 1.5).
`

func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.endpoints, "endpoints", "127.0.0.1:2379", "comma-separated etcd `endpoints`")
	fs.StringVar(&c.user, "user", "", "etcd user as `user:password`, or user with --password; a user alone is asked for the password if standard input is a terminal")
	fs.StringVar(&c.password, "password", "", "`password` of --user")
	fs.StringVar(&c.cacert, "cacert", "", "verify etcd's TLS certificate with this CA `file`")
	fs.StringVar(&c.cert, "cert", "", "TLS client certificate `file`")
	fs.StringVar(&c.key, "key", "", "TLS client key `file`")
	fs.BoolVar(&c.skipVerify, "insecure-skip-tls-verify", false, "use TLS but do not verify etcd's certificate (for testing only: anyone in between can read and change the traffic)")
	durationVar(fs, &c.dialTimeout, "dial-timeout", 2*time.Second, "give up reaching etcd after this `duration`")
	durationVar(fs, &c.commandTimeout, "command-timeout", 5*time.Second, "give up each short request to etcd after this `duration` (reads, the start of a session, the release, the revoke at exit; not the dial, nor the wait for the lock)")
}

// applyEnv sets each connection flag not given on the command line from
// its ETCDCTL_* variable, if that is set and not empty.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := make(map[string]bool)
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, e := range connEnv {
		v := getenv(e.env)
		if given[e.flag] || v == "" {
			continue
		}
		if err := fs.Set(e.flag, v); err != nil {
			return fmt.Errorf("%s=%q: %v", e.env, v, err)
		}
	}
	return nil
}

// endpointList returns the endpoints, split and trimmed.
func (c *connFlags) endpointList() []string {
	var eps []string
	for ep := range strings.SplitSeq(c.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	return eps
}

// check validates the settings that need no file or network: a usage
// error if one is wrong.
func (c *connFlags) check() error {
	if len(c.endpointList()) == 0 {
		return errors.New("no etcd endpoints given")
	}
	for _, ep := range c.endpointList() {
		if _, err := parseEndpoint(ep); err != nil {
			return err
		}
	}
	if c.dialTimeout <= 0 {
		return fmt.Errorf("--dial-timeout must be positive, not %v", c.dialTimeout)
	}
	if c.commandTimeout <= 0 {
		return fmt.Errorf("--command-timeout must be positive, not %v", c.commandTimeout)
	}
	if c.needsPassword() {
		return nil // askPassword asks for it
	}
	if _, _, err := c.credentials(); err != nil {
		return err
	}
	return nil
}

// needsPassword reports whether --user names a user without a password,
// and no --password is given.
func (c *connFlags) needsPassword() bool {
	return c.user != "" && c.password == "" && !strings.Contains(c.user, ":")
}

// askPassword asks for the password of --user on the terminal, as etcdctl
// does, when --user has none and no --password is given. Without a
// terminal on standard input it returns a usage error for command.
func (c *connFlags) askPassword(command string, stdin *os.File, stderr io.Writer) error {
	if !c.needsPassword() {
		return nil
	}
	password, ok, err := readPassword(stdin, fmt.Sprintf("Password of etcd user %q: ", c.user), stderr)
	if err != nil {
		return err
	}
	if !ok {
		return usageErr(command, "--user %q has no password, and standard input is not a terminal to ask for it: give user:password, --password, or ETCDCTL_PASSWORD", c.user)
	}
	if password == "" {
		// etcd's client does not log in without a password: it would
		// send no user at all.
		return usageErr(command, "no password typed for etcd user %q", c.user)
	}
	c.password = password
	return nil
}

// credentials returns the user name and password, splitting user:password
// as etcdctl does when --password is not given.
func (c *connFlags) credentials() (user, password string, err error) {
	switch {
	case c.user == "" && c.password != "":
		return "", "", errors.New("--password needs --user")
	case c.user == "" || c.password != "":
		return c.user, c.password, nil
	}
	user, password, ok := strings.Cut(c.user, ":")
	if !ok {
		return "", "", fmt.Errorf("--user %q has no password: give user:password, or --password", c.user)
	}
	if user == "" {
		return "", "", fmt.Errorf("--user %q has an empty user name: give user:password", c.user)
	}
	if password == "" {
		// etcd's client would not log in: it sends no user at all.
		return "", "", fmt.Errorf("--user %q has an empty password: give user:password", c.user)
	}
	return user, password, nil
}

// userName is the etcd user the connection authenticates as, for messages.
func (c *connFlags) userName() string {
	user, _, err := c.credentials()
	if err != nil {
		return c.user
	}
	if user == "" && c.cert != "" {
		// With --client-cert-auth, etcd takes the client certificate's
		// common name as the user.
		return certCommonName(c.cert)
	}
	return user
}

// certCommonName returns the common name of the first certificate in the
// PEM file, "" if it cannot be read.
func certCommonName(file string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return ""
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return ""
		}
		return cert.Subject.CommonName
	}
}

// grantNeed is what else a write that etcd refused may have written: the
// prefixes of its other keys, and the flags of 'etcdlock grants' whose
// lines grant them (--min-hold, say).
type grantNeed struct {
	also  []string
	flags []string
	// probed says refused holds the prefixes etcd refuses the user to
	// write, of the key refused and of also (probeWrites): the message
	// then names those alone.
	probed  bool
	refused []string
}

// probeWrites finds which of keys etcd refuses cli's user to write, for
// need: a write that etcd refused names no key, and a user who may write
// the lock's own keys but not its records is told only of the records.
// Each key gets a Txn whose compare never holds (a version below 0) and
// whose Then puts it: etcd checks the permission of every operation of
// a Txn, whichever branch runs (etcd 3.4 too, for operations not nested
// in another Txn), and this one writes nothing, not even a revision. On
// an error other than a refusal need is left unprobed.
func probeWrites(ctx context.Context, cli *clientv3.Client, need *grantNeed, keys ...string) {
	var refused []string
	for _, k := range keys {
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(k), "<", 0)).Then(clientv3.OpPut(k, "")).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrPermissionDenied):
			refused = append(refused, keyPrefix(k))
		case err != nil:
			return
		}
	}
	need.probed, need.refused = true, refused
}

// keyPrefix is key up to its last "/", included: a lock's key
// (NAME/<lease>) gives the lock's prefix, its record's the record's.
func keyPrefix(key string) string {
	if i := strings.LastIndex(key, "/"); i >= 0 {
		return key[:i+1]
	}
	return key
}

// explain rewrites etcd's terse authorization errors into what to do about
// them: "user name is empty" means etcd wants a user, and "permission
// denied" names the user and the key that was refused (the access is what
// was tried on key, such as "read key" or "write key"), and, with need,
// the other prefixes the write touched and the grants command that
// covers them all. Other errors come back as they are.
func (c *connFlags) explain(err error, access, key string, need *grantNeed) error {
	switch {
	case errors.Is(err, rpctypes.ErrUserEmpty):
		return &exitError{code: exitConnect, err: fmt.Errorf("etcd requires authentication (%w): give --user user:password, or set ETCDCTL_USER", err)}
	case errors.Is(err, rpctypes.ErrPermissionDenied) && key == "\x00":
		// ls "": the probe reads from the first key of all.
		return &exitError{code: exitConnect, err: fmt.Errorf(`%w: etcd user %q may not read the whole key space, which ls "" lists (a listing needs read permission only: list a PREFIX the user may read)`, err, c.userName())}
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		// The same exit code from every command: a script tells a refused
		// user from a lock held or lost.
		pfx := keyPrefix(key)
		hint := fmt.Sprintf("run and elect need readwrite permission on the keys with prefix %q; status, ls and elect --listen read", pfx)
		what := fmt.Sprintf("%s %q", access, key)
		switch {
		case need != nil && len(need.also) > 0:
			quoted := make([]string, len(need.also))
			for i, a := range need.also {
				quoted[i] = strconv.Quote(a)
			}
			if need.probed && len(need.refused) > 0 {
				// The probe found which: name those alone.
				refused := make([]string, len(need.refused))
				for i, r := range need.refused {
					refused[i] = strconv.Quote(r)
				}
				what = "write the keys with prefix " + strings.Join(refused, " or ")
			} else {
				// The refused write may have been to another key: etcd
				// does not say which.
				what += ", or one of those with prefix " + strings.Join(quoted, " or ")
			}
			// The grants command whose lines cover them all: the flags
			// say which records, and the name is the lock's.
			cmd := append(append([]string{"etcdlock", "grants", "--role", "ROLE"}, need.flags...), "--", strings.TrimSuffix(pfx, "/"))
			for i, w := range cmd {
				cmd[i] = shellQuote(w)
			}
			hint = fmt.Sprintf("this run needs readwrite permission on the keys with prefix %q and %s; '%s' prints the etcdctl lines", pfx, strings.Join(quoted, " and "), strings.Join(cmd, " "))
		case strings.HasPrefix(key, etcdlock.ReleaseRequestPrefix):
			hint = fmt.Sprintf("release needs write permission on the keys with prefix %q, and read permission on the lock's", pfx)
		case access == "delete key":
			hint = fmt.Sprintf("break needs write permission on the keys with prefix %q: '%s' prints the etcdctl lines", pfx,
				strings.Join([]string{"etcdlock", "grants", "--role", "ROLE", "--", shellQuote(strings.TrimSuffix(pfx, "/"))}, " "))
		}
		return &exitError{code: exitConnect, err: fmt.Errorf("%w: etcd user %q may not %s (%s)", err, c.userName(), what, hint)}
	}
	return err
}

// connect returns a client of the endpoints that has answered a read of
// probeKey within the dial timeout: clientv3.New alone does not fail on
// unreachable endpoints. Failures are exitErrors with exitConnect.
func (c *connFlags) connect(ctx context.Context, probeKey string) (*clientv3.Client, error) {
	cfg, err := c.clientConfig()
	if err != nil {
		return nil, failf(exitConnect, "%v", err)
	}
	where := strings.Join(cfg.Endpoints, ",")
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, connectErr(where, c.dialTimeout, err, "")
	}
	pctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	if probeKey == "" {
		probeKey = "\x00" // etcd has no empty key (ls "" lists every lock)
	}
	if _, err := cli.Get(pctx, probeKey, clientv3.WithCountOnly()); err != nil {
		cli.Close()
		why := ""
		if errors.Is(err, context.DeadlineExceeded) {
			// etcd's client retries until the deadline and keeps no
			// cause: find out what stops it, within another dial timeout.
			dctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
			defer cancel()
			why = whyUnreachable(dctx, cfg.Endpoints, cfg.TLS)
		}
		return nil, connectErr(where, c.dialTimeout, c.explain(err, "read key", probeKey, nil), why)
	}
	return cli, nil
}

// An etcdEndpoint is where etcd's client dials one of --endpoints.
type etcdEndpoint struct {
	network string // "tcp" or "unix"
	addr    string // host:port, or a socket's path
	tls     bool   // TLS is required (https://, unixs:); else used if configured
	plain   bool   // TLS is never used (http://, unix:)
}

// parseEndpoint reads an endpoint as etcd's client does: host:port, or a
// URL of scheme http, https, unix or unixs. Anything else is an error for
// the usage message: the client would fail on it only after the dial
// timeout, as if etcd were out of reach.
func parseEndpoint(ep string) (etcdEndpoint, error) {
	bad := func(why string) (etcdEndpoint, error) {
		return etcdEndpoint{}, fmt.Errorf("--endpoints: %q is not an etcd endpoint (%s): give host:port or a URL such as https://host:port", ep, why)
	}
	if strings.ContainsFunc(ep, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) {
		return bad("it holds a space or a control character")
	}
	for _, unix := range []string{"unixs:", "unix:"} {
		if path, ok := strings.CutPrefix(ep, unix); ok {
			path = strings.TrimPrefix(path, "//")
			if path == "" {
				return bad("no socket path")
			}
			return etcdEndpoint{network: "unix", addr: path, tls: unix == "unixs:", plain: unix == "unix:"}, nil
		}
	}
	if scheme, _, ok := strings.Cut(ep, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return bad(fmt.Sprintf("scheme %q: etcd's client knows http, https, unix and unixs", scheme))
		}
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return bad("no host")
		}
		addr := u.Host
		if u.Port() == "" {
			addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[scheme])
		}
		return etcdEndpoint{network: "tcp", addr: addr, tls: scheme == "https", plain: scheme == "http"}, nil
	}
	if host, port, err := net.SplitHostPort(ep); err != nil || host == "" || port == "" {
		return bad("no host:port")
	}
	return etcdEndpoint{network: "tcp", addr: ep}, nil
}

// whyUnreachable retraces, step by step, how etcd's client reaches each
// endpoint (look its host up, connect, shake hands with TLS where it is
// used, with tlsCfg) until ctx ends, and tells what failed at each, such
// as: host "notahost" not found. It returns "" when every step succeeded
// or timed out: then etcd itself did not answer in time.
func whyUnreachable(ctx context.Context, eps []string, tlsCfg *tls.Config) string {
	var whys []string
	for _, s := range eps {
		ep, err := parseEndpoint(s)
		if err != nil {
			continue // checked before the dial
		}
		if why := ep.whyUnreachable(ctx, tlsCfg); why != "" {
			whys = append(whys, why)
		}
	}
	return strings.Join(whys, "; ")
}

func (ep etcdEndpoint) whyUnreachable(ctx context.Context, tlsCfg *tls.Config) string {
	host := ep.addr
	if ep.network == "tcp" {
		host, _, _ = net.SplitHostPort(ep.addr)
		if net.ParseIP(host) == nil {
			if _, err := net.DefaultResolver.LookupHost(ctx, host); err != nil {
				var dnsErr *net.DNSError
				switch {
				case ctx.Err() != nil:
					return ""
				case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
					return fmt.Sprintf("host %q not found", host)
				}
				return fmt.Sprintf("cannot look up host %q: %v", host, err)
			}
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, ep.network, ep.addr)
	if err != nil {
		if ctx.Err() != nil {
			return ""
		}
		var sysErr *os.SyscallError
		if errors.As(err, &sysErr) {
			err = sysErr.Err // "connection refused"
		}
		return fmt.Sprintf("cannot connect to %s: %v", ep.addr, err)
	}
	defer conn.Close()
	if ep.plain || (!ep.tls && tlsCfg == nil) {
		// A TLS port asked in plain text says nothing back: look.
		if speaksTLS(ctx, conn) {
			return fmt.Sprintf("%s speaks TLS: give https://%s (and --cacert, or --insecure-skip-tls-verify)", ep.addr, ep.addr)
		}
		return ""
	}
	cfg := &tls.Config{}
	if tlsCfg != nil {
		cfg = tlsCfg.Clone()
	}
	if cfg.ServerName == "" && ep.network == "tcp" {
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		if ctx.Err() != nil {
			return ""
		}
		return fmt.Sprintf("TLS handshake with %s failed: %v", ep.addr, err)
	}
	if len(cfg.Certificates) == 0 && cfg.GetClientCertificate == nil && refusesWithoutCert(ctx, tc) {
		return fmt.Sprintf("%s requires a client certificate: give --cert and --key", ep.addr)
	}
	return ""
}

// speaksTLS reports whether the server at conn, a new connection, answers
// a TLS handshake. It uses conn: the caller dials again for anything else.
func speaksTLS(ctx context.Context, conn net.Conn) bool {
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only looks whether TLS answers
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return tc.HandshakeContext(hctx) == nil
}

// refusesWithoutCert reports whether the server of tc, whose handshake
// passed without a client certificate, then refuses it: with TLS 1.3 a
// server that requires one says so only after the handshake, in an alert
// that the first read meets. A server that does not waits for the client
// to speak first: the read times out.
func refusesWithoutCert(ctx context.Context, tc *tls.Conn) bool {
	deadline := time.Now().Add(time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = tc.SetReadDeadline(deadline)
	_, err := tc.Read(make([]byte, 1))
	return err != nil && strings.Contains(err.Error(), "certificate")
}

// clientConfig returns the client configuration; it fails if the TLS
// files cannot be loaded.
func (c *connFlags) clientConfig() (clientv3.Config, error) {
	user, password, err := c.credentials()
	if err != nil {
		return clientv3.Config{}, err
	}
	cfg := clientv3.Config{
		Endpoints:   c.endpointList(),
		DialTimeout: c.dialTimeout,
		Username:    user,
		Password:    password,
		Logger:      zap.NewNop(), // errors reach the user as one line each
	}
	if c.cacert != "" || c.cert != "" || c.key != "" {
		tlsInfo := transport.TLSInfo{TrustedCAFile: c.cacert, CertFile: c.cert, KeyFile: c.key}
		tlsCfg, err := tlsInfo.ClientConfig()
		if err != nil {
			return clientv3.Config{}, fmt.Errorf("TLS setup: %v", err)
		}
		cfg.TLS = tlsCfg
	}
	// As etcdctl: with this flag, endpoints without a scheme use TLS too.
	if c.skipVerify {
		if cfg.TLS == nil {
			cfg.TLS = &tls.Config{}
		}
		cfg.TLS.InsecureSkipVerify = true
	}
	return cfg, nil
}

// connectErr tells why etcd at where could not be used: err, or when
// that is the dial timeout, why (from whyUnreachable) if known.
func connectErr(where string, timeout time.Duration, err error, why string) error {
	if errors.Is(err, context.DeadlineExceeded) {
		if why != "" {
			why = ": " + why
		}
		return failf(exitConnect, "cannot reach etcd at %s within %v (--dial-timeout)%s", where, timeout, why)
	}
	return failf(exitConnect, "cannot use etcd at %s: %v", where, err)
}

// readCmd is the command line of a command that reads locks (status, ls):
// connection flags, --json, --watch, and one argument.
type readCmd struct {
	conn  connFlags
	json  bool
	watch bool
	arg   string
}

// parseReadCmd parses args of command, whose one argument argName names
// (as "lock NAME" or "PREFIX") in usage errors, and may be empty for ls
// only (every lock), and applies the
// environment and asks for a password as every command does.
func parseReadCmd(command, argName, help string, args []string, stdout, stderr io.Writer) (*readCmd, error) {
	fs := newFlagSet(command)
	c := &readCmd{}
	c.conn.register(fs)
	fs.BoolVar(&c.json, "json", false, "print JSON")
	fs.BoolVar(&c.watch, "watch", false, "keep watching and show every change, until interrupted")
	pos, rest, _, err := parseArgs(fs, args, 1, help, stdout)
	if err != nil {
		return nil, err
	}
	switch {
	case len(pos) == 0 && command == "ls":
		return nil, usageErr(command, "missing %s (\"\" lists every lock)", argName)
	case len(pos) == 0:
		return nil, usageErr(command, "missing %s", argName)
	}
	if command != "ls" {
		if err := nameErr(command, argName, pos[0]); err != nil {
			return nil, err
		}
	}
	if len(rest) > 0 {
		return nil, usageErr(command, "unexpected argument %q after %s", rest[0], argName[strings.LastIndexByte(argName, ' ')+1:])
	}
	if err := setupConn(fs, &c.conn, command); err != nil {
		return nil, err
	}
	if err := c.conn.askPassword(command, os.Stdin, stderr); err != nil {
		return nil, err
	}
	c.arg = pos[0]
	return c, nil
}

// openConn sets the connection up (setupConn), asks for the password
// when one is wanted, and connects, for a command on the keys under pfx.
func openConn(fs *flag.FlagSet, c *connFlags, command, pfx string, stderr io.Writer) (*clientv3.Client, error) {
	if err := setupConn(fs, c, command); err != nil {
		return nil, err
	}
	if err := c.askPassword(command, os.Stdin, stderr); err != nil {
		return nil, err
	}
	return c.connect(context.Background(), pfx)
}

// setupConn applies the environment to the connection flags and checks
// them.
func setupConn(fs *flag.FlagSet, c *connFlags, command string) error {
	if err := applyEnv(fs, os.Getenv); err != nil {
		return usageErr(command, "%v", err)
	}
	if err := c.check(); err != nil {
		return usageErr(command, "%v", err)
	}
	return nil
}
