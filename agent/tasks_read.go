package agent

import "io/fs"

// This file is what the task tools may know of the manager: its limits
// and the tasks' records, read from their folders. Nothing here changes a
// task; submit, await and cancel (tasks_run.go) do.

// limits returns the bounds the manager was configured with, defaults
// applied.
func (m *taskManager) limits() taskConfig { return m.cfg }

// list returns the IDs of the tasks kept on disk, oldest first.
func (m *taskManager) list() ([]string, error) { return m.store.ids() }

// status reads task id's status; errUnknownTask when there is no such
// task.
func (m *taskManager) status(id string) (taskStatus, error) { return m.store.readStatus(id) }

// request reads what task id was asked to run.
func (m *taskManager) request(id string) (taskRequest, error) { return m.store.readRequest(id) }

// record reads task id's status and request.
func (m *taskManager) record(id string) (taskStatus, taskRequest, error) {
	st, err := m.status(id)
	if err != nil {
		return st, taskRequest{}, err
	}
	req, err := m.request(id)
	return st, req, err
}

// outputFile returns the path of task id's output (stdout and stderr
// merged), which callers may read.
func (m *taskManager) outputFile(id string) string { return m.store.path(id, taskOutputFile) }

// outputSize returns the size of task id's output so far.
func (m *taskManager) outputSize(id string) int64 { return m.store.outputSize(id) }

// tail returns the end of task id's output within the configured bounds
// (TailBytes, TailLines), and whether it was cut. check, when not nil,
// judges the opened file before anything is read from it.
func (m *taskManager) tail(id string, check func(fs.FileInfo) error) (string, bool, error) {
	return readTail(m.outputFile(id), m.cfg.TailBytes, m.cfg.TailLines, check)
}

// runningCount returns the number of background tasks running.
func (m *taskManager) runningCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.running)
}
