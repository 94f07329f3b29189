package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"go.etcd.io/etcd/api/v3/version"
)

const versionHelp = `Usage: etcdlock version

Prints the version of etcdlock, of Go it was built with, and of the etcd
client it talks to etcd with. etcdlock's version is the one the build
recorded: the release for 'go install ...@VERSION'; for a build in a git
checkout, a pseudo-version of its commit (v0.0.0-YYYYMMDDHHMMSS-COMMIT,
with "+dirty" when files were changed since); "devel" when the build
recorded none (go build -buildvcs=false, a git worktree, or no checkout).
`

// etcdClientModule is the module whose version 'etcdlock version' reports
// as the etcd client's.
const etcdClientModule = "go.etcd.io/etcd/client/v3"

func cmdVersion(args []string, stdout io.Writer) error {
	fset := newFlagSet("version")
	_, rest, _, err := parseArgs(fset, args, 0, versionHelp, stdout)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErr("version", "unexpected argument %q", rest[0])
	}
	mod, client := buildVersions()
	fmt.Fprintf(stdout, "etcdlock version: %s\nGo version: %s\netcd client version: %s\n", mod, runtime.Version(), client)
	return nil
}

// buildVersions returns the versions of etcdlock's module and of the etcd
// client module it was built with, as the build recorded them. A build
// that recorded no version for etcdlock says "devel"; without a record of the
// client, the etcd API version compiled in stands for it (etcd releases
// the two together).
func buildVersions() (mod, client string) {
	mod, client = "devel", "v"+version.Version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return mod, client
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		mod = v
	}
	for _, d := range bi.Deps {
		if d.Path != etcdClientModule {
			continue
		}
		if d.Replace != nil {
			d = d.Replace
		}
		if d.Version != "" {
			client = d.Version
		}
	}
	return mod, client
}
