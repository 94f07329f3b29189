//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// forgedRow is a row of ls as a lock name of the operator's report (issue
// 43) wrote it into the table.
const forgedRow = "jobs/backup  etcdlock run sleep, pid 1 on vm  8s  0"

// requireSafeText checks that out, what etcdlock wrote, is valid UTF-8 of
// printable characters, spaces and newlines only: no escape sequence,
// carriage return, tab, C1 or bidi control reaches the terminal, and no
// line is one that a name or an identity wrote.
func requireSafeText(t *testing.T, what, out string) {
	t.Helper()
	require.True(t, utf8.ValidString(out), "%s: invalid UTF-8: %q", what, out)
	for _, r := range out {
		require.True(t, r == '\n' || r == ' ' || strconv.IsPrint(r), "%s: %U in %q", what, r, out)
	}
	require.NotRegexp(t, `(?m)^jobs/backup|^leader "x"|^second line`, out, "%s: a forged line", what)
}

// TestTextCannotBeForged: names, keys, identities, hosts and commands from
// etcd reach the text output quoted where they are not plain (issue 43): a
// name with a newline adds no row to ls, status or the watches, and a
// name or identity with an escape sequence never reaches the terminal.
func TestTextCannotBeForged(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	pfx := lockName(t) + "/"
	forged := pfx + "sp/evil\n" + forgedRow
	clear := pfx + "clear\x1b[2J"
	bidi := pfx + "rtl\u202etxt.exe"
	c1 := pfx + "c1\u009b2J\x7f"

	// forged: held by a record like etcdlock run's whose host and
	// command forge rows and clear the screen, with a waiter whose
	// identity does the same.
	rec, err := json.Marshal(runRecord{Queued: time.Now().UTC(), whoJSON: whoJSON{Host: "vm\n" + forgedRow, PID: 1, Command: "sleep\x1b[2J\r"}})
	require.NoError(t, err)
	require.NoError(t, identityMutex(t, cli, forged, string(rec)).Lock(t.Context()))
	waiter := identityMutex(t, cli, forged, "worker\n"+forgedRow+"\x1b]0;pwned\x07")
	go waiter.Lock(t.Context()) //nolint:errcheck // ends with the session
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, forged)) == 2 }, procTimeout, 10*time.Millisecond)
	// clear: no identity, so its key names it; bidi: an identity that
	// reads backwards.
	holdLock(t, cli, clear)
	require.NoError(t, identityMutex(t, cli, bidi, "\u202eiam").Lock(t.Context()))
	// c1: an election whose leader's value forges an elect --listen line.
	require.NoError(t, etcdlock.NewElection(newSession(t, cli), c1).Campaign(t.Context(), "v\x1b[2J\nleader \"x\""))

	r := runProc(t, nil, "ls", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	requireSafeText(t, "ls", r.stdout)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 2+4, r.stdout)
	for _, name := range []string{forged, clear, bidi, c1} {
		require.Contains(t, r.stdout, strconv.Quote(name)+"  ", "ls shows the name quoted")
	}
	require.Contains(t, r.stdout, `etcdlock run "sleep\x1b[2J\r", pid 1 on "vm\n`+forgedRow+`"`)
	require.Contains(t, r.stdout, strconv.Quote("\u202eiam"))

	for _, name := range []string{forged, clear, bidi, c1} {
		r := runProc(t, nil, "status", ep(), name)
		require.Equal(t, 0, r.code, r.stderr)
		requireSafeText(t, "status", r.stdout)
		require.True(t, strings.HasPrefix(r.stdout, "lock "+strconv.Quote(name)+" is held"), r.stdout)
	}
	r = runProc(t, nil, "status", ep(), forged)
	require.Contains(t, r.stdout, "\nwaiter 1: "+strconv.Quote("worker\n"+forgedRow+"\x1b]0;pwned\x07")+"\n")
	require.Contains(t, r.stdout, `holder: etcdlock run running "sleep\x1b[2J\r" as pid 1 on "vm\n`+forgedRow+`"`)

	// The watches, as lines into a pipe: the state, then a change.
	lw := startProc(t, nil, "ls", "--watch", ep(), pfx)
	sw := startProc(t, nil, "status", "--watch", ep(), forged)
	waitLines(t, lw.stdout, 4)
	waitLines(t, sw.stdout, 1)
	another := identityMutex(t, cli, forged, "x")
	go another.Lock(t.Context()) //nolint:errcheck // ends with the session
	lw.stdout.waitFor(t, "joined")
	sw.stdout.waitFor(t, "joined")
	stopWatch(t, lw)
	stopWatch(t, sw)
	requireSafeText(t, "ls --watch", lw.stdout.String())
	requireSafeText(t, "status --watch", sw.stdout.String())
	require.Len(t, strings.Split(strings.TrimSuffix(lw.stdout.String(), "\n"), "\n"), 5, lw.stdout.String())
	require.Len(t, strings.Split(strings.TrimSuffix(sw.stdout.String(), "\n"), "\n"), 2, sw.stdout.String())

	// run: the message of a lock held, and the progress while waiting.
	r = runProc(t, nil, "run", "--try", ep(), forged, "--", "true")
	require.Equal(t, exitHeld, r.code, r.stderr)
	requireOneLineError(t, r, `is held by etcdlock run "sleep\x1b[2J\r", pid 1 on "vm\n`)
	requireSafeText(t, "run --try", r.stderr)
	p := startProc(t, nil, "run", ep(), clear, "--", "true")
	p.stderr.waitFor(t, "held by "+strings.TrimSuffix(strconv.Quote(clear+"/"), `"`))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+15, p.wait(t), p.stderr.String())
	requireSafeText(t, "run's progress", p.stderr.String())

	// elect --listen quotes the value, and the key.
	l := startProc(t, nil, "elect", "--listen", ep(), c1)
	line := l.stdout.waitLine(t, 0)
	stopWatch(t, l)
	require.Regexp(t, `^leader "v\\x1b\[2J\\nleader \\"x\\"" \(key "`+regexp.QuoteMeta(strconv.Quote(c1)[1:len(strconv.Quote(c1))-1])+`/[0-9a-f]+", token \d+, revision \d+\)$`, line)
	requireSafeText(t, "elect --listen", l.stdout.String())

	r = runProc(t, nil, "release", ep(), clear)
	require.Equal(t, 0, r.code, r.stderr)
	requireSafeText(t, "release", r.stdout)

	// grants: a shell line each, that a shell reads back to the name.
	r = runProc(t, nil, "grants", "--role", "ops", forged)
	require.Equal(t, 0, r.code, r.stderr)
	requireSafeText(t, "grants", r.stdout)
	require.Equal(t, 1, strings.Count(r.stdout, "\n"), r.stdout)
	if bash, err := exec.LookPath("bash"); err == nil {
		words := strings.TrimPrefix(strings.TrimSpace(r.stdout), "etcdctl role grant-permission ops readwrite --prefix ")
		out, err := exec.Command(bash, "-c", "printf %s "+words).Output()
		require.NoError(t, err)
		require.Equal(t, forged+"/", string(out))
	}
}

// safeText leaves a plain name as it is, and quotes any other so that it
// reads back.
func TestSafeText(t *testing.T) {
	for _, s := range []string{"jobs/backup", "a-b_c.d:e@f", "día/ñ", "日本"} {
		require.Equal(t, s, safeText(s))
	}
	for _, s := range []string{"", "a b", `"q"`, `a\b`, "a\nb", "a\tb", "\x1b[2J", "a\x7f", "\u009b", "\u202e", "\xff", "\ufffd", "\u00a0"} {
		q := safeText(s)
		require.True(t, strings.HasPrefix(q, `"`), "%q shown as %s", s, q)
		back, err := strconv.Unquote(q)
		require.NoError(t, err)
		require.Equal(t, s, back)
		requireSafeText(t, q, q)
	}
}

// A name or key that is not valid UTF-8 reads back from the JSON of ls,
// status, status --watch and elect --listen: its bytes are in base64
// beside it (issue 43: JSON had U+FFFD for them, and a script could not
// address the lock). A plain name has no such field.
func TestJSONInvalidUTF8(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	pfx := lockName(t) + "/"
	name, plain, election := pfx+"bin\xff", pfx+"plain", pfx+"vote\xfe"
	m, _ := holdLock(t, cli, name)
	holdLock(t, cli, plain)
	require.NoError(t, etcdlock.NewElection(newSession(t, cli), election).Campaign(t.Context(), "v"))
	unbase64 := func(s string) string {
		t.Helper()
		b, err := base64.StdEncoding.DecodeString(s)
		require.NoError(t, err)
		return string(b)
	}

	r := runProc(t, nil, "ls", "--json", ep(), pfx)
	require.Equal(t, 0, r.code, r.stderr)
	var ls lsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &ls))
	require.Len(t, ls.Locks, 3)
	bin := ls.Locks[0]
	require.Equal(t, name, unbase64(bin.NameBase64))
	require.Equal(t, m.Key(), unbase64(bin.Holders[0].KeyBase64))
	require.Empty(t, ls.Locks[1].NameBase64)
	require.Equal(t, 2, strings.Count(r.stdout, `"name_base64"`), "the name and the election's, not the plain one's")

	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, name, unbase64(st.NameBase64))
	require.Equal(t, m.Key(), unbase64(st.Holder.KeyBase64))

	w := startProc(t, nil, "status", "--watch", "--json", ep(), name)
	w.stdout.waitLine(t, 0)
	waiter := startWaiter(t, cli, name)
	var change statusWatchJSON
	require.NoError(t, json.Unmarshal([]byte(w.stdout.waitLine(t, 1)), &change))
	stopWatch(t, w)
	require.Equal(t, waiter.m.Key(), unbase64(change.Changes[0].KeyBase64))
	require.Equal(t, waiter.m.Key(), unbase64(change.Waiters[0].KeyBase64))

	l := startProc(t, nil, "elect", "--listen", "--json", ep(), election)
	var leader leaderJSON
	require.NoError(t, json.Unmarshal([]byte(l.stdout.waitLine(t, 0)), &leader))
	stopWatch(t, l)
	require.True(t, strings.HasPrefix(unbase64(leader.KeyBase64), election+"/"), leader.KeyBase64)
}
