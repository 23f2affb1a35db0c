package main

import "syscall"

// childAttr makes a child process die with the benchmark, so that none
// is left behind when it is killed.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
