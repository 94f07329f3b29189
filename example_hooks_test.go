package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"slices"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Count and time acquisitions and holds with Hooks (the etcdlockprom
// module turns them into Prometheus metrics).
func ExampleWithHooks() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithHooks(etcdlock.Hooks{
		AcquireDone: func(i etcdlock.AcquireDoneInfo) {
			fmt.Printf("%s %s: %s\n", i.Kind, i.Name, i.Outcome) // and i.Waited
		},
		HoldDone: func(i etcdlock.HoldDoneInfo) {
			fmt.Printf("%s %s: %s\n", i.Kind, i.Name, i.End) // and i.Held
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	m := etcdlock.NewMutex(s, "example/hooked")
	if err := m.Do(ctx, func(ctx context.Context) error { return nil }); err != nil {
		log.Fatal(err)
	}
	// Output:
	// mutex example/hooked: acquired
	// mutex example/hooked: released
}

// Log what an operator needs to know: here a lock lost because someone
// deleted its key, at Warn (Unlock finds it; with Done called, the watch
// would log it at once), and the session's Close, at Info.
func ExampleWithLogger() {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()

	// Leave out what changes from run to run, to print the same Output.
	varies := []string{slog.TimeKey, "lease", "held", "token", "error"}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if slices.Contains(varies, a.Key) {
				return slog.Attr{}
			}
			return a
		},
	}))
	s, err := etcdlock.NewSession(ctx, cli, etcdlock.WithLogger(logger))
	if err != nil {
		log.Fatal(err)
	}

	m := etcdlock.NewMutex(s, "example/logged")
	if err := m.Lock(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := cli.Delete(ctx, m.Key()); err != nil { // someone else's doing
		log.Fatal(err)
	}
	if err := m.Unlock(ctx); !errors.Is(err, etcdlock.ErrLockLost) {
		log.Fatal(err)
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// level=WARN msg="etcdlock: lock lost" kind=mutex name=example/logged cause=key_deleted
	// level=INFO msg="etcdlock: session ended" cause=closed
}
