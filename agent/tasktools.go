package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The task tools: bash with background: true starts a task, task_status
// reports (and waits for) one, task_cancel stops one, task_list lists a
// host's tasks. They are served exactly when bash is.

// taskToolNames are the tools that come with bash.
func taskToolNames() []string { return protocol.TaskTools() }

const (
	// maxTaskWait caps task_status's wait; defaultTaskWait applies when
	// the caller gives none.
	maxTaskWait     = protocol.TaskMaxWait
	defaultTaskWait = protocol.TaskWait
	// Caps on what a task answer carries: the command as shown, and the
	// number of tasks task_list returns.
	maxShownCommand     = protocol.TaskShownCommand
	maxListedCommand    = protocol.TaskListedCommand
	defaultTaskListSize = protocol.TaskListSize
	maxTaskListSize     = protocol.TaskMaxListSize
)

// taskView is a task as the task tools report it (also their structured
// content).
type taskView struct {
	TaskID          string      `json:"task_id"`
	Host            string      `json:"host,omitempty"`
	State           tasks.State `json:"state"`
	Command         string      `json:"command"`
	ExitCode        *int        `json:"exit_code,omitempty"`
	Signal          string      `json:"signal,omitempty"`
	Note            string      `json:"note,omitempty"`
	Caller          string      `json:"caller,omitempty"`
	Created         time.Time   `json:"created"`
	Started         time.Time   `json:"started,omitzero"`
	Ended           time.Time   `json:"ended,omitzero"`
	Deadline        time.Time   `json:"deadline,omitzero"`
	TimeoutSeconds  float64     `json:"timeout_seconds"`
	RuntimeSeconds  float64     `json:"runtime_seconds,omitempty"`
	QueuePosition   int         `json:"queue_position,omitempty"`
	OutputFile      string      `json:"output_file"`
	OutputBytes     int64       `json:"output_bytes"`
	OutputTail      *string     `json:"output_tail,omitempty"`
	TailTruncated   bool        `json:"output_tail_truncated,omitempty"`
	Reattached      bool        `json:"reattached,omitempty"`
	WaitedSeconds   float64     `json:"waited_seconds,omitempty"`
	WaitLimitReason string      `json:"wait_skipped,omitempty"`
}

// view builds the report of task id; tail adds the end of its output
// once it has ended.
func (t *toolbox) view(id string, st tasks.Status, req tasks.Request, commandCap int, tail bool) taskView {
	v := taskView{
		TaskID: id, Host: t.cfg.Host, State: st.State, Command: protocol.Ellipsis(req.Command, commandCap),
		ExitCode: st.ExitCode, Signal: st.Signal, Note: st.Note, Caller: req.Caller,
		Created: st.Created, Started: st.Started, Ended: st.Ended, Deadline: st.Deadline,
		TimeoutSeconds: req.Timeout().Seconds(),
		OutputFile:     t.tasks.OutputFile(id),
		OutputBytes:    t.tasks.OutputSize(id),
		Reattached:     st.Reattached,
	}
	switch {
	case !st.Ended.IsZero() && !st.Started.IsZero():
		v.RuntimeSeconds = roundSeconds(st.Ended.Sub(st.Started))
	case st.State == tasks.Running && !st.Started.IsZero():
		v.RuntimeSeconds = roundSeconds(time.Since(st.Started))
	case st.State == tasks.Queued:
		v.QueuePosition = t.tasks.QueuePosition(id)
	}
	if tail && st.State.Ended() {
		s, cut, err := t.tasks.Tail(id, func(fi fs.FileInfo) error { return t.guard.checkOpened(v.OutputFile, fi) })
		if err == nil {
			v.OutputTail, v.TailTruncated = &s, cut
		}
	}
	return v
}

func roundSeconds(d time.Duration) float64 { return d.Round(time.Millisecond).Seconds() }

// bashBackground starts a checked command as a background task.
func (t *toolbox) bashBackground(tc *toolCall, a protocol.BashArgs, dir string) *protocol.Result {
	timeout, r := t.taskTimeout(tc, a.Timeout)
	if r != nil {
		return r
	}
	id, err := t.tasks.Submit(tasks.Request{
		Command: a.Command, Params: a.Parameters, Shell: t.shell, Cwd: dir, TimeoutMS: timeout.Milliseconds(),
		Caller: tc.Caller, CallID: tc.ID,
	})
	if err != nil {
		return taskFailure(tc, "bash", err)
	}
	st, req, err := t.tasks.Record(id)
	if err != nil {
		return toolFailure(tc, "task %s was created but cannot be read back: %v", id, err)
	}
	v := t.view(id, st, req, maxShownCommand, false)
	var b strings.Builder
	switch {
	case st.State == tasks.Queued:
		fmt.Fprintf(&b, "Queued background task %s on %s: %d tasks are running, the host's limit; it starts when one ends (queue position %d, timeout %s once started).\n",
			id, t.hostName(), t.tasks.Limits().MaxRunning, v.QueuePosition, tasks.FormatSeconds(timeout))
	case st.PID == 0 && st.State.Ended():
		r := taskResult(tc, fmt.Sprintf("Background task %s on %s could not start: %s", id, t.hostName(), st.Note), v)
		r.IsError = true
		return r
	default:
		// Running, or a quick command that has ended already.
		fmt.Fprintf(&b, "Started background task %s on %s (timeout %s).\n", id, t.hostName(), tasks.FormatSeconds(timeout))
	}
	fmt.Fprintf(&b, "Output goes to %s (read it with read).\n", v.OutputFile)
	b.WriteString("Wait for it and see how it ended with task_status (it waits up to 60 s per call); stop it with task_cancel.")
	return taskResult(tc, b.String(), v)
}

// taskTimeout returns a background task's time limit for sec seconds
// (nil: the default), capped at the maximum.
func (t *toolbox) taskTimeout(tc *toolCall, sec *float64) (time.Duration, *protocol.Result) {
	cfg := t.tasks.Limits()
	switch {
	case sec == nil:
		return cfg.DefaultTimeout, nil
	case !(*sec > 0):
		return 0, toolBadArgs(tc, "bash", "timeout must be a positive number of seconds, not %v", *sec)
	case *sec >= cfg.MaxTimeout.Seconds():
		return cfg.MaxTimeout, nil
	}
	return max(time.Duration(*sec*float64(time.Second)), time.Millisecond), nil
}

// taskStatus reports a task, first waiting up to wait seconds for it to
// end.
func (t *toolbox) taskStatus(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.TaskStatusArgs
	if r := decodeArgs(tc, protocol.ToolTaskStatus, &a); r != nil {
		return r
	}
	if err := tasks.ValidID(a.TaskID); err != nil {
		return toolBadArgs(tc, protocol.ToolTaskStatus, "%v", err)
	}
	wait := defaultTaskWait
	if a.Wait != nil {
		if !(*a.Wait >= 0) {
			return toolBadArgs(tc, protocol.ToolTaskStatus, "wait must be a number of seconds from 0 to %v, not %v", maxTaskWait.Seconds(), *a.Wait)
		}
		wait = min(time.Duration(*a.Wait*float64(time.Second)), maxTaskWait)
	}
	start := time.Now()
	st, busy, err := t.tasks.Await(ctx, a.TaskID, wait)
	if err != nil {
		return t.taskLookupFailure(tc, a.TaskID, err)
	}
	req, err := t.tasks.Request(a.TaskID)
	if err != nil {
		return toolFailure(tc, "task %s: request file is unreadable: %v", a.TaskID, err)
	}
	v := t.view(a.TaskID, st, req, maxShownCommand, true)
	if !st.State.Ended() {
		v.WaitedSeconds = roundSeconds(time.Since(start))
	}
	if busy {
		v.WaitLimitReason = fmt.Sprintf("%d task_status calls are waiting on this host already, its limit; answered at once", t.tasks.Limits().MaxWaits)
	}
	return taskResult(tc, statusText(v), v)
}

// taskCancel stops a task: a queued one never starts, a running one has
// its whole process group killed.
func (t *toolbox) taskCancel(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.TaskCancelArgs
	if r := decodeArgs(tc, protocol.ToolTaskCancel, &a); r != nil {
		return r
	}
	if err := tasks.ValidID(a.TaskID); err != nil {
		return toolBadArgs(tc, protocol.ToolTaskCancel, "%v", err)
	}
	st, err := t.tasks.Cancel(ctx, a.TaskID)
	if errors.Is(err, tasks.ErrEnded) {
		req, _ := t.tasks.Request(a.TaskID)
		v := t.view(a.TaskID, st, req, maxShownCommand, true)
		r := taskResult(tc, fmt.Sprintf("Task %s was not cancelled: it has ended already.\n\n%s", a.TaskID, statusText(v)), v)
		r.IsError = true
		return r
	}
	if err != nil {
		return t.taskLookupFailure(tc, a.TaskID, err)
	}
	req, _ := t.tasks.Request(a.TaskID)
	v := t.view(a.TaskID, st, req, maxShownCommand, true)
	if st.State == tasks.Cancelled {
		return taskResult(tc, statusText(v), v)
	}
	r := taskResult(tc, fmt.Sprintf("Task %s was not cancelled: it ended first.\n\n%s", a.TaskID, statusText(v)), v)
	r.IsError = true
	return r
}

// taskList lists the host's tasks, newest first.
func (t *toolbox) taskList(_ context.Context, tc *toolCall) *protocol.Result {
	var a protocol.TaskListArgs
	if r := decodeArgs(tc, protocol.ToolTaskList, &a); r != nil {
		return r
	}
	if a.State != "" && !slices.Contains(tasks.States, tasks.State(a.State)) {
		return toolBadArgs(tc, protocol.ToolTaskList, "state %q is not a task state; use one of %s", protocol.Ellipsis(a.State, 40), joinStates())
	}
	limit := defaultTaskListSize
	if a.Limit != nil {
		if *a.Limit < 1 {
			return toolBadArgs(tc, protocol.ToolTaskList, "limit must be at least 1, not %d", *a.Limit)
		}
		limit = min(*a.Limit, maxTaskListSize)
	}
	ids, err := t.tasks.List()
	if err != nil {
		return toolFailure(tc, "cannot list tasks: %v", err)
	}
	views := []taskView{}
	matched, unreadable := 0, 0
	for _, id := range slices.Backward(ids) {
		st, err := t.tasks.Status(id)
		if err != nil {
			unreadable++
			continue
		}
		if a.State != "" && st.State != tasks.State(a.State) {
			continue
		}
		if matched++; len(views) >= limit {
			continue
		}
		req, _ := t.tasks.Request(id)
		views = append(views, t.view(id, st, req, maxListedCommand, false))
	}
	text := listText(t.hostName(), a.State, views, matched, unreadable)
	data, err := json.Marshal(map[string]any{"tasks": views, "matched": matched, "unreadable": unreadable})
	if err != nil {
		return toolFailure(tc, "encode task list: %v", err)
	}
	r := toolText(tc, text)
	r.Structured = data
	return r
}

func (t *toolbox) hostName() string {
	if t.cfg.Host == "" {
		return "this host"
	}
	return t.cfg.Host
}

// taskLookupFailure is the result for a task that cannot be reported.
func (t *toolbox) taskLookupFailure(tc *toolCall, id string, err error) *protocol.Result {
	if errors.Is(err, tasks.ErrUnknown) {
		return toolFailure(tc, "no task %s on %s: it never existed here or retention removed it (finished tasks are kept %s, at most %d); task_list shows the host's tasks",
			id, t.hostName(), tasks.FormatAge(t.tasks.Limits().Retention), t.tasks.Limits().MaxKept)
	}
	return toolFailure(tc, "%v", err)
}

// taskFailure is the result for a task request the manager refused.
func taskFailure(tc *toolCall, tool string, err error) *protocol.Result {
	var te *tasks.Error
	if errors.As(err, &te) {
		return protocol.ErrorResult(tc.ID, te.Code, te.Msg)
	}
	return toolFailure(tc, "%s: cannot start a background task: %v", tool, err)
}

// taskResult returns text with v as structured content.
func taskResult(tc *toolCall, text string, v taskView) *protocol.Result {
	r := toolText(tc, text)
	if data, err := json.Marshal(v); err == nil {
		r.Structured = data
	}
	return r
}

// statusText renders one task for a model.
func statusText(v taskView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Task %s on %s: %s", v.TaskID, hostOr(v.Host), stateText(v))
	b.WriteString("\nCommand: " + v.Command)
	switch {
	case v.State == tasks.Queued:
		fmt.Fprintf(&b, "\nQueued since %s (position %d); timeout %s once started.", stamp(v.Created), v.QueuePosition, tasks.FormatSeconds(secs(v.TimeoutSeconds)))
	case v.State == tasks.Running:
		fmt.Fprintf(&b, "\nRunning since %s (%s); it is killed at %s (timeout %s).",
			stamp(v.Started), tasks.FormatSeconds(secs(v.RuntimeSeconds)), stamp(v.Deadline), tasks.FormatSeconds(secs(v.TimeoutSeconds)))
	case !v.Started.IsZero():
		fmt.Fprintf(&b, "\nRan from %s to %s (%s; timeout %s).", stamp(v.Started), stamp(v.Ended), tasks.FormatSeconds(secs(v.RuntimeSeconds)), tasks.FormatSeconds(secs(v.TimeoutSeconds)))
	default:
		fmt.Fprintf(&b, "\nEnded %s without running.", stamp(v.Ended))
	}
	if v.Note != "" {
		b.WriteString("\nNote: " + v.Note + ".")
	}
	if v.Reattached {
		b.WriteString("\nThe agent restarted while it ran and re-attached to it.")
	}
	fmt.Fprintf(&b, "\nOutput: %s in %s (read it with read).", tasks.FormatBytes(v.OutputBytes), v.OutputFile)
	if v.WaitLimitReason != "" {
		b.WriteString("\nNot waited: " + v.WaitLimitReason + ".")
	} else if !v.State.Ended() && v.WaitedSeconds > 0 {
		fmt.Fprintf(&b, "\nStill %s after waiting %s; call task_status again to keep waiting.", v.State, tasks.FormatSeconds(secs(v.WaitedSeconds)))
	}
	if v.OutputTail != nil {
		switch {
		case *v.OutputTail == "":
			b.WriteString("\n(no output)")
		case v.TailTruncated:
			fmt.Fprintf(&b, "\n--- end of output ---\n%s", *v.OutputTail)
		default:
			fmt.Fprintf(&b, "\n--- output ---\n%s", *v.OutputTail)
		}
	}
	return b.String()
}

func stateText(v taskView) string {
	switch {
	case v.ExitCode != nil:
		return fmt.Sprintf("%s (exit code %d)", v.State, *v.ExitCode)
	case v.Signal != "":
		return fmt.Sprintf("%s (%s)", v.State, v.Signal)
	}
	return string(v.State)
}

// listText renders task_list's answer.
func listText(host, state string, views []taskView, matched, unreadable int) string {
	var b strings.Builder
	what := "tasks"
	if state != "" {
		what = state + " tasks"
	}
	fmt.Fprintf(&b, "%d %s on %s", matched, what, host)
	if len(views) < matched {
		fmt.Fprintf(&b, ", newest %d shown (raise limit for more)", len(views))
	} else if matched > 0 {
		b.WriteString(", newest first")
	}
	if unreadable > 0 {
		fmt.Fprintf(&b, "; %d task folders have an unreadable status", unreadable)
	}
	for _, v := range views {
		when := v.Created
		if !v.Started.IsZero() {
			when = v.Started
		}
		fmt.Fprintf(&b, "\n%s\t%s\t%s\t%s\t%s", v.TaskID, stateText(v), stamp(when), tasks.FormatSeconds(secs(v.RuntimeSeconds)), protocol.Ellipsis(oneLine(v.Command), protocol.TaskTableCommand))
	}
	return b.String()
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func hostOr(h string) string {
	if h == "" {
		return "this host"
	}
	return h
}

func joinStates() string {
	names := make([]string, len(tasks.States))
	for i, s := range tasks.States {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func secs(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }
