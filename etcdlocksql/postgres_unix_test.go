//go:build unix

package etcdlocksql_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

// pgServer is a running PostgreSQL server.
type pgServer struct {
	dir    string // temporary: data, socket, log
	bin    string // directory of initdb, postgres, psql
	port   int
	cmd    *exec.Cmd
	exited chan struct{} // closed when postgres has exited
	cred   *syscall.Credential
}

// postgresBin returns the directory of initdb and postgres: the variable's,
// or the newest /usr/lib/postgresql/N/bin; "" if there is none.
func postgresBin() string {
	if d := os.Getenv(postgresBinEnv); d != "" {
		return d
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest first: 16 before 15 (numerically, not as strings).
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// startPostgres starts a server, or returns nil and why not if none is
// installed.
func startPostgres() (*pgServer, string, error) {
	bin := postgresBin()
	if bin == "" {
		return nil, "no PostgreSQL binaries: install Debian's postgresql package, or set " + postgresBinEnv, nil
	}
	dir, err := os.MkdirTemp("", "etcdlocksql-postgres-")
	if err != nil {
		return nil, "", err
	}
	s := &pgServer{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			os.RemoveAll(dir)
			return nil, "", fmt.Errorf("running as root, PostgreSQL needs an unprivileged user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, "", err
		}
	}
	if err := s.start(); err != nil {
		s.stop()
		return nil, "", err
	}
	return s, "", nil
}

func (s *pgServer) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C", "PGTZ=UTC")
	cmd.SysProcAttr = sysProcAttr(s.cred)
	return cmd
}

func (s *pgServer) start() error {
	data := filepath.Join(s.dir, "data")
	initdb := s.command("initdb", "-D", data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	port, err := etcdtest.FreePort()
	if err != nil {
		return err
	}
	s.port = port
	logf, err := os.Create(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		return err
	}
	// fsync off: nothing here needs to survive a crash of the machine.
	s.cmd = s.command("postgres", "-D", data, "-p", strconv.Itoa(port),
		"-k", s.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
		"-c", "max_connections=200")
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("postgres: %w", err)
	}
	s.exited = make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		logf.Close()
		close(s.exited)
	}()
	return s.waitReady(30 * time.Second)
}

// waitReady waits until the server accepts a query.
func (s *pgServer) waitReady(timeout time.Duration) error {
	db, err := sql.Open("pgx", s.dsn("postgres"))
	if err != nil {
		return err
	}
	defer db.Close()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("postgres exited: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres not ready after %v: %w\n%s", timeout, err, s.logTail())
		}
	}
}

// dsn returns the URL of database name on the server, over TCP.
func (s *pgServer) dsn(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.port, name)
}

func (s *pgServer) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "postgres.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// stop shuts the server down (SIGINT, PostgreSQL's fast shutdown), waits
// for it, and removes its directory.
func (s *pgServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-s.exited:
		case <-time.After(20 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	os.RemoveAll(s.dir)
}
