package etcdlocksql_test

import "syscall"

// sysProcAttr runs initdb and postgres as cred (nil: as the test binary's
// user), and makes the server die with the test binary, even a killed
// one: SIGQUIT is PostgreSQL's immediate shutdown, which ends its
// children too. Go sets the parent-death signal after the credentials,
// whose change would clear it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT}
}
