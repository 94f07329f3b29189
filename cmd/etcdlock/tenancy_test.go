package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/etcdlock/etcdlock"
	"github.com/etcdlock/etcdlock/etcdlockgocron"
	"github.com/etcdlock/etcdlock/internal/etcdtest"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A team of the tenancy tests: a role made of the lines of 'etcdlock
// grants --prefix', and a user of it.
type team struct{ role, prefix, user string }

// grantTeams starts an etcd with authentication on, whose roles are made
// of the lines 'etcdlock grants --role ROLE --prefix PREFIX' prints with
// flags, one per team, each with a user USER (password "pw"). It returns
// the cluster and a client of root.
func grantTeams(t *testing.T, teams []team, flags ...string) (*etcdtest.Cluster, *clientv3.Client) {
	t.Helper()
	c := etcdtest.Start(t, 1)
	root := c.Client(t)
	for _, tm := range teams {
		r := runProc(t, nil, append([]string{"grants", "--role", tm.role, "--prefix", tm.prefix}, flags...)...)
		require.Equal(t, 0, r.code, r.stderr)
		_, err := root.RoleAdd(t.Context(), tm.role)
		require.NoError(t, err)
		applyGrants(t, root, tm.role, r.stdout)
		_, err = root.UserAdd(t.Context(), tm.user, "pw")
		require.NoError(t, err)
		_, err = root.UserGrantRole(t.Context(), tm.user, tm.role)
		require.NoError(t, err)
	}
	require.NoError(t, etcdtest.EnableAuth(t.Context(), root, "root-pw"))
	return c, c.Client(t, clientv3.Config{Username: "root", Password: "root-pw"})
}

// applyGrants grants role, through root, what each line of out (the
// output of 'etcdlock grants --role role') says: the lines etcdctl would
// run, read as etcdctl reads them.
func applyGrants(t *testing.T, root *clientv3.Client, role, out string) {
	t.Helper()
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		w := etcdtest.ShellWords(l)
		require.Len(t, w, 7, l)
		require.Equal(t, []string{"etcdctl", "role", "grant-permission", role}, w[:4], l)
		require.Equal(t, "--prefix", w[5], l)
		perm := clientv3.PermReadWrite
		if w[4] == "read" {
			perm = clientv3.PermRead
		}
		_, err := root.RoleGrantPermission(t.Context(), role, w[6], clientv3.GetPrefixRangeEnd(w[6]), clientv3.PermissionType(perm))
		require.NoError(t, err, l)
	}
}

// A libraryUse is one use of the library on the lock name by a user's
// client: it returns nil once it did what it does, or the error that
// stopped it.
type libraryUse struct {
	what string
	use  func(ctx context.Context, cli *clientv3.Client, name string) error
}

// libraryUses are every feature of the library a team uses on a lock.
var libraryUses = []libraryUse{
	{"Mutex", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			return etcdlock.NewMutex(s, name).Do(ctx, func(context.Context) error { return nil })
		})
	}},
	{"TryLock", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			m := etcdlock.NewMutex(s, name)
			if err := m.TryLock(ctx); err != nil {
				return err
			}
			return m.Unlock(ctx)
		})
	}},
	{"RWMutex", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			m := etcdlock.NewRWMutex(s, name)
			if err := m.RDo(ctx, func(context.Context) error { return nil }); err != nil {
				return err
			}
			return m.Do(ctx, func(context.Context) error { return nil })
		})
	}},
	{"Semaphore", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			return etcdlock.NewSemaphore(s, name, 3).Do(ctx, 2, func(context.Context) error { return nil })
		})
	}},
	{"MultiMutex", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			return etcdlock.NewMultiMutex(s, []string{name + "/1", name + "/2"}).Do(ctx, func(context.Context) error { return nil })
		})
	}},
	{"WithLockDelay", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			return etcdlock.NewMutex(s, name, etcdlock.WithLockDelay(time.Second)).Do(ctx, func(context.Context) error { return nil })
		})
	}},
	{"WithMinHold", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			return etcdlock.NewMutex(s, name, etcdlock.WithMinHold(10*time.Millisecond)).Do(ctx, func(context.Context) error { return nil })
		})
	}},
	{"Election", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			e := etcdlock.NewElection(s, name)
			if err := e.Campaign(ctx, "v"); err != nil {
				return err
			}
			if _, err := e.Leader(ctx); err != nil {
				return err
			}
			return e.Resign(ctx)
		})
	}},
	{"Lead", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return etcdlock.Lead(ctx, cli, name, "v", func(context.Context) error { return nil })
	}},
	{"RequestRelease", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			m := etcdlock.NewMutex(s, name)
			if err := m.Lock(ctx); err != nil {
				return err
			}
			defer m.Unlock(ctx)
			if err := etcdlock.RequestRelease(ctx, cli, name); err != nil {
				return err
			}
			select {
			case <-m.ReleaseRequested():
				return nil
			case <-ctx.Done():
				return fmt.Errorf("the holder did not hear the request: %w", ctx.Err())
			}
		})
	}},
	{"RunShards", func(ctx context.Context, cli *clientv3.Client, name string) error {
		return withSession(ctx, cli, func(s *etcdlock.Session) error {
			// Run until both shards started, drain, inspect, leave.
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var mu sync.Mutex
			started := map[int]bool{}
			err := etcdlock.RunShards(sctx, s, name, 2, func(ctx context.Context, sh etcdlock.Shard) error {
				mu.Lock()
				started[sh.Num] = true
				all := len(started) == 2
				mu.Unlock()
				if all {
					if err := etcdlock.SetShardWeight(ctx, cli, name, s.Lease(), 0); err != nil {
						return err
					}
					if _, err := etcdlock.InspectShards(ctx, cli, name, 2); err != nil {
						return err
					}
					cancel()
				}
				<-ctx.Done()
				return nil
			})
			if err == nil && sctx.Err() == nil {
				err = errors.New("RunShards returned before it ran its shards")
			}
			return err
		})
	}},
	{"InspectLock", func(ctx context.Context, cli *clientv3.Client, name string) error {
		_, err := etcdlock.InspectLock(ctx, cli, name)
		return err
	}},
	{"ListLocks", func(ctx context.Context, cli *clientv3.Client, name string) error {
		_, err := etcdlock.ListLocks(ctx, cli, name)
		return err
	}},
}

// withSession runs fn with a session of cli, closed after it.
func withSession(ctx context.Context, cli *clientv3.Client, fn func(*etcdlock.Session) error) error {
	s, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

// TestTenancy (issue 40): two teams, each with a role made of the lines
// of 'etcdlock grants --prefix P --lock-delay --requests', use every
// feature of the library as their own user. On locks under their prefix
// each works; on the other team's each is refused by etcd, at once, and
// says so.
func TestTenancy(t *testing.T) {
	t.Parallel()
	teams := []team{{"team-a", "a/", "alice"}, {"team-b", "b/", "bob"}}
	c, _ := grantTeams(t, teams, "--lock-delay", "--requests")
	for i, tm := range teams {
		other := teams[1-i]
		cli := c.Client(t, clientv3.Config{Username: tm.user, Password: "pw"})
		for _, u := range libraryUses {
			t.Run(tm.role+"/"+u.what, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
				defer cancel()
				// A name per use: a plain Mutex ignores the records a
				// lock delay or a minimum hold left on its name.
				name := "jobs/" + u.what
				require.NoError(t, u.use(ctx, cli, tm.prefix+name), "on its own prefix")
				err := u.use(ctx, cli, other.prefix+name)
				require.ErrorIs(t, err, rpctypes.ErrPermissionDenied, "on the other team's: %v", err)
				require.NoError(t, ctx.Err(), "refused at once, not after a wait")
				// The error names the other team's keys, and nothing of
				// a cleanup: the refused write wrote nothing.
				require.Contains(t, err.Error(), `"`+other.prefix+name, "names the keys refused")
				require.NotContains(t, err.Error(), tm.prefix+name)
				require.NotContains(t, err.Error(), "after failed lock")
			})
		}
	}
}

// TestTenancyPartialGrants: a team whose role was made without --lock-delay
// and --requests locks its own names, and is refused a lock delay, a
// minimum hold and a release request with an error that names only what
// etcd refused (the records' or the requests' prefix, found by a probe
// that writes nothing), never the lock's own keys, which it may write.
func TestTenancyPartialGrants(t *testing.T) {
	t.Parallel()
	c, root := grantTeams(t, []team{{"team-c", "c/", "carol"}})
	cli := c.Client(t, clientv3.Config{Username: "carol", Password: "pw"})
	ctx := t.Context()
	uses := map[string]libraryUse{}
	for _, u := range libraryUses {
		uses[u.what] = u
	}
	require.NoError(t, uses["Mutex"].use(ctx, cli, "c/jobs/m"))
	before, err := root.Get(ctx, "probe-revision")
	require.NoError(t, err)
	for what, refusedPfx := range map[string]string{
		"WithLockDelay": etcdlock.LockDelayPrefix + "c/jobs/d/",
		"WithMinHold":   etcdlock.LockDelayPrefix + "c/jobs/d/",
	} {
		err := uses[what].use(ctx, cli, "c/jobs/d")
		require.ErrorIs(t, err, rpctypes.ErrPermissionDenied, what)
		require.Contains(t, err.Error(), "the keys with prefix "+strconv.Quote(refusedPfx)+", which etcd refuses", what)
		require.NotContains(t, err.Error(), `"c/jobs/d/"`, "%s: the lock's own keys are the user's", what)
	}
	s, err := etcdlock.NewSession(ctx, cli)
	require.NoError(t, err)
	defer s.Close()
	m := etcdlock.NewMutex(s, "c/jobs/r")
	require.NoError(t, m.Lock(ctx))
	err = etcdlock.RequestRelease(ctx, cli, "c/jobs/r")
	require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
	require.Contains(t, err.Error(), "writes the keys with prefix "+strconv.Quote(etcdlock.ReleaseRequestPrefix+"c/jobs/r/")+", which etcd refuses")
	require.NotContains(t, err.Error(), `"c/jobs/r/"`)
	require.NoError(t, m.Unlock(ctx))

	// Neither the refusals nor the probes wrote anything: the revision
	// moved by the Lock and Unlock of c/jobs/r alone.
	after, err := root.Get(ctx, "probe-revision")
	require.NoError(t, err)
	require.Equal(t, before.Header.Revision+2, after.Header.Revision)
}

// TestTenancyCommand: the command's every use, as each team's user, on
// locks under the team's prefix works, and on the other team's is refused
// (exit 3) with a message that names the other team's keys and none of
// the user's own.
func TestTenancyCommand(t *testing.T) {
	t.Parallel()
	teams := []team{{"team-a", "a/", "alice"}, {"team-b", "b/", "bob"}}
	c, _ := grantTeams(t, teams, "--lock-delay", "--requests")
	for i, tm := range teams {
		other := teams[1-i]
		cmd := func(args ...string) []string {
			return append([]string{"--endpoints=" + c.Endpoint(0), "--user", tm.user + ":pw"}, args...)
		}
		refused := func(t *testing.T, name string, args ...string) {
			t.Helper()
			r := runProc(t, nil, cmd(args...)...)
			require.Equal(t, exitConnect, r.code, "%q as %s: %s", args, tm.user, r.stderr)
			require.Contains(t, r.stderr, "permission denied")
			require.Contains(t, r.stderr, `"`+name, "names the keys refused")
			require.NotContains(t, r.stderr, `"`+tm.prefix, "names nothing of the user's own")
		}
		for _, args := range [][]string{
			{"run", "NAME", "--", "true"},
			{"run", "--lock-delay", "1s", "NAME", "--", "true"},
			{"run", "--min-hold", "10ms", "NAME", "--", "true"},
			{"elect", "NAME", "v", "--", "true"},
			{"status", "NAME"},
			{"ls", "NAME"},
		} {
			t.Run(tm.role+"/"+strings.Join(args[:len(args)-1], " "), func(t *testing.T) {
				own, theirs := tm.prefix+"cmd/"+args[0], other.prefix+"cmd/"+args[0]
				with := func(name string) []string {
					out := slices.Clone(args)
					out[slices.Index(out, "NAME")] = name
					return out
				}
				r := runProc(t, nil, cmd(with(own)...)...)
				require.Equal(t, 0, r.code, "%q as %s: %s", with(own), tm.user, r.stderr)
				refused(t, theirs, with(theirs)...)
			})
		}
		t.Run(tm.role+"/release", func(t *testing.T) {
			own, theirs := tm.prefix+"cmd/release", other.prefix+"cmd/release"
			p := startProc(t, nil, cmd("run", "--on-release", "TERM", own, "--", "sh", "-c", "echo ready; exec sleep 30")...)
			p.stdout.waitFor(t, "ready")
			r := runProc(t, nil, cmd("release", own)...)
			require.Equal(t, 0, r.code, r.stderr)
			require.Equal(t, 128+15, p.wait(t), "the holder heard the request: %s", p.stderr.String())
			refused(t, theirs, "release", theirs)
		})
		t.Run(tm.role+"/ls --watch", func(t *testing.T) {
			own, theirs := tm.prefix+"cmd/watch", other.prefix+"cmd/watch"
			w := startProc(t, nil, cmd("ls", "--watch", own)...)
			// Its first line is the state it watches from: a lock taken
			// after it is a change it shows.
			w.stdout.waitFor(t, "no locks under")
			r := runProc(t, nil, cmd("run", own+"/x", "--", "true")...)
			require.Equal(t, 0, r.code, r.stderr)
			w.stdout.waitFor(t, own+"/x")
			require.NoError(t, w.cmd.Process.Signal(os.Interrupt))
			require.Equal(t, 0, w.wait(t), w.stderr.String())
			refused(t, theirs, "ls", "--watch", theirs)
		})
	}
}

// TestTenancyGocron: the gocron adapter's Locker and Elector, as each
// team's user, run on names under the team's prefix, and are refused on
// the other team's: a Lock at once, a campaign ended with etcd's refusal,
// which IsLeader says.
func TestTenancyGocron(t *testing.T) {
	t.Parallel()
	teams := []team{{"team-a", "a/", "alice"}, {"team-b", "b/", "bob"}}
	c, _ := grantTeams(t, teams, "--min-hold", "--requests")
	for i, tm := range teams {
		other := teams[1-i]
		t.Run(tm.role, func(t *testing.T) {
			cli := c.Client(t, clientv3.Config{Username: tm.user, Password: "pw"})
			ctx := t.Context()
			lock := func(prefix string) error {
				// Lock waits for etcd at most the minimum hold, its
				// session's first grant and login included: give it
				// a loaded machine's time.
				l, err := etcdlockgocron.NewLocker(cli, 5*time.Second, etcdlockgocron.WithPrefix(prefix))
				require.NoError(t, err)
				defer l.Close()
				k, err := l.Lock(ctx, "job")
				if err != nil {
					return err
				}
				return k.Unlock(ctx)
			}
			require.NoError(t, lock(tm.prefix+"cron/"))
			err := lock(other.prefix + "cron/")
			require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
			require.Contains(t, err.Error(), `"`+other.prefix+"cron/job")
			require.NotContains(t, err.Error(), `"`+tm.prefix)

			elect := func(name string) *etcdlockgocron.Elector {
				e, err := etcdlockgocron.NewElector(cli, name, tm.user, etcdlockgocron.WithTakeoverDelay(0))
				require.NoError(t, err)
				t.Cleanup(func() { e.Close() })
				return e
			}
			own, theirs := elect(tm.prefix+"cron/leader"), elect(other.prefix+"cron/leader")
			var ownErr, theirErr error
			require.Eventually(t, func() bool {
				ownErr, theirErr = own.IsLeader(ctx), theirs.IsLeader(ctx)
				return ownErr == nil && theirErr != nil && strings.Contains(theirErr.Error(), "campaign ended")
			}, 30*time.Second, 10*time.Millisecond, "own: %v; theirs: %v", ownErr, theirErr)
			require.ErrorIs(t, theirErr, rpctypes.ErrPermissionDenied)
			require.Contains(t, theirErr.Error(), `"`+other.prefix+"cron/leader")
		})
	}
}
