//go:build unix && !linux

package etcdlocksql_test

import "syscall"

// sysProcAttr runs initdb and postgres as cred (nil: as the test binary's
// user). There is no parent-death signal here: a killed test binary
// leaves its server running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
