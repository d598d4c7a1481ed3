//go:build !linux

package testenv

import "syscall"

// ChildProcAttr: only Linux can tie a child's life to its parent's; elsewhere
// the test's cleanup stops the server.
func ChildProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
