package testenv

import "syscall"

// ChildProcAttr makes a server process die with the test binary, whatever
// ends it: no server outlives an interrupted run.
func ChildProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
