//go:build !unix

package etcdtest

// lockFile would keep test binaries from building the same etcd at once;
// here it does not lock. Each build writes a file of its own and renames
// it into place, so builds side by side only repeat work.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }

// claimPort would claim port p among processes; here the listen check
// alone guards it.
func claimPort(int) bool { return true }
