// Command lockpath runs a plain Mutex's Lock twice against etcd, once
// uncontended and once waiting behind etcd's own Mutex (so that no code of
// this module runs for the holder), with coverage counters cleared before
// and written after: the files of the lock package with a block run are
// the files a reader follows through one Lock. It must be built with
// -cover -covermode=atomic -coverpkg=github.com/etcdlock/etcdlock; the
// test TestLockPathFiles builds it, runs it and counts.
//
//	lockpath -endpoints URL[,URL] -counters DIR
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/coverage"
	"strings"
	"time"

	"github.com/etcdlock/etcdlock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func main() {
	endpoints := flag.String("endpoints", "", "etcd client URLs, comma-separated")
	counters := flag.String("counters", "", "the directory the coverage data is written to")
	name := flag.String("name", "lockpath", "the lock's name")
	flag.Parse()
	if err := run(*endpoints, *counters, *name); err != nil {
		fmt.Fprintln(os.Stderr, "lockpath:", err)
		os.Exit(1)
	}
}

func run(endpoints, dir, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 10 * time.Second})
	if err != nil {
		return err
	}
	defer cli.Close()
	s, err := etcdlock.NewSession(ctx, cli)
	if err != nil {
		return err
	}
	defer s.Close()
	cs, err := concurrency.NewSession(cli)
	if err != nil {
		return err
	}
	defer cs.Close()
	theirs := concurrency.NewMutex(cs, name)
	if err := theirs.Lock(ctx); err != nil {
		return err
	}
	free, waiting := etcdlock.NewMutex(s, name+"-free"), etcdlock.NewMutex(s, name)

	// WriteMetaDir first: ClearCounters learns the counter mode from it.
	if err := coverage.WriteMetaDir(dir); err != nil {
		return err
	}
	if err := coverage.ClearCounters(); err != nil {
		return err
	}
	if err := free.Lock(ctx); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- waiting.Lock(ctx) }()
	// The holder leaves once the waiter blocks with its watches set up.
	for !blocked() {
		select {
		case err := <-done:
			return fmt.Errorf("Lock returned while etcd's Mutex held: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	if err := theirs.Unlock(ctx); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return err
	}
	if err := free.Unlock(ctx); err != nil {
		return err
	}
	return waiting.Unlock(ctx)
}

// blocked reports whether a goroutine waits in a waiter's waitDelete: its
// watches are set up and it blocks until a blocker goes.
func blocked() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "etcdlock.(*waiter).waitDelete(") && strings.Contains(g, "[select") {
			return true
		}
	}
	return false
}
