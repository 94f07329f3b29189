package main

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/etcdlock/etcdlock"
)

// The grants command: the permissions an etcd role needs for each use of
// a lock, as the etcdctl command lines that grant them.

const grantsHelp = `Usage: etcdlock grants [flags] NAME...

Prints the 'etcdctl role grant-permission' lines that give an etcd role
exactly what etcdlock needs on each lock NAME, and nothing more: apply
them to the role of the users that run etcdlock (or a program of this
library) with authentication on.

  run, elect, a Mutex, ...   readwrite on the keys with prefix NAME/
  --lock-delay, --min-hold   also readwrite on __etcdlock/delay/NAME/
                             (run --lock-delay, WithLockDelay, run
                             --min-hold, WithMinHold: the same records)
  --requests                 also readwrite on __etcdlock/release/NAME/
                             (etcdlock release, run --on-release,
                             RequestRelease, ReleaseRequested)
  --observe-only             read only, on NAME/ (status, ls NAME, elect
                             --listen), and on the delay and request keys
                             with the flags above

A lock name is taken as etcd's Mutex takes it: its keys are NAME/ and a
lease ID, so "/my-lock/" needs the prefix "/my-lock//". A role or NAME
that begins with "-" gets "--prefix --" before the role: etcdctl would
take it for a flag.
`

func cmdGrants(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("grants")
	role := fs.String("role", "ROLE", "the etcd `role` the lines grant to")
	delay := fs.Bool("lock-delay", false, "the locks take a lock delay: also the delay records' keys")
	minHold := fs.Bool("min-hold", false, "the locks take a minimum hold: also its records' keys (those of --lock-delay)")
	requests := fs.Bool("requests", false, "release requests are made or heard: also the request keys")
	observe := fs.Bool("observe-only", false, "read only: status, ls NAME, elect --listen")
	// Flags may come between the names: parse as many names as there are
	// arguments.
	names, rest, _, err := parseArgs(fs, args, len(args), grantsHelp, stdout)
	if err != nil {
		return err
	}
	names = append(names, rest...)
	switch {
	case len(names) == 0:
		return usageErr("grants", "missing lock NAME")
	case *role == "":
		return usageErr("grants", "empty --role")
	}
	for _, n := range names {
		if n == "--" {
			n = ""
		}
		if err := nameErr("grants", "lock NAME", n); err != nil {
			return err
		}
	}
	perm := "readwrite"
	if *observe {
		perm = "read"
	}
	for _, n := range names {
		for _, p := range grantPrefixes(n, *delay || *minHold, *requests) {
			fmt.Fprintln(stdout, grantLine(*role, perm, p))
		}
	}
	return nil
}

// grantLine returns the etcdctl command line that grants role perm on
// the keys with prefix p. etcdctl would take a role or a prefix that
// begins with "-" for flags: then "--" ends its flags before them.
func grantLine(role, perm, p string) string {
	if strings.HasPrefix(role, "-") || strings.HasPrefix(p, "-") {
		return fmt.Sprintf("etcdctl role grant-permission --prefix -- %s %s %s", shellQuote(role), perm, shellQuote(p))
	}
	return fmt.Sprintf("etcdctl role grant-permission %s %s --prefix %s", shellQuote(role), perm, shellQuote(p))
}

// grantPrefixes returns the key prefixes the uses of lock name touch.
func grantPrefixes(name string, delay, requests bool) []string {
	pfxs := []string{name + "/"}
	if delay {
		pfxs = append(pfxs, etcdlock.LockDelayPrefix+name+"/")
	}
	if requests {
		pfxs = append(pfxs, etcdlock.ReleaseRequestPrefix+name+"/")
	}
	return pfxs
}

// shellQuote quotes s for a POSIX shell, unless it needs none: in single
// quotes; or, when s holds a character that is not printable (a newline,
// an escape, a byte of invalid UTF-8), in $'...' (bash, zsh, ksh, and sh
// as of POSIX.1-2024) with each byte of such a character as \xHH, so that
// a command line stays one line of text.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@") == "" {
		return s
	}
	if printable(s) {
		return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
	}
	var b strings.Builder
	b.WriteString("$'")
	for s != "" {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteByte(s[0])
		case printable(s[:size]):
			b.WriteString(s[:size])
		default:
			for i := range size {
				fmt.Fprintf(&b, `\x%02x`, s[i])
			}
		}
		s = s[size:]
	}
	b.WriteByte('\'')
	return b.String()
}
