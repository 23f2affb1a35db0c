package tasks

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Config bounds background tasks. Zero values mean the defaults.
type Config struct {
	// DefaultTimeout applies when a task is started without a timeout
	// (1 h); MaxTimeout caps any requested one (24 h).
	DefaultTimeout, MaxTimeout time.Duration
	// MaxRunning bounds tasks running at once (8). MaxQueued bounds tasks
	// waiting for a free slot (32; negative: none wait, a task beyond
	// MaxRunning is refused as busy).
	MaxRunning, MaxQueued int
	// Retention: finished tasks that ended longer ago are removed when a
	// new task starts (30 days).
	Retention time.Duration
	// MaxKept bounds the task folders kept (1000), MaxKeptBytes their
	// output (1 GiB): beyond either, the oldest finished tasks go.
	MaxKept      int
	MaxKeptBytes int64
	// MaxOutputBytes bounds one task's output file (100 MiB); a task that
	// writes more is killed.
	MaxOutputBytes int64
	// TailBytes and TailLines bound the end of the output task_status
	// returns (8 KiB, 50 lines).
	TailBytes, TailLines int
	// MaxWaits bounds task_status calls waiting at once, each holding one
	// of the agent's workers (8); beyond it task_status answers at once.
	MaxWaits int
	// Poll is the longest pause between two checks of a running task
	// (250 ms).
	Poll time.Duration
}

func (c *Config) setDefaults() {
	setDur(&c.DefaultTimeout, protocol.TaskTimeout)
	setDur(&c.MaxTimeout, protocol.TaskMaxTimeout)
	setDur(&c.Retention, protocol.TaskRetention)
	setDur(&c.Poll, 250*time.Millisecond)
	setInt(&c.MaxRunning, protocol.TaskMaxRunning)
	switch {
	case c.MaxQueued == 0:
		c.MaxQueued = protocol.TaskMaxQueued
	case c.MaxQueued < 0:
		c.MaxQueued = 0
	}
	setInt(&c.MaxKept, protocol.TaskMaxKept)
	setInt(&c.MaxKeptBytes, protocol.TaskMaxKeptBytes)
	setInt(&c.MaxOutputBytes, protocol.TaskMaxOutputBytes)
	setInt(&c.TailBytes, protocol.TaskTailBytes)
	setInt(&c.TailLines, protocol.TaskTailLines)
	setInt(&c.MaxWaits, 8)
}

func setDur(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

func setInt[T int | int64](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// MaxTail bounds TailBytes, so that a task_status result (the tail,
// the command and the task's facts) stays within its protocol limit.
const MaxTail = protocol.MaxShortResultText / 2

func (c *Config) validate() error {
	var errs []error
	if c.DefaultTimeout < 0 || c.MaxTimeout < 0 || c.DefaultTimeout > c.MaxTimeout {
		errs = append(errs, fmt.Errorf("background task timeouts: the default (--task_timeout %v) must be positive and at most the maximum (--task_max_timeout %v)", c.DefaultTimeout, c.MaxTimeout))
	}
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"running background tasks (--max_tasks)", int64(c.MaxRunning)}, {"kept background tasks (--max_kept_tasks)", int64(c.MaxKept)},
		{"kept background task output (--max_kept_task_output_mib)", c.MaxKeptBytes}, {"output per background task (--max_task_output_mib)", c.MaxOutputBytes},
		{"background task output tail (--task_tail_bytes)", int64(c.TailBytes)}, {"background task output tail lines", int64(c.TailLines)},
		{"waiting task_status calls", int64(c.MaxWaits)},
	} {
		if v.n < 1 {
			errs = append(errs, fmt.Errorf("the limit on %s must be at least 1, not %d", v.name, v.n))
		}
	}
	if c.TailBytes > MaxTail {
		errs = append(errs, fmt.Errorf("background task output tail (--task_tail_bytes) %d is above %d: task_status results are limited to %d KiB in the fleet protocol",
			c.TailBytes, MaxTail, protocol.MaxShortResultText>>10))
	}
	if c.Retention < 0 || c.Poll < 0 {
		errs = append(errs, errors.New("background task retention (--task_retention) must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *Config) retention() retentionRules {
	return retentionRules{maxAge: c.Retention, maxTasks: c.MaxKept, maxBytes: c.MaxKeptBytes}
}

// Manager starts background tasks, supervises them (deadline, output
// cap, cancellation) and records how they end. Tasks are not its
// children alone: they run in their own session with their output going
// to a file, so they outlive the agent; a new manager on the same state
// directory re-attaches to those still running.
type Manager struct {
	cfg   Config
	store *diskStore
	shell string   // runs the commands
	cwd   string   // where they run
	env   []string // their environment
	// wrapper is the agent's executable, which wraps tasks where there is
	// no sh (Windows; see RunWrapper).
	wrapper    string
	invocation func(shell, script, command string, params map[string]json.RawMessage) (argv, env []string, err error)
	log        *slog.Logger

	mu      sync.Mutex
	phase   taskPhase
	running map[string]*runningTask
	queue   []string      // queued task IDs, oldest first
	changed chan struct{} // closed and replaced whenever a task changes
	waits   int           // task_status calls waiting now

	closing     chan struct{} // closed when shutdown begins: waits end
	closingOnce sync.Once
	stop        chan struct{} // closed by close: supervisors let go
	stopOnce    sync.Once
	wg          sync.WaitGroup // supervisors
}

type taskPhase int

const (
	phaseNew taskPhase = iota
	phaseOpen
	phaseClosing
)

// runningTask is a task being supervised.
type runningTask struct {
	id         string
	status     Status // as last written
	own        bool   // started by this manager: reaped with wait4
	reattached bool   // found running by this manager when it opened
	cancel     chan struct{}
	cancelOnce sync.Once
	done       chan struct{} // closed once the final status is written
}

func (rt *runningTask) requestCancel() { rt.cancelOnce.Do(func() { close(rt.cancel) }) }

// outcome is how a task ended.
type outcome struct {
	state  State
	code   *int
	signal string
	note   string
}

// Setup is where and how a manager runs its tasks.
type Setup struct {
	// StateDir is the agent's state directory: tasks live in
	// StateDir/tasks.
	StateDir string
	// Shell runs the commands, Cwd is where they run, unless a request
	// names its own; Env is their environment.
	Shell, Cwd string
	Env        []string
	// Wrapper is the agent's executable, which wraps tasks where there is
	// no sh (Windows; see RunWrapper).
	Wrapper string
	// Invocation returns the arguments (program first) and the extra
	// environment that run command in shell, with the named parameters
	// of a PowerShell script; a script it needs is written at script
	// plus an extension, inside the task's folder.
	Invocation func(shell, script, command string, params map[string]json.RawMessage) (argv, env []string, err error)
	Log        *slog.Logger
}

// New returns a manager of the tasks in setup.StateDir, bounded by cfg
// (zero values: the defaults). Open starts it.
func New(cfg Config, setup Setup) (*Manager, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if setup.Invocation == nil {
		return nil, errors.New("background tasks: no shell invocation given")
	}
	log := setup.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{
		cfg:        cfg,
		store:      &diskStore{dir: setup.StateDir + "/tasks"},
		shell:      setup.Shell,
		cwd:        setup.Cwd,
		env:        setup.Env,
		wrapper:    setup.Wrapper,
		invocation: setup.Invocation,
		log:        log,
		running:    make(map[string]*runningTask),
		changed:    make(chan struct{}),
		closing:    make(chan struct{}),
		stop:       make(chan struct{}),
	}, nil
}

// Error is a task request the manager refuses.
type Error struct {
	// Code is the protocol error code a call refused this way gets.
	Code protocol.Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

var errClosed = &Error{protocol.CodeShuttingDown, "background tasks are not available: the agent is starting or shutting down; retry shortly"}

// Open applies retention, takes over the tasks a previous agent left
// (re-attaching to those still running, recording how the others ended)
// and starts queued tasks.
func (m *Manager) Open() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.phase != phaseNew {
		return errors.New("task manager: opened twice")
	}
	if err := os.MkdirAll(m.store.dir, 0o700); err != nil {
		return fmt.Errorf("task directory: %w", err)
	}
	now := time.Now()
	if removed := m.store.prune(now, m.cfg.retention(), 0); len(removed) > 0 {
		m.log.Info("old background tasks removed", "count", len(removed))
	}
	ids, err := m.store.ids()
	if err != nil {
		return fmt.Errorf("task directory: %w", err)
	}
	for _, id := range ids {
		st, err := m.store.readStatus(id)
		if err != nil {
			m.log.Warn("task folder left as it is", "task", id, "err", err)
			continue
		}
		switch st.State {
		case Queued:
			m.queue = append(m.queue, id)
		case Running:
			m.recoverLocked(id, st, now)
		}
	}
	m.phase = phaseOpen
	m.scheduleLocked()
	return nil
}

// recoverLocked takes over a task a previous agent recorded as running.
func (m *Manager) recoverLocked(id string, st Status, now time.Time) {
	if st.PID > 0 && procAlive(st.PID, st.ProcStart, st.BootID) {
		rt := &runningTask{id: id, status: st, reattached: true, cancel: make(chan struct{}), done: make(chan struct{})}
		m.running[id] = rt
		m.wg.Add(1)
		go m.supervise(rt)
		m.log.Info("background task re-attached", "task", id, "pid", st.PID, "deadline", st.Deadline)
		return
	}
	o := outcome{state: Lost, note: "the agent restarted and the task's process was gone; it recorded no exit code"}
	if st.PID == 0 {
		o.note = "the agent stopped while starting the task; whether it ran is unknown"
	}
	if code, ok := m.store.readExit(id); ok {
		o = exitOutcome(code)
		o.note = "ended while no agent was running"
	}
	m.writeEnd(id, &st, o, now)
	m.log.Info("background task found ended", "task", id, "state", st.State)
}

// Submit creates a task for req and starts it, or queues it when
// MaxRunning tasks run already. It returns the new task's ID.
func (m *Manager) Submit(req Request) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.phase != phaseOpen {
		return "", errClosed
	}
	if len(m.running) >= m.cfg.MaxRunning && len(m.queue) >= m.cfg.MaxQueued {
		return "", &Error{protocol.CodeBusy, fmt.Sprintf(
			"busy: %d background tasks are running and %d queued, this host's limits (--max_tasks %d, --max_task_queue %d); "+
				"wait for one to end (task_list, task_status) or cancel one (task_cancel)",
			len(m.running), len(m.queue), m.cfg.MaxRunning, m.cfg.MaxQueued)}
	}
	now := time.Now()
	if removed := m.store.prune(now, m.cfg.retention(), 1); len(removed) > 0 {
		m.log.Info("old background tasks removed", "count", len(removed))
	}
	req.ID, req.Created = newID(now), now
	if err := m.store.create(req, Status{State: Queued, Created: now}); err != nil {
		return "", err
	}
	if len(m.running) < m.cfg.MaxRunning {
		m.launchLocked(req)
	} else {
		m.queue = append(m.queue, req.ID)
	}
	m.notifyLocked()
	return req.ID, nil
}

// scheduleLocked starts queued tasks while there is room.
func (m *Manager) scheduleLocked() {
	for m.phase == phaseOpen && len(m.running) < m.cfg.MaxRunning && len(m.queue) > 0 {
		id := m.queue[0]
		m.queue = m.queue[1:]
		req, err := m.store.readRequest(id)
		if err != nil {
			st, serr := m.store.readStatus(id)
			if serr == nil {
				m.writeEnd(id, &st, outcome{state: Failed, note: "not started: its request file is unreadable: " + err.Error()}, time.Now())
			}
			continue
		}
		m.launchLocked(req)
	}
}

// launchLocked starts the process of a created task.
func (m *Manager) launchLocked(req Request) {
	id := req.ID
	st, err := m.store.readStatus(id)
	if err != nil {
		st = Status{Created: req.Created}
	}
	now := time.Now()
	st.State, st.Started, st.Deadline = Running, now, now.Add(req.Timeout())
	// Recorded as running before the process exists: after a crash in
	// between, the task is lost rather than run a second time.
	if err := m.store.writeStatus(id, st); err != nil {
		m.log.Error("cannot record background task; not starting it", "task", id, "err", err)
		m.writeEnd(id, &st, outcome{state: Failed, note: "not started: its status could not be recorded: " + err.Error()}, now)
		return
	}
	pid, err := m.spawn(req)
	if err != nil {
		m.writeEnd(id, &st, outcome{state: Failed, note: "could not start: " + err.Error()}, time.Now())
		return
	}
	st.PID, st.BootID = pid, bootID()
	st.ProcStart, _, _ = procIdentity(pid) // not reaped yet: still readable
	if err := m.store.writeStatus(id, st); err != nil {
		m.log.Warn("cannot record background task's process; an agent restart will find it lost", "task", id, "err", err)
	}
	rt := &runningTask{id: id, status: st, own: true, cancel: make(chan struct{}), done: make(chan struct{})}
	m.running[id] = rt
	m.wg.Add(1)
	go m.supervise(rt)
	m.log.Debug("background task started", "task", id, "pid", pid, "timeout", req.Timeout())
}

// spawn starts req's command through the task wrapper, in a process
// group of its own (a Job Object on Windows) with its output going to the
// task's output file, and returns the wrapper's PID. The process is not
// waited for here: the supervisor reaps it.
func (m *Manager) spawn(req Request) (int, error) {
	shell := cmp.Or(req.Shell, m.shell)
	argv, env, err := m.invocation(shell, m.store.path(req.ID, "script"), req.Command, req.Params)
	if err != nil {
		return 0, err
	}
	out, err := os.OpenFile(m.store.path(req.ID, OutputFileName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	dir := cmp.Or(req.Cwd, m.cwd)
	return m.startWrapped(req.ID, argv, &os.ProcAttr{
		Dir:   dir,
		Env:   append(append(slices.Clip(m.env), env...), "PWD="+dir),
		Files: []*os.File{null, out, out},
	})
}

// supervise watches a running task until it ends, enforcing its deadline,
// its output cap and cancellation, and records how it ended. When the
// manager closes it lets go of the task, which keeps running.
func (m *Manager) supervise(rt *runningTask) {
	defer m.wg.Done()
	delay := 10 * time.Millisecond
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastSize int64
	for {
		select {
		case <-m.stop:
			return
		case <-rt.cancel:
		case <-timer.C:
		}
		if ended, ws := m.probe(rt); ended {
			m.finish(rt, m.naturalEnd(rt, ws))
			return
		}
		size := m.store.outputSize(rt.id)
		if o, hit := m.limitHit(rt, size); hit {
			m.killGroup(rt)
			if !m.awaitExit(rt, 10*time.Second) {
				o.note += "; its process did not exit after SIGKILL"
			}
			m.finish(rt, o)
			return
		}
		delay = min(delay*2, m.cfg.Poll, max(time.Until(rt.status.Deadline), time.Millisecond))
		if grew := size - lastSize; 2*grew >= m.cfg.MaxOutputBytes-size {
			// At this rate the output may pass its cap before the next
			// check: look again soon.
			delay = minPoll
		}
		lastSize = size
		timer.Reset(delay)
	}
}

// minPoll is the shortest pause between checks of a running task.
const minPoll = 10 * time.Millisecond

// procAlive reports whether pid is still the running process recorded
// with start time start in boot boot (empty: unknown, not compared).
func procAlive(pid int, start, boot string) bool {
	if now := bootID(); boot != "" && now != "" && boot != now {
		return false
	}
	got, exited, err := procIdentity(pid)
	if err != nil || exited {
		return false
	}
	return start == "" || got == "" || got == start
}

// limitHit reports whether the task, whose output has size bytes, must
// be stopped now, and why.
func (m *Manager) limitHit(rt *runningTask, size int64) (outcome, bool) {
	select {
	case <-rt.cancel:
		return outcome{state: Cancelled, note: "cancelled with task_cancel; its process group was killed"}, true
	default:
	}
	if !time.Now().Before(rt.status.Deadline) {
		timeout := rt.status.Deadline.Sub(rt.status.Started)
		return outcome{state: TimedOut, note: fmt.Sprintf("timed out after %s; its process group was killed", FormatSeconds(timeout))}, true
	}
	if size > m.cfg.MaxOutputBytes {
		return outcome{state: Failed, note: fmt.Sprintf("its output passed the limit of %s per task; its process group was killed", FormatBytes(m.cfg.MaxOutputBytes))}, true
	}
	return outcome{}, false
}

// killGroup kills the task's whole process group. A task this manager
// did not start is killed only while its process is still the recorded
// one, so a reused PID is never hit.
func (m *Manager) killGroup(rt *runningTask) {
	if !rt.own && !procAlive(rt.status.PID, rt.status.ProcStart, rt.status.BootID) {
		return
	}
	m.killTask(rt)
}

// awaitExit waits up to d for the task's process to end.
func (m *Manager) awaitExit(rt *runningTask, d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if ended, _ := m.probe(rt); ended {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// procExit is how a task's wrapper process ended, as far as waiting for
// it tells.
type procExit struct {
	signal string // the signal that killed it, if one did
	code   int
	exited bool // it exited with code
}

// naturalEnd says how a task that ended by itself ended.
func (m *Manager) naturalEnd(rt *runningTask, ws *procExit) outcome {
	if code, ok := m.store.readExit(rt.id); ok {
		return exitOutcome(code)
	}
	switch {
	case ws != nil && ws.signal != "":
		return outcome{state: Failed, signal: ws.signal, note: "killed by " + ws.signal + " from outside the agent"}
	case ws != nil && ws.exited:
		o := exitOutcome(ws.code)
		o.note = "its exit file was not written; the status is the wrapper's"
		return o
	}
	return outcome{state: Failed, note: "its process ended without recording an exit code (killed by a signal from outside the agent?)"}
}

func exitOutcome(code int) outcome {
	o := outcome{state: Succeeded, code: &code}
	if code != 0 {
		o.state = Failed
	}
	return o
}

// finish records how a supervised task ended and starts queued ones.
func (m *Manager) finish(rt *runningTask, o outcome) {
	st := rt.status
	st.Reattached = rt.reattached
	m.mu.Lock()
	m.writeEnd(rt.id, &st, o, time.Now())
	delete(m.running, rt.id)
	m.scheduleLocked()
	m.mu.Unlock()
	close(rt.done)
	m.log.Debug("background task ended", "task", rt.id, "state", st.State, "note", st.Note)
}

// writeEnd records a task's final state and tells waiters. m.mu is held.
func (m *Manager) writeEnd(id string, st *Status, o outcome, now time.Time) {
	st.State, st.Ended, st.ExitCode, st.Signal, st.Note = o.state, now, o.code, o.signal, o.note
	st.OutputBytes = m.store.outputSize(id)
	if err := m.store.writeStatus(id, *st); err != nil {
		m.log.Error("cannot record how a background task ended", "task", id, "state", o.state, "err", err)
	}
	m.notifyLocked()
}

func (m *Manager) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *Manager) changes() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// QueuePosition returns a queued task's place in the queue, from 1; 0
// when it is not queued.
func (m *Manager) QueuePosition(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Index(m.queue, id) + 1
}

// Await returns the task's status once it has ended, or after wait,
// whichever comes first; it also returns early when ctx ends or the agent
// shuts down. busy reports a wait skipped because MaxWaits calls wait
// already.
func (m *Manager) Await(ctx context.Context, id string, wait time.Duration) (st Status, busy bool, err error) {
	if wait > 0 {
		m.mu.Lock()
		if m.waits >= m.cfg.MaxWaits {
			busy, wait = true, 0
		} else {
			m.waits++
			defer func() {
				m.mu.Lock()
				m.waits--
				m.mu.Unlock()
			}()
		}
		m.mu.Unlock()
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch := m.changes()
		st, err = m.store.readStatus(id)
		if err != nil || st.State.Ended() || wait <= 0 {
			return st, busy, err
		}
		select {
		case <-ch:
		case <-timer.C:
			st, err = m.store.readStatus(id)
			return st, busy, err
		case <-ctx.Done():
			return st, busy, nil
		case <-m.closing:
			return st, busy, nil
		}
	}
}

// ErrEnded reports a cancel of a task that is no longer running.
var ErrEnded = errors.New("the task has ended already")

// Cancel stops a queued or running task and returns its final status. A
// running task's whole process group is killed.
func (m *Manager) Cancel(ctx context.Context, id string) (Status, error) {
	m.mu.Lock()
	if i := slices.Index(m.queue, id); i >= 0 {
		defer m.mu.Unlock()
		m.queue = slices.Delete(m.queue, i, i+1)
		st, err := m.store.readStatus(id)
		if err != nil {
			return st, err
		}
		m.writeEnd(id, &st, outcome{state: Cancelled, note: "cancelled with task_cancel while queued; it never ran"}, time.Now())
		return st, nil
	}
	rt := m.running[id]
	m.mu.Unlock()
	if rt == nil {
		st, err := m.store.readStatus(id)
		if err == nil && st.State.Ended() {
			err = ErrEnded
		} else if err == nil {
			err = fmt.Errorf("task %s is %s but not supervised by this agent; retry shortly", id, st.State)
		}
		return st, err
	}
	rt.requestCancel()
	timer := time.NewTimer(15 * time.Second)
	defer timer.Stop()
	select {
	case <-rt.done:
	case <-ctx.Done():
	case <-m.stop:
	case <-timer.C:
	}
	return m.store.readStatus(id)
}

// BeginClose refuses new tasks and ends waits; running tasks are still
// supervised.
func (m *Manager) BeginClose() {
	m.mu.Lock()
	m.phase = phaseClosing
	m.mu.Unlock()
	m.closingOnce.Do(func() { close(m.closing) })
}

// Close stops supervising: running tasks keep running, queued tasks stay
// queued, and the next manager on the same state directory takes them
// over.
func (m *Manager) Close() {
	m.BeginClose()
	m.stopOnce.Do(func() { close(m.stop) })
	m.wg.Wait()
}
