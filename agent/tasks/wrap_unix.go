//go:build unix

package tasks

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// The process layer of background tasks on Unix: a small sh wrapper leads
// the task's own session and process group, runs the command and records
// its exit status in the task folder, so that the status survives the
// agent: sh -c taskWrapper EXITFILE ARGV...
const (
	taskWrapper  = `"$@"; c=$?; echo "$c" >"$0"; exit "$c"`
	wrapperShell = "/bin/sh"
)

// startWrapped starts command through the wrapper with attr, in a new session,
// and returns the wrapper's PID.
func (m *Manager) startWrapped(id string, command []string, attr *os.ProcAttr) (int, error) {
	attr.Sys = &syscall.SysProcAttr{Setsid: true}
	argv := append([]string{"sh", "-c", taskWrapper, m.store.path(id, exitFile)}, command...)
	p, err := os.StartProcess(wrapperShell, argv, attr)
	if err != nil {
		return 0, err
	}
	pid := p.Pid
	_ = p.Release()
	return pid, nil
}

// probe reports whether the task's wrapper process has ended and, for a
// child of this process, how.
func (m *Manager) probe(rt *runningTask) (bool, *procExit) {
	if rt.own {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(rt.status.PID, &ws, syscall.WNOHANG, nil)
		switch {
		case pid == rt.status.PID:
			e := &procExit{exited: ws.Exited(), code: ws.ExitStatus()}
			if ws.Signaled() {
				e.signal = signalName(ws.Signal())
			}
			return true, e
		case err == nil || errors.Is(err, syscall.EINTR):
			return false, nil
		}
		// ECHILD: not (or no longer) ours to wait for; judge by identity.
	}
	return !procAlive(rt.status.PID, rt.status.ProcStart, rt.status.BootID), nil
}

// killTask kills the task's whole process group.
func (m *Manager) killTask(rt *runningTask) {
	_ = syscall.Kill(-rt.status.PID, syscall.SIGKILL)
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
