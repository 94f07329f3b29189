package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		ttl    time.Duration
		rest   []string
		dashed bool
	}{
		{[]string{"--ttl", "5s", "n", "--", "cmd", "-x"}, 5 * time.Second, []string{"cmd", "-x"}, false},
		{[]string{"n", "--ttl", "5s", "--", "cmd"}, 5 * time.Second, []string{"cmd"}, false},
		{[]string{"n", "--ttl=5s", "cmd", "--ttl", "1s"}, 5 * time.Second, []string{"cmd", "--ttl", "1s"}, false},
		{[]string{"n", "cmd", "arg"}, time.Second, []string{"cmd", "arg"}, false},
		{[]string{"n", "--", "--", "cmd"}, time.Second, []string{"--", "cmd"}, false},
		// A "--" before NAME starts CMD unless a second one follows NAME.
		{[]string{"--", "n", "cmd"}, time.Second, []string{"cmd"}, true},
		{[]string{"--ttl", "5s", "--", "n"}, 5 * time.Second, []string{}, true},
		{[]string{"--", "n", "--", "cmd"}, time.Second, []string{"cmd"}, false},
		{[]string{"--", "n", "--ttl", "5s", "--", "cmd"}, 5 * time.Second, []string{"cmd"}, false},
	} {
		fs := newFlagSet("run")
		ttl := fs.Duration("ttl", time.Second, "")
		pos, rest, dashed, err := parseArgs(fs, tc.args, 1, "", nil)
		require.NoError(t, err, "%q", tc.args)
		require.Equal(t, []string{"n"}, pos, "%q", tc.args)
		require.Equal(t, tc.ttl, *ttl, "%q", tc.args)
		require.Equal(t, tc.rest, rest, "%q", tc.args)
		require.Equal(t, tc.dashed, dashed, "%q", tc.args)
	}
}

// Flags win over the ETCDCTL_* variables, which fill in the rest.
func TestApplyEnv(t *testing.T) {
	fs := newFlagSet("status")
	var c connFlags
	c.register(fs)
	require.NoError(t, fs.Parse([]string{"--endpoints", "flag:2379", "--dial-timeout=3s"}))
	env := map[string]string{
		"ETCDCTL_ENDPOINTS":                "env:2379",
		"ETCDCTL_DIAL_TIMEOUT":             "9s",
		"ETCDCTL_USER":                     "u:p",
		"ETCDCTL_CACERT":                   "/ca.pem",
		"ETCDCTL_CERT":                     "/cert.pem",
		"ETCDCTL_KEY":                      "/key.pem",
		"ETCDCTL_INSECURE_SKIP_TLS_VERIFY": "true",
		"ETCDCTL_COMMAND_TIMEOUT":          "7",
	}
	require.NoError(t, applyEnv(fs, func(k string) string { return env[k] }))
	require.Equal(t, []string{"flag:2379"}, c.endpointList())
	require.Equal(t, 3*time.Second, c.dialTimeout)
	require.Equal(t, "u:p", c.user)
	require.Equal(t, "/ca.pem", c.cacert)
	require.Equal(t, "/cert.pem", c.cert)
	require.Equal(t, "/key.pem", c.key)
	require.True(t, c.skipVerify)
	require.Equal(t, 7*time.Second, c.commandTimeout)
	user, pw, err := c.credentials()
	require.NoError(t, err)
	require.Equal(t, []string{"u", "p"}, []string{user, pw})

	fs = newFlagSet("status")
	c.register(fs)
	env = map[string]string{"ETCDCTL_DIAL_TIMEOUT": "soon"}
	err = applyEnv(fs, func(k string) string { return env[k] })
	require.ErrorContains(t, err, `ETCDCTL_DIAL_TIMEOUT="soon"`)
}

func TestCredentials(t *testing.T) {
	for _, tc := range []struct {
		user, password     string
		wantUser, wantPass string
		err                string
	}{
		{"", "", "", "", ""},
		{"root:pw", "", "root", "pw", ""},
		{"root:pw:with:colons", "", "root", "pw:with:colons", ""},
		{"root", "pw", "root", "pw", ""},
		{"odd:name", "pw", "odd:name", "pw", ""}, // as etcdctl: --password takes --user whole
		{"root", "", "", "", "has no password"},
		{":pw", "", "", "", "has an empty user name"},
		{"root:", "", "", "", "has an empty password"},
		{"", "pw", "", "", "--password needs --user"},
	} {
		c := connFlags{user: tc.user, password: tc.password}
		u, p, err := c.credentials()
		if tc.err != "" {
			require.ErrorContains(t, err, tc.err)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.wantUser, u)
		require.Equal(t, tc.wantPass, p)
	}
}

// The TLS flags load a CA and a client certificate with etcd's transport
// package; files that cannot be loaded are a connection error, code 3.
func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeTestCerts(t, dir)

	c := connFlags{endpoints: "https://127.0.0.1:2379", dialTimeout: time.Second, cacert: ca, cert: cert, key: key}
	cfg, err := c.clientConfig()
	require.NoError(t, err)
	require.NotNil(t, cfg.TLS)
	require.NotNil(t, cfg.TLS.RootCAs)
	require.NotNil(t, cfg.TLS.GetClientCertificate)

	c = connFlags{endpoints: "https://127.0.0.1:2379", dialTimeout: time.Second, cacert: ca}
	cfg, err = c.clientConfig()
	require.NoError(t, err)
	require.NotNil(t, cfg.TLS.RootCAs)

	c = connFlags{endpoints: "127.0.0.1:2379", dialTimeout: time.Second, cert: cert}
	_, err = c.clientConfig()
	require.ErrorContains(t, err, "TLS setup")

	r := runProc(t, nil, "status", "--cacert", filepath.Join(dir, "missing.pem"), ep(), "n")
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, "TLS setup")
	r = runProc(t, []string{"ETCDCTL_CACERT=" + filepath.Join(dir, "missing.pem")}, "status", ep(), "n")
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, "TLS setup")
}

// writeTestCerts writes a self-signed CA and a client certificate signed
// by it, and returns the paths of the CA, the certificate and its key.
func writeTestCerts(t *testing.T, dir string) (ca, cert, key string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcdlock test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	cliKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	cliTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "etcdlock test client"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	cliDER, err := x509.CreateCertificate(rand.Reader, cliTmpl, caTmpl, &cliKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(cliKey)
	require.NoError(t, err)

	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	return write("ca.pem", "CERTIFICATE", caDER), write("client.pem", "CERTIFICATE", cliDER), write("client-key.pem", "EC PRIVATE KEY", keyDER)
}

// --user and the ETCDCTL_USER/ETCDCTL_PASSWORD variables authenticate; a
// wrong password is a connection error, code 3.
func TestAuth(t *testing.T) {
	t.Parallel()
	c := etcdtest.Start(t, 1)
	cli := c.Client(t)
	name := lockName(t)
	// reader may read the lock's keys but not write them; nobody may do
	// neither.
	_, err := cli.RoleAdd(t.Context(), "reader")
	require.NoError(t, err)
	_, err = cli.RoleGrantPermission(t.Context(), "reader", name+"/", clientv3.GetPrefixRangeEnd(name+"/"), clientv3.PermissionType(clientv3.PermRead))
	require.NoError(t, err)
	for _, user := range []string{"reader", "nobody"} {
		_, err = cli.UserAdd(t.Context(), user, "pw")
		require.NoError(t, err)
	}
	_, err = cli.UserGrantRole(t.Context(), "reader", "reader")
	require.NoError(t, err)
	require.NoError(t, etcdtest.EnableAuth(t.Context(), cli, "secret"))
	eps := "--endpoints=" + c.Endpoint(0)

	r := runProc(t, nil, "run", eps, "--user", "root:secret", name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)
	r = runProc(t, []string{"ETCDCTL_USER=root", "ETCDCTL_PASSWORD=secret"}, "status", eps, name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "is free")

	r = runProc(t, nil, "run", eps, "--user", "root", "--password", "wrong", name, "--", "true")
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, "authentication failed")
	// No user: etcd says "user name is empty"; we say what to give.
	r = runProc(t, nil, "status", eps, name)
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, "cannot use etcd at")
	requireOneLineError(t, r, "user name is empty): give --user user:password, or set ETCDCTL_USER")

	// "permission denied" names the user and the key refused.
	r = runProc(t, nil, "status", eps, "--user", "nobody:pw", name)
	require.Equal(t, exitConnect, r.code)
	requireOneLineError(t, r, `permission denied: etcd user "nobody" may not read key "`+name+`/" (run and elect need readwrite permission on the keys with prefix "`+name+`/"; status, ls and elect --listen read)`)
	r = runProc(t, nil, "status", eps, "--user", "reader:pw", name)
	require.Equal(t, 0, r.code, r.stderr)
	// ls "" reads every key: said so, without the key "\x00" or a
	// readwrite hint (issue 31).
	r = runProc(t, nil, "ls", eps, "--user", "reader:pw", "")
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, `etcd user "reader" may not read the whole key space, which ls "" lists (a listing needs read permission only: list a PREFIX the user may read)`)
	r = runProc(t, nil, "ls", eps, "--user", "reader:pw", name+"/")
	require.Equal(t, 0, r.code, r.stderr)
	r = runProc(t, nil, "run", eps, "--user", "reader:pw", name, "--", "true")
	require.Equal(t, exitConnect, r.code, "a refused user: the same code from every command (issue 31)")
	requireOneLineError(t, r, `permission denied: etcd user "reader" may not write key "`+name+`/`)
	requireOneLineError(t, r, `(run and elect need readwrite permission on the keys with prefix "`+name+`/"; status, ls and elect --listen read)`)
	// release, refused the write of its request, exits as run does, and
	// says what release needs (issue 31: exit 1, and run's hint).
	p := startProc(t, nil, "run", eps, "--user", "root:secret", name, "--", "sh", "-c", "echo ready; cat >/dev/null")
	p.stdout.waitFor(t, "ready")
	r = runProc(t, nil, "release", eps, "--user", "reader:pw", name)
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, `etcd user "reader" may not write the request key "`+etcdlock.ReleaseRequestPrefix+name+`/" (release needs write permission on the keys with prefix "`+etcdlock.ReleaseRequestPrefix+name+`/", and read permission on the lock's)`)
	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())

	// A user without a password is asked for it on the terminal, with
	// echo off; the terminal is left as it was, also after Ctrl-C.
	t.Run("prompt", func(t *testing.T) {
		term, tty := openPTY(t)
		for i, tc := range []struct {
			typed     string
			interrupt bool // SIGINT at the prompt instead of typing
			code      int
			want      string
		}{
			{"secret", false, 0, "is free"},
			{"wrong", false, exitConnect, "authentication failed"},
			{"", false, exitUsage, `etcdlock: no password typed for etcd user "root"`},
			{"", true, exitSignalBase + int(syscall.SIGINT), "etcdlock: interrupted by SIGINT at the password prompt"},
		} {
			cmd := exec.Command(bin, "status", eps, "--user", "root", name)
			cmd.Env = append(cleanEnv(), "ETCDCTL_DIAL_TIMEOUT=30s")
			stdout, stderr := newSyncBuffer(), newSyncBuffer()
			cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, stdout, stderr
			require.NoError(t, cmd.Start())
			exited := make(chan struct{})
			go func() {
				defer close(exited)
				cmd.Wait()
			}()
			waitWritten(t, stderr, `Password of etcd user "root": `)
			if tc.interrupt {
				require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
			} else {
				_, err := term.WriteString(tc.typed + "\n")
				require.NoError(t, err)
			}
			select {
			case <-exited:
			case <-time.After(procTimeout):
				cmd.Process.Kill()
				<-exited
				t.Fatal("etcdlock still runs after the password")
			}
			out, _ := stdout.read()
			errOut, _ := stderr.read()
			require.Equal(t, tc.code, cmd.ProcessState.ExitCode(), "stderr: %s", errOut)
			require.Contains(t, out+errOut, tc.want)

			// Echo is on again: a marker typed now comes back, and
			// nothing before it did.
			marker := fmt.Sprintf("marker-%d", i)
			_, err := term.WriteString(marker + "\n")
			require.NoError(t, err)
			echoed := readUntil(t, term, marker)
			require.Equal(t, marker, strings.TrimSpace(echoed), "echoed at the prompt")
			readUntil(t, tty, marker) // the next run must not read it
		}
	})
}

// waitWritten waits until b contains s.
func waitWritten(t *testing.T, b *syncBuffer, s string) {
	t.Helper()
	deadline := time.After(procTimeout)
	for {
		got, changed := b.read()
		if strings.Contains(got, s) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %q in %q", s, got)
		}
	}
}

// readUntil reads f until what it read contains s, and returns that.
func readUntil(t *testing.T, f *os.File, s string) string {
	t.Helper()
	require.NoError(t, f.SetReadDeadline(time.Now().Add(procTimeout)))
	var got []byte
	buf := make([]byte, 256)
	for !bytes.Contains(got, []byte(s)) {
		n, err := f.Read(buf)
		got = append(got, buf[:n]...)
		require.NoError(t, err, "read so far: %q", got)
	}
	return string(got)
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader, that
// tells when it was written to.
type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced by each Write
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{changed: make(chan struct{})} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changed)
	b.changed = make(chan struct{})
	return b.buf.Write(p)
}

// read returns the contents and a channel closed by the next Write.
func (b *syncBuffer) read() (string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String(), b.changed
}

// On a terminal the progress is one line, rewritten in place, and cleared
// at the end.
func TestProgressTerminal(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holder, _ := holdLock(t, cli, name)
	w := watchQueue(t, cli, name)
	wt := startWaiter(t, cli, name)
	w.next(t)

	out := newSyncBuffer()
	p := startProgress(cli, name, fmt.Sprintf("lock %q", name), wt.m.Key(), out, true, time.Now())
	want := "\r\x1b[Ketcdlock: waiting for lock \"" + name + "\": queue position 1 of 1, waited "
	deadline := time.After(procTimeout)
	for { // until the line was rewritten in place
		got, changed := out.read()
		if strings.Count(got, want) >= 2 {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("progress: %q", got)
		case <-changed:
		}
	}
	require.True(t, p.stop())
	got, _ := out.read()
	require.NotContains(t, got, "\n")
	require.True(t, strings.HasSuffix(got, "\r\x1b[K"), "line not cleared: %q", got)

	require.NoError(t, holder.Unlock(t.Context()))
	wt.unlock(t)
}

// Durations take a unit or, as etcdctl's --ttl, are seconds.
func TestDurationFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  bool
	}{
		{"10", 10 * time.Second, false},
		{"0", 0, false},
		{"-5", -5 * time.Second, false}, // the command says why it is wrong
		{"1m30s", 90 * time.Second, false},
		{"250ms", 250 * time.Millisecond, false},
		{"1.5", 1500 * time.Millisecond, false},
		{"0.25", 250 * time.Millisecond, false},
		{"1.", 0, true},
		{".5", 0, true},
		{"1e3", 0, true},
		{"soon", 0, true},
		{"", 0, true},
		{"10000000000", 0, true}, // more seconds than a Duration holds
	} {
		var d time.Duration
		err := (*durationFlag)(&d).Set(tc.in)
		if tc.err {
			require.Error(t, err, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		require.Equal(t, tc.want, d, "%q", tc.in)
	}
}

// --ttl 7 and --timeout 1 are seconds, as in etcdctl.
func TestBareSeconds(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p := startProc(t, nil, "run", "--ttl", "7", ep(), name, "--", "sh", "-c", `echo "started $ETCDLOCK_KEY"; cat >/dev/null`)
	waitRecorded(t, cli, strings.Fields(p.stdout.waitFor(t, "started"))[1])

	r := runProc(t, nil, "status", "--json", "--command-timeout", "5", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.NotNil(t, st.Holder)
	require.NotNil(t, st.Holder.LeaseTTL)
	require.Equal(t, int64(7), *st.Holder.LeaseTTL)

	// A fraction of a second: the library rounds the lease's TTL up.
	h := startProc(t, nil, "run", "--ttl", "1.5", ep(), name+"-fraction")
	key := h.stdout.waitFor(t, name+"-fraction/")
	lease, err := strconv.ParseInt(strings.TrimPrefix(key, name+"-fraction/"), 16, 64)
	require.NoError(t, err)
	ttl, err := cli.TimeToLive(t.Context(), clientv3.LeaseID(lease))
	require.NoError(t, err)
	require.EqualValues(t, 2, ttl.GrantedTTL)
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, h.wait(t), h.stderr.String())

	// --lock-delay too rounds up: 0.5 is 1s (it was refused).
	r = runProc(t, nil, "run", "--lock-delay", "0.5", ep(), name+"-delay", "--", "true")
	require.Equal(t, 0, r.code, r.stderr)

	// Below a second, as the help says: rounded up to etcd's first
	// second (issue 43: refused), for run and elect alike.
	for _, cmd := range []string{"run", "elect"} {
		n := name + "-" + cmd
		h := startProc(t, nil, cmd, "--ttl", "0.1", ep(), n)
		key := h.stdout.waitFor(t, n+"/")
		lease, err := strconv.ParseInt(strings.TrimPrefix(key, n+"/"), 16, 64)
		require.NoError(t, err)
		ttl, err := cli.TimeToLive(t.Context(), clientv3.LeaseID(lease))
		require.NoError(t, err)
		require.EqualValues(t, 1, ttl.GrantedTTL, cmd)
		require.NoError(t, h.cmd.Process.Signal(syscall.SIGTERM))
		require.Equal(t, 0, h.wait(t), h.stderr.String())
	}

	r = runProc(t, []string{"ETCDCTL_DIAL_TIMEOUT=30"}, "run", "--timeout", "1", ep(), name, "--", "true")
	require.Equal(t, exitTimeout, r.code, r.stderr)
	require.Contains(t, r.stderr, "etcdlock: timed out after 1s waiting for lock")

	p.stdin.Close()
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// --command-timeout bounds status's reads and run's start of a session
// (not the dial): answers slower than it fail the command; the default of
// 5s lets them through.
func TestCommandTimeout(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	px := etcdtest.NewProxy(t, endpoint)
	px.DelayAnswers(1200 * time.Millisecond) // longer than 1s, far below 5s
	eps := "--endpoints=" + px.URL()

	r := runProc(t, nil, "status", "--command-timeout", "1s", eps, name)
	require.Equal(t, exitFailure, r.code, r.stderr)
	requireOneLineError(t, r, fmt.Sprintf("read lock %q: no answer from etcd within 1s (--command-timeout)", name))

	r = runProc(t, nil, "status", eps, name)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "is free")

	r = runProc(t, nil, "run", "--command-timeout", "1s", eps, name, "--", "echo", "ran")
	require.Equal(t, exitFailure, r.code, r.stderr)
	requireOneLineError(t, r, "start a session: no answer from etcd within 1s (--command-timeout)")
	require.NotContains(t, r.stdout, "ran")
	r = runProc(t, nil, "run", eps, name, "--", "echo", "ran")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "ran")

	for _, v := range []string{"0", "-1s"} {
		r = runProc(t, nil, "status", "--command-timeout", v, eps, name)
		require.Equal(t, exitUsage, r.code, r.stderr)
		requireOneLineError(t, r, "--command-timeout must be positive")
	}
}

// --insecure-skip-tls-verify connects to an etcd whose certificate is not
// trusted, with or without https:// in the endpoint (as etcdctl: the flag
// alone turns TLS on); without it, or --cacert, the connection fails.
func TestInsecureSkipTLSVerify(t *testing.T) {
	t.Parallel()
	addr := startTLSEtcd(t)
	name := lockName(t)
	https := "--endpoints=https://" + addr

	r := runProc(t, nil, "status", https, "--dial-timeout", "2s", name)
	require.Equal(t, exitConnect, r.code, r.stderr)

	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{https, "--insecure-skip-tls-verify"}},
		{nil, []string{"--endpoints=" + addr, "--insecure-skip-tls-verify"}},
		{[]string{"ETCDCTL_INSECURE_SKIP_TLS_VERIFY=true"}, []string{https}},
	} {
		r := runProc(t, tc.env, append(append([]string{"status"}, tc.args...), name)...)
		require.Equal(t, 0, r.code, "%q %q: %s", tc.env, tc.args, r.stderr)
		require.Contains(t, r.stdout, "is free")
	}
	r = runProc(t, nil, "run", https, "--insecure-skip-tls-verify", name, "--", "true")
	require.Equal(t, 0, r.code, r.stderr)

	// http:// at a TLS port: the reason, not only the timeout (issue 31).
	r = runProc(t, nil, "status", "--endpoints=http://"+addr, "--dial-timeout", "2s", name)
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, addr+" speaks TLS: give https://"+addr+" (and --cacert, or --insecure-skip-tls-verify)")
}

// startTLSEtcd starts a one-member etcd that serves clients over TLS with a
// self-signed certificate for 127.0.0.1, stopped at the end of the test,
// and returns its client address host:port.
func startTLSEtcd(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "etcdlock test server"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))

	return startEmbedTLS(t, dir, transport.TLSInfo{CertFile: certFile, KeyFile: keyFile})
}

// startEmbedTLS starts a one-member etcd in dir that serves clients over
// TLS as tlsInfo says, stopped at the end of the test, and returns its
// client address host:port.
func startEmbedTLS(t *testing.T, dir string, tlsInfo transport.TLSInfo) string {
	t.Helper()
	clientURL := url.URL{Scheme: "https", Host: freeAddr(t)}
	peerURL := url.URL{Scheme: "http", Host: freeAddr(t)}
	cfg := embed.NewConfig()
	cfg.Name = "tls"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.ClientTLSInfo = tlsInfo
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	require.NoError(t, err)
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("TLS etcd: %v", err)
	case <-time.After(procTimeout):
		t.Fatal("TLS etcd not ready")
	}
	return clientURL.Host
}

// freeAddr returns a loopback address with a port free at the time.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestCertUser: a user authenticated by the common name of its client
// certificate (etcd's --client-cert-auth) is named by it when etcd
// refuses it permission (issue 31: it was shown as etcd user "").
func TestCertUser(t *testing.T) {
	t.Parallel()
	addr, ca, certs := startMTLSEtcd(t, "root", "alice")
	root, err := clientv3.New(clientv3.Config{Endpoints: []string{"https://" + addr}, TLS: certs["root"].tls(t, ca), DialTimeout: procTimeout})
	require.NoError(t, err)
	defer root.Close()
	_, err = root.UserAdd(t.Context(), "alice", "unused")
	require.NoError(t, err)
	require.NoError(t, etcdtest.EnableAuth(t.Context(), root, "secret"))

	name := lockName(t)
	r := runProc(t, nil, "status", "--endpoints=https://"+addr, "--cacert", ca, "--cert", certs["alice"].cert, "--key", certs["alice"].key, name)
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, `permission denied: etcd user "alice" may not read key "`+name+`/"`)

	// --cacert without a client certificate, against a server that
	// requires one: the reason, not only the timeout (issue 31).
	r = runProc(t, nil, "status", "--endpoints=https://"+addr, "--cacert", ca, "--dial-timeout", "2s", name)
	require.Equal(t, exitConnect, r.code, r.stderr)
	requireOneLineError(t, r, addr+" requires a client certificate: give --cert and --key")
}

// A certKeyPair is a certificate file and its key file.
type certKeyPair struct{ cert, key string }

// tls returns a client TLS configuration with p, trusting ca.
func (p certKeyPair) tls(t *testing.T, ca string) *tls.Config {
	t.Helper()
	cfg, err := transport.TLSInfo{CertFile: p.cert, KeyFile: p.key, TrustedCAFile: ca}.ClientConfig()
	require.NoError(t, err)
	return cfg
}

// startMTLSEtcd starts a one-member etcd that serves clients over TLS and
// takes a client certificate's common name as its user
// (--client-cert-auth), stopped at the end of the test. It returns its
// client address host:port, its CA's file, and a client certificate for
// each common name given.
func startMTLSEtcd(t *testing.T, names ...string) (string, string, map[string]certKeyPair) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdlock test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	ca := filepath.Join(dir, "ca.pem")
	require.NoError(t, os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage) certKeyPair {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalECPrivateKey(key)
		require.NoError(t, err)
		p := certKeyPair{filepath.Join(dir, cn+".pem"), filepath.Join(dir, cn+"-key.pem")}
		require.NoError(t, os.WriteFile(p.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
		require.NoError(t, os.WriteFile(p.key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
		return p
	}
	server := issue(2, "etcdlock test server", x509.ExtKeyUsageServerAuth)
	certs := map[string]certKeyPair{}
	for i, n := range names {
		certs[n] = issue(int64(3+i), n, x509.ExtKeyUsageClientAuth)
	}

	addr := startEmbedTLS(t, dir, transport.TLSInfo{CertFile: server.cert, KeyFile: server.key, TrustedCAFile: ca, ClientCertAuth: true})
	return addr, ca, certs
}
