//go:build !linux

package etcdtest

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent's; elsewhere
// Close and t.Cleanup stop the members.
func sysProcAttr() *syscall.SysProcAttr { return nil }
