//go:build unix

package agent

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// The process layer of bash on Unix: a command runs in its own process
// group, which a kill on timeout or cancel takes down whole.

// procGroup is the process group of a running command.
type procGroup struct{ pid int }

// startGroup starts cmd as the leader of a new process group.
func startGroup(cmd *exec.Cmd) (*procGroup, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &procGroup{pid: cmd.Process.Pid}, nil
}

// kill kills every process of the group.
func (g *procGroup) kill() { _ = syscall.Kill(-g.pid, syscall.SIGKILL) }

// release lets go of the group; its processes are not touched.
func (g *procGroup) release() {}

// outputPipe returns the pipe a command writes its output to.
func outputPipe() (r, w *os.File, err error) { return os.Pipe() }

// pipeBuffered returns the number of bytes waiting in the pipe pr, or -1
// if it cannot tell.
func pipeBuffered(pr *os.File) int {
	rc, err := pr.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	_ = rc.Control(func(fd uintptr) {
		if v, err := unix.IoctlGetInt(int(fd), ioctlPending); err == nil {
			n = v
		}
	})
	return n
}

// exitSignal returns the name of the signal that ended a process whose
// exit is ee, or "".
func exitSignal(ee *exec.ExitError) string {
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return signalName(ws.Signal())
	}
	return ""
}

// signalName returns the conventional name of sig, such as SIGKILL.
func signalName(sig syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
		syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
		syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
		syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
		syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
		syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
	}
	if name, ok := names[sig]; ok {
		return name
	}
	return fmt.Sprintf("%d (%v)", int(sig), sig)
}
