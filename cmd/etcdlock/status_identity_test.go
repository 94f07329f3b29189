package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/stretchr/testify/require"
)

// An etcdlock run that waited before it got the lock: status shows when it
// joined the queue, as an upper bound of how long it holds, and who it is;
// it does not pass the time it joined off as the start of the hold.
func TestStatusHolderThatWaited(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	p1 := startProc(t, nil, "run", ep(), name, "--", "sh", "-c", `echo "started $ETCDLOCK_KEY"; cat >/dev/null`)
	p1.stdout.waitFor(t, "started")
	w := watchQueue(t, cli, name)
	p2 := startProc(t, nil, "run", "--quiet", ep(), name, "--", "sh", "-c", `echo "started $ETCDLOCK_KEY"; cat >/dev/null`)
	key2 := w.next(t)
	p1.stdin.Close()
	require.Equal(t, 0, p1.wait(t), p1.stderr.String())
	require.Equal(t, key2, strings.Fields(p2.stdout.waitFor(t, "started"))[1])

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	t.Logf("status:\n%s", r.stdout)
	require.Regexp(t, `\nheld since: unknown, at most \S+: the holder joined the queue at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ by its clock, and etcd's history does not show it got the lock then\n`, r.stdout)
	require.Regexp(t, `\nholder: etcdlock run running sh as pid `+strconv.Itoa(p2.cmd.Process.Pid)+` on \S+\n$`, r.stdout)

	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, key2, st.Holder.Key)
	require.NotNil(t, st.Holder.QueuedAt)
	require.Nil(t, st.Holder.HeldSince)
	require.Equal(t, p2.cmd.Process.Pid, st.Holder.PID)
	require.NotRegexp(t, regexp.MustCompile(`"held_since"`), r.stdout)

	p2.stdin.Close()
	require.Equal(t, 0, p2.wait(t), p2.stderr.String())
}

// TestStatusWaiterIdentity: status names who each waiter is, as it
// recorded itself: etcdlock run's host, pid and command, or a library
// lock's WithIdentity, a line each below the table (issue 31: it named
// only the holder).
func TestStatusWaiterIdentity(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	holdLock(t, cli, name)
	p := startProc(t, nil, "run", ep(), name, "--", "true")
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, name)) == 2 }, procTimeout, 10*time.Millisecond)
	s, err := etcdlock.NewSession(t.Context(), cli)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	idm := etcdlock.NewMutex(s, name, etcdlock.WithIdentity("billing worker 7"))
	go idm.Lock(t.Context()) //nolint:errcheck // ends with the session
	require.Eventually(t, func() bool { return len(queueKeys(t, cli, name)) == 3 }, procTimeout, 10*time.Millisecond)

	r := runProc(t, nil, "status", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	host, _ := os.Hostname()
	require.Contains(t, r.stdout, fmt.Sprintf("\nwaiter 1: etcdlock run true, pid %d on %s\n", p.cmd.Process.Pid, host))
	require.Contains(t, r.stdout, "\nwaiter 2: \"billing worker 7\"\n")
	r = runProc(t, nil, "status", "--json", ep(), name)
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, p.cmd.Process.Pid, st.Waiters[0].PID)
	require.Equal(t, "true", st.Waiters[0].Command)
	require.Equal(t, identityJSON("billing worker 7"), st.Waiters[1].Identity)
	require.NoError(t, s.Close())
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	p.wait(t)
}

// TestStatusGocronHolder (issue 40): a lock of the gocron adapter's
// Locker shows, in status and ls, since when it is held and which
// replica holds it, where it showed "held since: unknown" and "?".
func TestStatusGocronHolder(t *testing.T) {
	t.Parallel()
	cli := newClient(t)
	name := lockName(t)
	// Lock waits for etcd at most the minimum hold: a loaded machine's.
	l, err := etcdlockgocron.NewLocker(cli, 5*time.Second, etcdlockgocron.WithPrefix(name+"/"), etcdlockgocron.WithIdentity("replica-a"))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	lock, err := l.Lock(t.Context(), "job")
	require.NoError(t, err)
	defer lock.Unlock(t.Context())
	host, _ := os.Hostname()

	r := runProc(t, nil, "status", ep(), name+"/job")
	require.Equal(t, 0, r.code, r.stderr)
	require.Regexp(t, `\nheld since: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \S+ \(\S+ ago\), as recorded by the holder's clock\n`, r.stdout)
	require.Contains(t, r.stdout, fmt.Sprintf("\nholder: etcdlockgocron %q as pid %d on %s\n", "replica-a", os.Getpid(), host))

	r = runProc(t, nil, "ls", ep(), name+"/")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, fmt.Sprintf("etcdlockgocron %q, pid %d on %s", "replica-a", os.Getpid(), host))
	require.NotContains(t, r.stdout, "?")

	r = runProc(t, nil, "status", "--json", ep(), name+"/job")
	require.Equal(t, 0, r.code, r.stderr)
	var st statusJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &st))
	require.Equal(t, "etcdlockgocron", st.Holder.By)
	require.Equal(t, "replica-a", st.Holder.Name)
	require.NotNil(t, st.Holder.HeldSince)
}
