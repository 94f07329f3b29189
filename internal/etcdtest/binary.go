package etcdtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"sync"
)

// Environment variables that choose the etcd server the tests run against.
const (
	// EnvBinary names an etcd server binary to run (for example Debian's
	// /usr/bin/etcd). It takes precedence over EnvVersion.
	EnvBinary = "ETCDLOCK_TEST_ETCD"
	// EnvVersion names the etcd release line to build and run, as the
	// directory under internal/etcdserver: "3.5", "3.6" or "3.7".
	EnvVersion = "ETCDLOCK_TEST_ETCD_VERSION"
)

// DefaultVersion is the release line the tests run against when neither
// EnvBinary nor EnvVersion is set.
const DefaultVersion = "3.7"

var binary struct {
	once sync.Once
	path string
	err  error
}

// Binary returns the path of the etcd server binary the tests run: the one
// EnvBinary names, or else the release line EnvVersion names (DefaultVersion
// when unset), built once from internal/etcdserver/v<line> (a module of its
// own that pins one etcd release, fetched from the Go module proxy) and kept
// in the user's cache directory. The first build takes a few minutes; later
// ones find the binary there.
func Binary() (string, error) {
	binary.once.Do(func() { binary.path, binary.err = findBinary() })
	return binary.path, binary.err
}

func findBinary() (string, error) {
	if bin := os.Getenv(EnvBinary); bin != "" {
		path, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("etcdtest: %s=%s: %w", EnvBinary, bin, err)
		}
		return path, nil
	}
	line := os.Getenv(EnvVersion)
	if line == "" {
		line = DefaultVersion
	}
	src, err := sourceDir(line)
	if err != nil {
		return "", err
	}
	return build(src, line)
}

// sourceDir returns the directory of the module that builds the etcd
// release line, next to this package in the source tree.
func sourceDir(line string) (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("etcdtest: cannot locate the source tree")
	}
	root := filepath.Join(filepath.Dir(file), "..", "etcdserver")
	dir := filepath.Join(root, "v"+strings.TrimPrefix(line, "v"))
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		lines, _ := filepath.Glob(filepath.Join(root, "v*"))
		for i := range lines {
			lines[i] = strings.TrimPrefix(filepath.Base(lines[i]), "v")
		}
		sort.Strings(lines)
		return "", fmt.Errorf("etcdtest: %s=%s: no such release line (have %s)", EnvVersion, line, strings.Join(lines, ", "))
	}
	return dir, nil
}

// build builds the module in src into the cache, once per content of its
// go.mod, go.sum and main.go, and returns the binary's path. Test binaries
// of several packages may build at once: a lock file makes one build and
// the others wait for it.
func build(src, line string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("etcdtest: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "etcdlock-test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	bin := filepath.Join(dir, fmt.Sprintf("etcd-v%s-%s", line, hex.EncodeToString(h.Sum(nil))[:12]))
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	unlock, err := lockFile(bin + ".lock")
	if err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another test binary built it meanwhile
	}
	gocmd, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("etcdtest: building etcd %s needs the go command: %w", line, err)
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	cmd := exec.Command(gocmd, "build", "-trimpath", "-o", tmp, ".")
	cmd.Dir = src
	// The module is built on its own, with its own go.sum, whatever
	// workspace or flags the tests run with; a toolchain the module needs
	// is fetched like any other module.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly", "CGO_ENABLED=0", "GOTOOLCHAIN=auto")
	out, err := cmd.CombinedOutput()
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("etcdtest: build etcd %s in %s: %w\n%s", line, src, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	return bin, nil
}

var versionRE = regexp.MustCompile(`etcd Version: (\S+)`)

// binaryVersion asks the binary for its version.
func binaryVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("etcdtest: %s --version: %w\n%s", bin, err, out)
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("etcdtest: %s --version printed no version:\n%s", bin, out)
	}
	return string(m[1]), nil
}
