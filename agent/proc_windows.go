package agent

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"

	"github.com/fleetmcp/fleetmcp/agent/winjob"
)

// The process layer of bash on Windows: a command starts suspended, is put
// in a Job Object of its own before its first instruction runs, and only
// then resumes, so that every process it starts is in the job too and a
// kill on timeout or cancel (TerminateJobObject) takes the whole tree
// down. Its output goes to a pipe the agent reads with overlapped I/O, so
// that a read can be given a deadline as on Unix.

var (
	kernel32          = windows.NewLazySystemDLL("kernel32.dll")
	procPeekNamedPipe = kernel32.NewProc("PeekNamedPipe")
)

// procGroup is the Job Object of a running command.
type procGroup struct{ job windows.Handle }

// startGroup starts cmd in a new Job Object.
func startGroup(cmd *exec.Cmd) (*procGroup, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return nil, fmt.Errorf("create a job object: %w", err)
	}
	if err := startInJob(cmd, job); err != nil {
		windows.CloseHandle(job)
		return nil, err
	}
	return &procGroup{job: job}, nil
}

// startInJob starts cmd suspended, assigns it to job and resumes it. A
// process that cannot be put in the job is killed.
func startInJob(cmd *exec.Cmd, job windows.Handle) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// No console window; a process group of its own, so that a console
	// control event sent to the agent does not reach it.
	cmd.SysProcAttr.CreationFlags |= windows.CREATE_SUSPENDED | windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_NO_WINDOW
	if err := cmd.Start(); err != nil {
		return err
	}
	if err := winjob.AssignAndResume(job, cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return err
	}
	return nil
}

// kill terminates every process in the job.
func (g *procGroup) kill() { _ = windows.TerminateJobObject(g.job, 1) }

// release closes the job's handle. Processes still in it keep running
// (the job has no kill-on-close limit), as a command's background
// processes do on Unix.
func (g *procGroup) release() { windows.CloseHandle(g.job) }

// outputPipe returns a pipe whose read end is overlapped (so that Go's
// poller serves it and read deadlines work) and whose write end, for the
// command, is an ordinary synchronous handle.
func outputPipe() (r, w *os.File, err error) {
	name := fmt.Sprintf(`\\.\pipe\fleetmcp-%d-%x`, os.Getpid(), rand.Uint64())
	name16, err := windows.UTF16PtrFromString(name)
	if err != nil {
		return nil, nil, err
	}
	rh, err := windows.CreateNamedPipe(name16,
		windows.PIPE_ACCESS_INBOUND|windows.FILE_FLAG_OVERLAPPED|windows.FILE_FLAG_FIRST_PIPE_INSTANCE,
		windows.PIPE_TYPE_BYTE|windows.PIPE_READMODE_BYTE|windows.PIPE_WAIT|windows.PIPE_REJECT_REMOTE_CLIENTS,
		1, 64<<10, 64<<10, 0, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("create pipe: %w", err)
	}
	wh, err := windows.CreateFile(name16, windows.GENERIC_WRITE, 0, nil, windows.OPEN_EXISTING, 0, 0)
	if err != nil {
		windows.CloseHandle(rh)
		return nil, nil, fmt.Errorf("open pipe: %w", err)
	}
	return os.NewFile(uintptr(rh), "|0"), os.NewFile(uintptr(wh), "|1"), nil
}

// pipeBuffered returns the number of bytes waiting in the pipe pr, or -1
// if it cannot tell.
func pipeBuffered(pr *os.File) int {
	rc, err := pr.SyscallConn()
	if err != nil {
		return -1
	}
	n := -1
	_ = rc.Control(func(fd uintptr) {
		var avail uint32
		if r, _, _ := procPeekNamedPipe.Call(fd, 0, 0, 0, uintptr(unsafe.Pointer(&avail)), 0); r != 0 {
			n = int(avail)
		}
	})
	return n
}

// exitSignal returns "": Windows has no signals.
func exitSignal(*exec.ExitError) string { return "" }
