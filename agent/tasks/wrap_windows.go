package tasks

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/windows"

	"github.com/fleetmcp/fleetmcp/agent/winjob"
)

// The process layer of background tasks on Windows. The agent's own
// executable wraps the command (RunWrapper) and records its exit
// status in the task folder. The wrapper starts suspended in a Job Object
// named after the task and resumes only once it is in it, so the command
// and everything it starts are in the job. The job has no kill-on-close
// limit: it outlives the agent with its processes, and a restarted agent
// opens it by name to enforce the task's timeout or cancel it. The
// wrapper's creation time, recorded with its PID, tells it from a later
// process with the same PID.

// taskJobName is the name of task id's job object.
func taskJobName(id string) string { return "fleetmcp-task-" + id }

// startWrapped starts command through the task wrapper with attr, in the
// task's job object, and returns the wrapper's PID.
func (m *Manager) startWrapped(id string, command []string, attr *os.ProcAttr) (int, error) {
	if m.wrapper == "" {
		return 0, errors.New("background tasks on Windows need the agent's executable as their wrapper, and it is not known; restart the agent")
	}
	name := taskJobName(id)
	if h, err := winjob.Open(name); err == nil {
		windows.CloseHandle(h)
		return 0, fmt.Errorf("a job object named %s exists already; another program took the name", name)
	}
	name16, err := windows.UTF16PtrFromString(name)
	if err != nil {
		return 0, err
	}
	job, err := windows.CreateJobObject(nil, name16)
	if err != nil {
		return 0, fmt.Errorf("create job object %s: %w", name, err)
	}
	defer windows.CloseHandle(job) // the job lives on with its processes
	attr.Sys = &syscall.SysProcAttr{
		CreationFlags: windows.CREATE_SUSPENDED | windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_NO_WINDOW,
	}
	argv := append([]string{m.wrapper, WrapperFlag, m.store.path(id, exitFile)}, command...)
	p, err := os.StartProcess(m.wrapper, argv, attr)
	if err != nil {
		return 0, err
	}
	if err := winjob.AssignAndResume(job, p.Pid); err != nil {
		_ = p.Kill()
		_, _ = p.Wait()
		return 0, err
	}
	pid := p.Pid
	_ = p.Release()
	return pid, nil
}

// probe reports whether the task's wrapper has ended. How it ended is in
// its exit file; without one, the wrapper was killed.
func (m *Manager) probe(rt *runningTask) (bool, *procExit) {
	return !procAlive(rt.status.PID, rt.status.ProcStart, rt.status.BootID), nil
}

// killTask terminates every process in the task's job object, or, if the
// job cannot be opened, the wrapper alone.
func (m *Manager) killTask(rt *runningTask) {
	if job, err := winjob.Open(taskJobName(rt.id)); err == nil {
		_ = windows.TerminateJobObject(job, 1)
		windows.CloseHandle(job)
		return
	}
	if h, err := windows.OpenProcess(windows.PROCESS_TERMINATE, false, uint32(rt.status.PID)); err == nil {
		_ = windows.TerminateProcess(h, 1)
		windows.CloseHandle(h)
	}
}
