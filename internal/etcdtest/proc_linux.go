package etcdtest

import "syscall"

// sysProcAttr makes an etcd member die with the test process that started
// it, even if that process is killed: no server outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
