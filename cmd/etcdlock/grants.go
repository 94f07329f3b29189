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
       etcdlock grants [flags] --prefix PREFIX...

Prints the 'etcdctl role grant-permission' lines that give an etcd role
exactly what etcdlock needs on each lock NAME, or on every lock whose
name begins with PREFIX, and nothing more: apply them to the role of the
users that run etcdlock (or a program of this library) with
authentication on.

  --prefix PREFIX            every lock whose name begins with PREFIX,
                             as a team's role on its own prefix: the
                             keys with prefix PREFIX, and with the flags
                             below __etcdlock/delay/PREFIX and
                             __etcdlock/release/PREFIX (repeat it for
                             several; NAMEs may be given beside it)

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
lease ID, so "/my-lock/" needs the prefix "/my-lock//". A PREFIX is taken
as etcd takes a key prefix: "jobs/" covers the lock "jobs/backup", and
"jobs" would also cover "jobs2/backup". A role, NAME or PREFIX that
begins with "-" gets "--prefix --" before the role: etcdctl would take
it for a flag.
`

func cmdGrants(args []string, stdout, _ io.Writer) error {
	fs := newFlagSet("grants")
	role := fs.String("role", "ROLE", "the etcd `role` the lines grant to")
	delay := fs.Bool("lock-delay", false, "the locks take a lock delay: also the delay records' keys")
	minHold := fs.Bool("min-hold", false, "the locks take a minimum hold: also its records' keys (those of --lock-delay)")
	requests := fs.Bool("requests", false, "release requests are made or heard: also the request keys")
	observe := fs.Bool("observe-only", false, "read only: status, ls NAME, elect --listen")
	var prefixes []string
	fs.Func("prefix", "every lock whose name begins with `PREFIX` (repeatable)", func(p string) error {
		prefixes = append(prefixes, p)
		return nil
	})
	// Flags may come between the names: parse as many names as there are
	// arguments.
	names, rest, _, err := parseArgs(fs, args, len(args), grantsHelp, stdout)
	if err != nil {
		return err
	}
	names = append(names, rest...)
	switch {
	case len(names) == 0 && len(prefixes) == 0:
		return usageErr("grants", "missing lock NAME (or --prefix PREFIX)")
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
	for _, p := range prefixes {
		if err := prefixErr(p); err != nil {
			return err
		}
	}
	perm := "readwrite"
	if *observe {
		perm = "read"
	}
	for _, n := range names {
		for _, p := range grantPrefixes(n+"/", *delay || *minHold, *requests) {
			fmt.Fprintln(stdout, grantLine(*role, perm, p))
		}
	}
	for _, n := range prefixes {
		for _, p := range grantPrefixes(n, *delay || *minHold, *requests) {
			fmt.Fprintln(stdout, grantLine(*role, perm, p))
		}
	}
	return nil
}

// prefixErr says what is wrong with a --prefix p, as usage: nothing
// (every key, which needs no prefix: etcdctl's --from-key ""), a prefix
// of the library's own records, under which no lock's name begins, or a
// prefix of "__etcdlock/", whose keys hold every lock's records.
func prefixErr(p string) error {
	switch {
	case p == "":
		return usageErr("grants", `empty --prefix: that is every key (etcdctl grants it with --from-key "")`)
	case len(p) > etcdlock.MaxNameLen:
		return usageErr("grants", "--prefix is %d bytes, longer than a lock name may be (%d)", len(p), etcdlock.MaxNameLen)
	case strings.HasPrefix(p, "__etcdlock/"):
		return usageErr("grants", `--prefix %q: no lock's name begins with it ("__etcdlock" and the names under "__etcdlock/" are the library's own)`, p)
	case strings.HasPrefix("__etcdlock/", p):
		// "_", "__etcdlock": the keys with it hold the library's records
		// of every lock, other teams' too.
		return usageErr("grants", `--prefix %q would also grant the records under "__etcdlock/" of every lock, whatever its name: give a longer one`, p)
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

// grantPrefixes returns the key prefixes the uses of the locks whose keys
// begin with p touch: p itself ("NAME/" for one lock), and the records
// under the library's prefixes that the flags name.
func grantPrefixes(p string, delay, requests bool) []string {
	pfxs := []string{p}
	if delay {
		pfxs = append(pfxs, etcdlock.LockDelayPrefix+p)
	}
	if requests {
		pfxs = append(pfxs, etcdlock.ReleaseRequestPrefix+p)
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
