package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/etcdlock/etcdlock"
)

const releaseHelp = `Usage: etcdlock release [flags] NAME

Asks the holders of the lock NAME (or the leader of the election NAME) to
release it: every hold current now, none that comes later. The request
only asks. 'etcdlock run' and 'etcdlock elect' pass it on to CMD as the
signal given with --on-release (without it they ignore it); a program of
the etcdlock library sees it in ReleaseRequested, and its Lead steps
down, to the next candidate in line, when made with YieldOnRequest.

Asking again is the same request. 'etcdlock status NAME' shows a request
that a holder has not acted on yet. The request keys live under
__etcdlock/release/NAME/, bound to the holders' leases: asking needs read
permission on NAME/ and write permission on __etcdlock/release/NAME/.

Exits 0 once etcd has recorded the request for every holder, and 4 when
nothing holds NAME.
` + connHelp + "\n" + exitCodesHelp

func cmdRelease(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("release")
	var conn connFlags
	conn.register(fs)
	pos, rest, _, err := parseArgs(fs, args, 1, releaseHelp, stdout)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("release", "missing lock NAME")
	}
	if err := nameErr("release", "lock NAME", pos[0]); err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErr("release", "unexpected argument %q after NAME", rest[0])
	}
	name := pos[0]
	cli, err := openConn(fs, &conn, "release", name+"/", stderr)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), conn.commandTimeout)
	defer cancel()
	switch err := etcdlock.RequestRelease(ctx, cli, name); {
	case errors.Is(err, etcdlock.ErrNotHeld):
		msg := fmt.Sprintf("lock %q is not held by anyone: no holder to ask", name)
		if _, why, ok := strings.Cut(detail(err), name+": "); ok {
			msg += " (" + why + ")" // a set first in line that waits, say
		}
		return failf(exitHeld, "%s", msg)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("ask to release lock %q: no answer from etcd within %v (--command-timeout)", name, conn.commandTimeout)
	case err != nil:
		return fmt.Errorf("ask to release lock %q: %w", name, conn.explain(err, "write the request key", etcdlock.ReleaseRequestPrefix+name+"/", nil))
	}
	fmt.Fprintf(stdout, "asked the holders of %q to release it\n", name)
	return nil
}
