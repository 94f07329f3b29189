package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/stretchr/testify/require"
)

// shardScript is a shard's CMD for the tests: it appends "start SHARD
// TOKEN PID TIME_NS LEASE" to $LOG when it starts and, on SIGTERM, "end
// ..." with the same fields; otherwise it sleeps. Each line is one short
// write to a file opened with O_APPEND (the shell's >>), so that lines of
// many CMDs never mix. The time is taken before the write: a start's is
// after its shard was taken, an end's before CMD exits, and so before the
// shard is released.
const shardScript = `trap 'echo "end $ETCDLOCK_SHARD $ETCDLOCK_TOKEN $$ $(date +%s%N) $ETCDLOCK_LEASE" >>"$LOG"; kill $! 2>/dev/null; exit 0' TERM
echo "start $ETCDLOCK_SHARD $ETCDLOCK_TOKEN $$ $(date +%s%N) $ETCDLOCK_LEASE" >>"$LOG"
sleep 1000 &
wait
`

// A shardEvent is a line of the shards' log.
type shardEvent struct {
	start bool
	shard int
	token int64
	pid   int
	at    time.Time
	lease string
}

// readShardLog reads the log that shardScript writes.
func readShardLog(t *testing.T, path string) []shardEvent {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var evs []shardEvent
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 || !strings.HasSuffix(line, f[5]) {
			continue // a line being written
		}
		shard, err1 := strconv.Atoi(f[1])
		token, err2 := strconv.ParseInt(f[2], 10, 64)
		pid, err3 := strconv.Atoi(f[3])
		ns, err4 := strconv.ParseInt(f[4], 10, 64)
		require.NoError(t, cmpErr(err1, err2, err3, err4), "log line %q", line)
		require.Contains(t, []string{"start", "end"}, f[0], "log line %q", line)
		evs = append(evs, shardEvent{start: f[0] == "start", shard: shard, token: token, pid: pid, at: time.Unix(0, ns), lease: f[5]})
	}
	return evs
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// running returns the CMDs of the log that started and have not ended, by
// pid.
func running(evs []shardEvent) map[int]shardEvent {
	run := map[int]shardEvent{}
	for _, e := range evs {
		if e.start {
			run[e.pid] = e
		} else {
			delete(run, e.pid)
		}
	}
	return run
}

// shardsStatus reads the shard set through 'etcdlock shards status --json'.
func shardsStatus(t *testing.T, name string, n int) shardsJSON {
	t.Helper()
	r := runProc(t, nil, "shards", "status", ep(), "--json", name, "--count", strconv.Itoa(n))
	require.Equal(t, 0, r.code, r.stderr)
	var st shardsJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st), r.stdout)
	return st
}

// memberOf returns the ID of the member that process p is, from its
// record in the set.
func memberOf(t *testing.T, st shardsJSON, p *proc) string {
	t.Helper()
	for _, m := range st.Members {
		if m.PID == p.cmd.Process.Pid {
			return m.ID
		}
	}
	t.Fatalf("pid %d is no member of %q: %+v", p.cmd.Process.Pid, st.Name, st.Members)
	return ""
}

// waitShards waits until done holds for the set, read through status.
func waitShards(t *testing.T, name string, n int, what string, done func(st shardsJSON) bool) shardsJSON {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for {
		st := shardsStatus(t, name, n)
		if done(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v; last read: %+v", what, procTimeout, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// owns returns how many shards each member owns, settled (none moving)
// and every shard owned; nil when not.
func owns(st shardsJSON) map[string]int {
	if st.Moving > 0 {
		return nil
	}
	per := map[string]int{}
	for _, sh := range st.Shards {
		if sh.Owner == "" {
			return nil
		}
		per[sh.Owner]++
	}
	return per
}

// startShards starts a replica of shard set name of n shards, running
// shardScript with its log at log.
func startShards(t *testing.T, name string, n int, log string, args ...string) *proc {
	t.Helper()
	script := writeScript(t, t.TempDir(), "shard.sh", shardScript)
	args = append(append([]string{"shards", ep(), "--ttl", "5"}, args...), name, "--count", strconv.Itoa(n), "--", script)
	return startProc(t, []string{"LOG=" + log}, args...)
}

// CMD finds its shard in its environment, runs once for each shard the
// replica owns, and SIGTERM to etcdlock stops every CMD, releases every
// shard and leaves the set: exit 0.
func TestShardsEnv(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	p := startProc(t, nil, "shards", ep(), "--quiet", name, "--count", "3", "--", "sh", "-c",
		`echo "$ETCDLOCK_NAME $ETCDLOCK_SHARD $ETCDLOCK_SHARDS $ETCDLOCK_TOKEN $ETCDLOCK_KEY $ETCDLOCK_LEASE"; exec sleep 1000`)
	st := waitShards(t, name, 3, "3 shards owned", func(st shardsJSON) bool { return owns(st) != nil })
	me := memberOf(t, st, p)
	for i := range 3 {
		line := p.stdout.waitFor(t, fmt.Sprintf("%s %d 3 ", name, i))
		want := fmt.Sprintf("%s %d 3 %d %s/%d/%s %s", name, i, st.Shards[i].Token, name, i, me, me)
		require.Equal(t, want, line)
	}
	require.Len(t, st.Members, 1)
	require.Equal(t, 3, st.Members[0].Owns)
	require.Equal(t, "etcdlock-shards", st.Members[0].By)
	time.Sleep(time.Second) // no CMD exits, so none starts again
	require.Len(t, strings.Split(strings.TrimSpace(p.stdout.String()), "\n"), 3, p.stdout.String())

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t), p.stderr.String()) // wait: every CMD gone too
	require.Contains(t, p.stderr.String(), "leaving the shard set")
	require.Empty(t, queueKeys(t, newClient(t), name+"/members"))
	for i := range 3 {
		require.Empty(t, queueKeys(t, newClient(t), fmt.Sprintf("%s/%d", name, i)))
	}
}

// A replica that joins takes its share: each shard that moves is stopped
// on its old owner (its CMD got SIGTERM and wrote its end) before it
// starts on the new one, with a higher token. Drained, the new replica
// hands every shard back and keeps none.
func TestShardsMoveAndDrain(t *testing.T) {
	t.Parallel()
	const n = 8
	name := lockName(t)
	log := filepath.Join(t.TempDir(), "log")
	a := startShards(t, name, n, log)
	st := waitShards(t, name, n, "a owns all", func(st shardsJSON) bool { return len(owns(st)) == 1 })
	aID := memberOf(t, st, a)

	b := startShards(t, name, n, log, "--identity", "b")
	st = waitShards(t, name, n, "a and b own half each", func(st shardsJSON) bool {
		per := owns(st)
		return len(per) == 2 && per[aID] == n/2
	})
	bID := memberOf(t, st, b)
	require.Equal(t, "b", st.Members[slices.IndexFunc(st.Members, func(m shardMemberJSON) bool { return m.ID == bID })].Name)
	requireHandedOver(t, log, aID, bID, n/2)

	r := runProc(t, nil, "shards", "drain", ep(), name, bID)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "drained "+bID)
	st = waitShards(t, name, n, "b drained", func(st shardsJSON) bool {
		per := owns(st)
		return len(per) == 1 && per[aID] == n
	})
	for _, m := range st.Members {
		if m.ID == bID {
			require.Equal(t, 0, m.Weight)
			require.Equal(t, 0, m.Owns)
		}
	}
	requireHandedOver(t, log, bID, aID, n/2)
	require.Eventually(t, func() bool {
		for _, e := range running(readShardLog(t, log)) {
			if e.lease == bID {
				return false
			}
		}
		return true
	}, procTimeout, 20*time.Millisecond, "b's CMDs still run")
	require.Contains(t, b.stderr.String(), "moves to another replica; sending it SIGTERM")

	// Its weight back, b takes its share again.
	r = runProc(t, nil, "shards", "weight", ep(), name, bID, "100")
	require.Equal(t, 0, r.code, r.stderr)
	waitShards(t, name, n, "b back", func(st shardsJSON) bool { return owns(st)[bID] == n/2 })
}

// requireHandedOver waits until the log shows moved shards gone from one
// member to another (etcd shows a shard's new owner as soon as it holds
// it, a moment before its CMD writes its start), and checks each time it
// reads the log that each started on to only after it ended on from,
// with a higher token, and that no shard ran twice at once.
func requireHandedOver(t *testing.T, log, from, to string, moved int) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for {
		got := handedOver(t, readShardLog(t, log), from, to)
		if got >= moved {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d shards handed over from %s to %s in %v, want %d", got, from, to, procTimeout, moved)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handedOver returns how many shards the log shows handed over from one
// member to another, and fails the test if a shard ran twice at once or
// its token did not rise.
func handedOver(t *testing.T, evs []shardEvent, from, to string) int {
	t.Helper()
	last := map[int]shardEvent{} // by shard: the last start
	ended := map[int]bool{}      // by pid
	got := 0
	for _, e := range evs {
		if !e.start {
			ended[e.pid] = true
			continue
		}
		if prev, ok := last[e.shard]; ok {
			require.True(t, ended[prev.pid], "shard %d started on %s (pid %d) while pid %d of %s ran it", e.shard, e.lease, e.pid, prev.pid, prev.lease)
			require.Greater(t, e.token, prev.token, "shard %d: the token did not rise", e.shard)
			if prev.lease == from && e.lease == to {
				got++
			}
		}
		last[e.shard] = e
	}
	return got
}

// A CMD that exits while its shard is still owned is started again, in
// the same hold (the same token), and etcdlock says so with its status.
func TestShardsRestartsCmd(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	p := startProc(t, nil, "shards", ep(), name, "--count", "1", "--", "sh", "-c", `echo "run $ETCDLOCK_TOKEN"; exit 3`)
	p.stderr.waitFor(t, "sh (shard 0) exited with status 3; it starts again after a pause")
	two := p.stdout.wait(t, "a second run", func(all []string) (string, bool) {
		if len(all) < 2 {
			return "", false
		}
		return all[0] + "|" + all[1], true
	})
	first, second, _ := strings.Cut(two, "|")
	require.Regexp(t, `^run [0-9]+$`, first)
	require.Equal(t, first, second, "a restart in the same hold")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, p.wait(t), p.stderr.String())
}

// shards status tells the members and the shards as tables.
func TestShardsStatusText(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	r := runProc(t, nil, "shards", "status", ep(), name, "--count", "2")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf(`shard set %q: 2 shards, 0 members, no shard runs`, name), r.stdout[:strings.Index(r.stdout, " (etcd revision")])
	require.Contains(t, r.stdout, "SHARD  OWNER  TOKEN  ASSIGNED  WAITING  STATE\n0      -      -      -         0        free\n")

	p := startProc(t, nil, "shards", ep(), "--identity", "replica one", name, "--count", "2", "--", "sleep", "1000")
	waitShards(t, name, 2, "owned", func(st shardsJSON) bool { return owns(st) != nil })
	r = runProc(t, nil, "shards", "status", ep(), name, "--count", "2")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "2 shards, 1 members, settled")
	require.Contains(t, r.stdout, "MEMBER ")
	require.Contains(t, r.stdout, fmt.Sprintf(`  100     2     2         etcdlock-shards "replica one" sleep, pid %d on `, p.cmd.Process.Pid))
}

// Bad input is refused before anything is written, with exit 2 (4 for a
// member that is not one, 127 for a CMD not found), one line each.
func TestShardsUsage(t *testing.T) {
	t.Parallel()
	name := lockName(t)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"shards"}, exitUsage, "missing shard set NAME"},
		{[]string{"shards", name, "--", "true"}, exitUsage, "missing --count N"},
		{[]string{"shards", "--count", "2", "--", "true"}, exitUsage, `missing shard set NAME before "--"`},
		{[]string{"shards", name, "--count", "0", "--", "true"}, exitUsage, "--count must be from 1 to 4096, not 0"},
		{[]string{"shards", name, "--count", "4097", "--", "true"}, exitUsage, "--count must be from 1 to 4096, not 4097"},
		{[]string{"shards", name, "--count", "2"}, exitUsage, "missing CMD"},
		{[]string{"shards", "__etcdlock/x", "--count", "2", "--", "true"}, exitUsage, `"__etcdlock" and the names under "__etcdlock/" are the library's own`},
		{[]string{"shards", strings.Repeat("n", etcdlock.MaxNameLen-4), "--count", "2", "--", "true"}, exitUsage, "would be longer than"},
		{[]string{"shards", name, "--count", "2", "--ttl", "0", "--", "true"}, exitUsage, "--ttl must be positive"},
		{[]string{"shards", name, "--count", "2", "--ttl", "5", "--grace", "10s", "--", "true"}, exitUsage, "--grace 10s does not fit in --ttl 5s"},
		{[]string{"shards", name, "--count", "2", "--bogus", "--", "true"}, exitUsage, "flag provided but not defined: -bogus"},
		{[]string{"shards", ep(), name, "--count", "2", "--", "no-such-cmd-etcdlock"}, exitNotFound, `CMD "no-such-cmd-etcdlock" not found`},
		{[]string{"shards", "status", name}, exitUsage, "missing --count N"},
		{[]string{"shards", "status", "--count", "2"}, exitUsage, "missing shard set NAME"},
		{[]string{"shards", "status", name, "--count", "2", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"shards", "weight", name}, exitUsage, "missing MEMBER"},
		{[]string{"shards", "weight", name, "abc"}, exitUsage, "missing WEIGHT"},
		{[]string{"shards", "weight", name, "xyz", "5"}, exitUsage, `MEMBER "xyz" is not a lease ID in hex`},
		{[]string{"shards", "weight", name, "abc", "101"}, exitUsage, `WEIGHT must be a whole number from 0 to 100, not "101"`},
		{[]string{"shards", "weight", name, "abc", "1.5"}, exitUsage, `WEIGHT must be a whole number from 0 to 100, not "1.5"`},
		{[]string{"shards", "weight", name, "abc", "-1"}, exitUsage, `flag provided but not defined: -1`},
		{[]string{"shards", "drain", name, "abc", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"shards", "drain", ep(), name, "abc"}, exitHeld, fmt.Sprintf("abc is not a member of the shard set %q", name)},
		{[]string{"shards", "weight", ep(), name, "abc", "50"}, exitHeld, fmt.Sprintf("abc is not a member of the shard set %q", name)},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			r := runProc(t, nil, c.args...)
			require.Equal(t, c.code, r.code, r.stderr)
			requireOneLineError(t, r, c.want)
		})
	}

	// The help of shards tells status's --json as well as its own flags.
	r := runProc(t, nil, "help", "shards")
	require.Equal(t, 0, r.code, r.stderr)
	for _, f := range []string{"-count N", "-identity name", "-lock-delay duration", "-ttl TTL", "-grace duration", "-json", "-endpoints"} {
		require.Contains(t, r.stdout, "  "+f)
	}
}
