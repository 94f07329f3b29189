package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
)

// artifactsEnv names the directory where tests leave what a person
// looks at afterwards (the page's screenshots); CI sets it to its logs.
// Without it they go to a temporary directory that is kept, and logged.
const artifactsEnv = "ETCDLOCK_TEST_ARTIFACTS"

// artifactPath returns where the test's artifact file name goes.
func artifactPath(t *testing.T, file string) string {
	t.Helper()
	dir := os.Getenv(artifactsEnv)
	if dir == "" {
		var err error
		dir, err = os.MkdirTemp("", "etcdlock-artifacts-")
		require.NoError(t, err)
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+file)
}

// webDriver is a session of a headless Chromium driven by chromedriver
// over the W3C WebDriver protocol (plain HTTP and JSON).
type webDriver struct {
	base string // chromedriver's URL + "session/<id>/"
}

// startBrowser starts chromedriver and a headless Chromium session, both
// ended at the end of the test. It skips the test when either is missing,
// unless ETCDLOCK_TEST_REQUIRE_CHROMIUM is set (CI sets it).
func startBrowser(t *testing.T) *webDriver {
	t.Helper()
	const require_ = "ETCDLOCK_TEST_REQUIRE_CHROMIUM"
	driver := toolBinary(t, "chromedriver", "ETCDLOCK_TEST_CHROMEDRIVER", require_, "Debian's chromium-driver package has one")
	browser := toolBinary(t, "chromium", "ETCDLOCK_TEST_CHROMIUM", require_, "Debian's chromium package has one")
	port, err := etcdtest.FreePort()
	require.NoError(t, err)
	var log bytes.Buffer
	cmd := exec.Command(driver, fmt.Sprintf("--port=%d", port))
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("chromedriver's log:\n%s", log.String())
		}
	})
	root := fmt.Sprintf("http://127.0.0.1:%d/", port)
	eventually(t, "chromedriver ready", func() (bool, string) {
		resp, err := http.Get(root + "status")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		var st struct {
			Value struct{ Ready bool } `json:"value"`
		}
		json.NewDecoder(resp.Body).Decode(&st)
		return st.Value.Ready, resp.Status
	})
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName": "chrome",
		"goog:chromeOptions": map[string]any{
			"binary": browser,
			// A root user (CI) has no sandbox; /dev/shm may be small.
			"args": []string{"--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1100,800", "--user-data-dir=" + t.TempDir()},
		},
	}}}
	var created struct {
		Value struct {
			SessionID string `json:"sessionId"`
		} `json:"value"`
	}
	wdCall(t, http.MethodPost, root+"session", caps, &created)
	require.NotEmpty(t, created.Value.SessionID)
	wd := &webDriver{base: root + "session/" + created.Value.SessionID + "/"}
	t.Cleanup(func() { wdCall(t, http.MethodDelete, strings.TrimSuffix(wd.base, "/"), nil, nil) })
	return wd
}

// wdCall sends a WebDriver command and decodes its answer into out.
func wdCall(t *testing.T, method, url string, in, out any) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		require.NoError(t, err)
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s %s: %s", method, url, b)
	if out != nil {
		require.NoError(t, json.Unmarshal(b, out), "%s", b)
	}
}

// open navigates to url.
func (wd *webDriver) open(t *testing.T, url string) {
	t.Helper()
	wdCall(t, http.MethodPost, wd.base+"url", map[string]string{"url": url}, nil)
}

// run runs script in the page and returns what it returns, as JSON
// decodes it.
func (wd *webDriver) run(t *testing.T, script string) any {
	t.Helper()
	var out struct {
		Value any `json:"value"`
	}
	wdCall(t, http.MethodPost, wd.base+"execute/sync", map[string]any{"script": script, "args": []any{}}, &out)
	return out.Value
}

// text is the page's text as a person sees it (innerText: rendered,
// visible text only).
func (wd *webDriver) text(t *testing.T) string {
	t.Helper()
	s, _ := wd.run(t, "return document.body.innerText").(string)
	return s
}

// screenshot saves a PNG of the page as the test's artifact file, and
// returns its path.
func (wd *webDriver) screenshot(t *testing.T, file string) string {
	t.Helper()
	var out struct {
		Value string `json:"value"`
	}
	wdCall(t, http.MethodGet, wd.base+"screenshot", nil, &out)
	png, err := base64.StdEncoding.DecodeString(out.Value)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "a PNG")
	path := artifactPath(t, file)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s", path)
	return path
}

// TestServePage (issue 40): headless Chromium loads serve's page, and what
// a person sees is the queue: the holder, who it is, the waiter in line.
// After a handover the page shows the new holder, with no reload (a mark
// set in the page before survives), and says the lock is held. A
// screenshot of each state is kept as an artifact.
func TestServePage(t *testing.T) {
	t.Parallel()
	wd := startBrowser(t)
	cli := newClient(t)
	prefix := lockName(t) + "/"
	name := prefix + "reports"
	// The holder: etcdlock run, which records who it is; the waiter: a
	// Mutex of the library.
	holder := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", "echo ready; exec cat >/dev/null")
	holder.stdout.waitFor(t, "ready")
	base, _ := startServe(t, prefix)
	w := startWaiter(t, cli, name)

	wd.open(t, base)
	eventually(t, "the page shows the holder and the waiter", func() (bool, string) {
		s := wd.text(t)
		return strings.Contains(s, name) && strings.Contains(s, "holder: etcdlock run sh, pid ") && strings.Contains(s, w.m.Key()), s
	})
	text := wd.text(t)
	require.Contains(t, text, "live, etcd revision ")
	require.Regexp(t, `held for \d+s`, text)
	wd.screenshot(t, "before.png")
	wd.run(t, "window.etcdlockTestMark = 'before'; return null")

	holder.stdin.Close() // CMD exits: run releases, the waiter holds
	require.Equal(t, 0, holder.wait(t), holder.stderr.String())
	eventually(t, "the page shows the handover", func() (bool, string) {
		s := wd.text(t)
		held := strings.Index(s, "holder: ")
		return held >= 0 && strings.Contains(s[held:], w.m.Key()) && !strings.Contains(s, "etcdlock run sh"), s
	})
	require.Equal(t, "before", wd.run(t, "return window.etcdlockTestMark"), "the page was not reloaded")
	wd.screenshot(t, "after.png")
	w.unlock(t)
	eventually(t, "the page shows no locks", func() (bool, string) {
		s := wd.text(t)
		return strings.Contains(s, "no locks"), s
	})
}
