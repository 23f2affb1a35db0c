package tasks

import "io/fs"

// This file is what the task tools may know of the manager: its limits
// and the tasks' records, read from their folders. Nothing here changes a
// task; submit, await and cancel (tasks_run.go) do.

// Limits returns the bounds the manager was configured with, defaults
// applied.
func (m *Manager) Limits() Config { return m.cfg }

// List returns the IDs of the tasks kept on disk, oldest first.
func (m *Manager) List() ([]string, error) { return m.store.ids() }

// Status reads task id's status; ErrUnknown when there is no such
// task.
func (m *Manager) Status(id string) (Status, error) { return m.store.readStatus(id) }

// Request reads what task id was asked to run.
func (m *Manager) Request(id string) (Request, error) { return m.store.readRequest(id) }

// Record reads task id's status and request.
func (m *Manager) Record(id string) (Status, Request, error) {
	st, err := m.Status(id)
	if err != nil {
		return st, Request{}, err
	}
	req, err := m.Request(id)
	return st, req, err
}

// OutputFile returns the path of task id's output (stdout and stderr
// merged), which callers may read.
func (m *Manager) OutputFile(id string) string { return m.store.path(id, OutputFileName) }

// OutputSize returns the size of task id's output so far.
func (m *Manager) OutputSize(id string) int64 { return m.store.outputSize(id) }

// Tail returns the end of task id's output within the configured bounds
// (TailBytes, TailLines), and whether it was cut. check, when not nil,
// judges the opened file before anything is read from it.
func (m *Manager) Tail(id string, check func(fs.FileInfo) error) (string, bool, error) {
	return readTail(m.OutputFile(id), m.cfg.TailBytes, m.cfg.TailLines, check)
}

// RunningCount returns the number of background tasks running.
func (m *Manager) RunningCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.running)
}

// Waiting returns the number of task_status calls waiting now.
func (m *Manager) Waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.waits
}

// Alive reports whether the process s records is still running: the same
// process, not a later one that reuses its PID.
func (s Status) Alive() bool { return s.PID > 0 && procAlive(s.PID, s.ProcStart, s.BootID) }
