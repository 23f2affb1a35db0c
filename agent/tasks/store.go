package tasks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Background tasks live on the agent's disk, one folder per task under
// StateDir/tasks, so that they outlive the agent process:
//
//	tasks/<id>/request.json  what was asked (written once)
//	tasks/<id>/status.json   state, process identity, times, exit code
//	tasks/<id>/output.log    the command's stdout and stderr, merged
//	tasks/<id>/exit          the exit code, written by the task's wrapper
//	                         shell when the command ends, agent or not
//
// JSON files are replaced atomically (temporary file, fsync, rename, fsync
// of the folder), so a crash leaves the old or the new version, never half
// of one. A folder appears under its ID only once its request and first
// status are complete: it is built under a hidden temporary name and
// renamed into place.

// State is where a task is in its life.
type State string

const (
	Queued    State = "queued"
	Running   State = "running"
	Succeeded State = "succeeded"
	Failed    State = "failed"
	TimedOut  State = "timed_out"
	Cancelled State = "cancelled"
	// Lost: the agent restarted and the task's process was gone
	// without having recorded an exit code.
	Lost State = "lost"
)

// States lists every state, in the order of a task's life.
var States = []State{Queued, Running, Succeeded, Failed, TimedOut, Cancelled, Lost}

// Ended reports whether s is final.
func (s State) Ended() bool { return s != Queued && s != Running }

// File names inside a task folder.
const (
	requestFile    = "request.json"
	statusFile     = "status.json"
	OutputFileName = "output.log"
	exitFile       = "exit"
	// tempPrefix starts the name of a folder being built.
	tempPrefix = ".new-"
	// tempMaxAge is how old a folder left half-built by a crash must be
	// before retention removes it.
	tempMaxAge = time.Hour
	// maxFileBytes bounds a request or status file the agent reads.
	maxFileBytes = 1 << 20
)

// Request is what a caller asked for; it never changes.
type Request struct {
	ID      string `json:"id"`
	Command string `json:"command"`
	// Params are the named parameters of a PowerShell script.
	Params    map[string]json.RawMessage `json:"parameters,omitempty"`
	Shell     string                     `json:"shell"`
	Cwd       string                     `json:"cwd"`
	TimeoutMS int64                      `json:"timeout_ms"`
	Caller    string                     `json:"caller,omitempty"`
	CallID    string                     `json:"call_id,omitempty"`
	Created   time.Time                  `json:"created"`
}

func (r Request) Timeout() time.Duration { return time.Duration(r.TimeoutMS) * time.Millisecond }

// Status is a task's current state.
type Status struct {
	State    State     `json:"state"`
	Created  time.Time `json:"created"`
	Started  time.Time `json:"started,omitzero"`
	Ended    time.Time `json:"ended,omitzero"`
	Deadline time.Time `json:"deadline,omitzero"`
	// PID is the task's wrapper shell, leader of the task's own session
	// and process group. ProcStart and BootID identify that process
	// beyond its PID, which the system may reuse: its start time as the
	// kernel reports it (Linux: /proc/PID/stat field 22) and the boot it
	// ran in. Empty where the system does not tell.
	PID       int    `json:"pid,omitempty"`
	ProcStart string `json:"proc_start,omitempty"`
	BootID    string `json:"boot_id,omitempty"`

	ExitCode    *int   `json:"exit_code,omitempty"`
	Signal      string `json:"signal,omitempty"`
	Note        string `json:"note,omitempty"`
	OutputBytes int64  `json:"output_bytes,omitempty"`
	// Reattached reports that an agent other than the one that started
	// the task watched it to its end.
	Reattached bool `json:"reattached,omitempty"`
}

// parseStatus decodes a status file. Anything it cannot use is an
// error: a truncated or foreign file must never pass for a task the agent
// may remove.
func parseStatus(data []byte) (Status, error) {
	var st Status
	if err := decodeJSON(data, &st); err != nil {
		return Status{}, err
	}
	switch {
	case !slices.Contains(States, st.State):
		return Status{}, fmt.Errorf("unknown state %q", st.State)
	case st.Created.IsZero():
		return Status{}, errors.New("no creation time")
	case st.PID < 0:
		return Status{}, fmt.Errorf("negative pid %d", st.PID)
	case st.State.Ended() && st.Ended.IsZero():
		return Status{}, fmt.Errorf("state %s without an end time", st.State)
	case st.ExitCode != nil && (*st.ExitCode < 0 || *st.ExitCode > 255):
		return Status{}, fmt.Errorf("exit code %d out of range 0-255", *st.ExitCode)
	}
	return st, nil
}

// parseRequest decodes a request file.
func parseRequest(data []byte) (Request, error) {
	var r Request
	if err := decodeJSON(data, &r); err != nil {
		return Request{}, err
	}
	switch {
	case ValidID(r.ID) != nil:
		return Request{}, fmt.Errorf("bad task id: %w", ValidID(r.ID))
	case r.Command == "":
		return Request{}, errors.New("no command")
	case r.TimeoutMS <= 0:
		return Request{}, fmt.Errorf("timeout %d ms is not positive", r.TimeoutMS)
	}
	return r, nil
}

// decodeJSON decodes exactly one JSON object into v.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// parseExitCode decodes the exit file the wrapper shell writes: a decimal
// exit status 0-255 and a newline. Without the newline the write was cut
// short.
func parseExitCode(data []byte) (int, error) {
	s, ok := strings.CutSuffix(string(data), "\n")
	if !ok {
		return 0, errors.New("exit file does not end with a newline")
	}
	if s == "" || len(s) > 3 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("exit file holds %q, not an exit status", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 255 {
		return 0, fmt.Errorf("exit file holds %q, not an exit status 0-255", s)
	}
	return n, nil
}

// Task IDs sort by creation time and are safe in file names and
// arguments: "t", the UTC date and time to the microsecond, and 32 random
// bits, such as t20260514-093012-123456-9f3a1c2e.
const idLen = len("t20060102-150405-000000-00000000")

func newID(now time.Time) string {
	now = now.UTC()
	return fmt.Sprintf("t%s-%06d-%08x", now.Format("20060102-150405"), now.Nanosecond()/1000, rand.Uint32())
}

// ValidID checks the form of a task ID given by a caller.
func ValidID(id string) error {
	bad := func(why string) error {
		return fmt.Errorf("task_id %q is not a task ID (%s); task IDs look like t20260514-093012-123456-9f3a1c2e, as bash with background: true and task_list return them", protocol.Ellipsis(id, 80), why)
	}
	if len(id) != idLen {
		return bad(fmt.Sprintf("%d characters, want %d", len(id), idLen))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		var ok bool
		switch {
		case i == 0:
			ok = c == 't'
		case i == 9 || i == 16 || i == 23:
			ok = c == '-'
		case i > 23:
			ok = '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
		default:
			ok = '0' <= c && c <= '9'
		}
		if !ok {
			return bad(fmt.Sprintf("unexpected %q at position %d", c, i+1))
		}
	}
	return nil
}

// ErrUnknown reports a task ID with no folder.
var ErrUnknown = errors.New("no such task")

// unparseableError reports a task folder whose status cannot be read. Such
// folders are never removed: they may belong to a running task.
type unparseableError struct {
	id  string
	err error
}

func (e *unparseableError) Error() string {
	return fmt.Sprintf("task %s: status file is unreadable (%v); the folder is kept for inspection", e.id, e.err)
}

func (e *unparseableError) Unwrap() error { return e.err }

// diskStore reads and writes task folders under one directory.
type diskStore struct {
	dir string // StateDir/tasks
}

func (s *diskStore) path(id, name string) string { return filepath.Join(s.dir, id, name) }

// create makes the folder of a new task with its request, its first
// status and an empty output file. The folder appears complete or not at
// all.
func (s *diskStore) create(req Request, st Status) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("create task directory: %w", err)
	}
	tmp, err := os.MkdirTemp(s.dir, tempPrefix)
	if err != nil {
		return fmt.Errorf("create task folder: %w", err)
	}
	err = errors.Join(
		writeJSONFile(filepath.Join(tmp, requestFile), req),
		writeJSONFile(filepath.Join(tmp, statusFile), st),
		createEmpty(filepath.Join(tmp, OutputFileName)),
	)
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, req.ID))
	}
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("create task folder: %w", err)
	}
	safefs.SyncDir(s.dir)
	return nil
}

func createEmpty(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}

// readStatus returns a task's status: ErrUnknown when it has no
// folder, an *unparseableError when its status file is damaged.
func (s *diskStore) readStatus(id string) (Status, error) {
	data, err := readSmallFile(s.path(id, statusFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, derr := os.Stat(filepath.Join(s.dir, id)); derr == nil {
			return Status{}, &unparseableError{id, errors.New("status.json is missing")}
		}
		return Status{}, ErrUnknown
	case err != nil:
		return Status{}, &unparseableError{id, err}
	}
	st, err := parseStatus(data)
	if err != nil {
		return Status{}, &unparseableError{id, err}
	}
	return st, nil
}

// writeStatus replaces a task's status atomically and durably.
func (s *diskStore) writeStatus(id string, st Status) error {
	return writeJSONFile(s.path(id, statusFile), st)
}

func (s *diskStore) readRequest(id string) (Request, error) {
	data, err := readSmallFile(s.path(id, requestFile))
	if err != nil {
		return Request{}, err
	}
	r, err := parseRequest(data)
	if err == nil && r.ID != id {
		err = fmt.Errorf("request of task %s names task %s", id, r.ID)
	}
	return r, err
}

// readExit returns the exit code the task's wrapper recorded, if it did.
func (s *diskStore) readExit(id string) (int, bool) {
	data, err := readSmallFile(s.path(id, exitFile))
	if err != nil {
		return 0, false
	}
	code, err := parseExitCode(data)
	return code, err == nil
}

// outputSize returns the size of a task's output file (0 if it has none).
func (s *diskStore) outputSize(id string) int64 {
	fi, err := os.Lstat(s.path(id, OutputFileName))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// ids returns the IDs of the task folders, oldest first.
func (s *diskStore) ids() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && ValidID(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids) // IDs sort by creation time
	return ids, nil
}

func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(data) > maxFileBytes {
		err = fmt.Errorf("%s is larger than %d bytes", path, maxFileBytes)
	}
	return data, err
}

// writeJSONFile replaces path with v encoded as JSON (see safefs.WriteStateFile).
func writeJSONFile(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return safefs.WriteStateFile(path, append(data, '\n'))
}

// retentionRules bounds the finished tasks kept on disk.
type retentionRules struct {
	maxAge   time.Duration // finished longer ago than this: removed
	maxTasks int           // task folders kept, counting every state
	maxBytes int64         // output bytes kept, counting every state
}

// prune removes finished tasks: those that ended more than maxAge ago,
// then the oldest until at most maxTasks-reserve folders and maxBytes of
// output remain. Queued and running tasks and folders whose status cannot
// be read are never removed (they still count). Folders left half-built
// by a crash are removed once they are an hour old. It returns the IDs it
// removed.
func (s *diskStore) prune(now time.Time, r retentionRules, reserve int) []string {
	ids, err := s.ids()
	if err != nil {
		return nil
	}
	s.pruneTemp(now)
	type done struct {
		id    string
		ended time.Time
		size  int64
	}
	var finished []done
	var removed []string
	count, total := 0, int64(0)
	for _, id := range ids {
		size := s.outputSize(id)
		st, err := s.readStatus(id)
		if err == nil && st.State.Ended() && now.Sub(st.Ended) > r.maxAge {
			if os.RemoveAll(filepath.Join(s.dir, id)) == nil {
				removed = append(removed, id)
				continue
			}
		}
		count++
		total += size
		if err == nil && st.State.Ended() {
			finished = append(finished, done{id, st.Ended, size})
		}
	}
	slices.SortStableFunc(finished, func(a, b done) int { return a.ended.Compare(b.ended) })
	for _, f := range finished {
		if count+reserve <= r.maxTasks && total <= r.maxBytes {
			break
		}
		if os.RemoveAll(filepath.Join(s.dir, f.id)) == nil {
			removed = append(removed, f.id)
			count--
			total -= f.size
		}
	}
	if len(removed) > 0 {
		safefs.SyncDir(s.dir)
	}
	return removed
}

// pruneTemp removes folders a crash left half-built.
func (s *diskStore) pruneTemp(now time.Time) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > tempMaxAge {
			os.RemoveAll(filepath.Join(s.dir, e.Name()))
		}
	}
}

// readTail returns the end of the regular file at path: at most
// maxLines lines and maxBytes bytes, starting at a line start when the
// cut falls inside the file (unless a single line is longer than
// maxBytes) and at a UTF-8 boundary. cut reports whether anything before
// it was left out.
//
// The file is a task's output, whose name the task's command can
// replace: it is opened without following links or waiting on a pipe,
// must be a regular file, and must pass check (when not nil), which
// refuses the agent's credentials under another name.
func readTail(path string, maxBytes, maxLines int, check func(fs.FileInfo) error) (tail string, cut bool, err error) {
	d, err := safefs.OpenDir(filepath.Dir(path), false)
	if err != nil {
		return "", false, err
	}
	f, err := d.OpenRead(filepath.Base(path))
	d.Close()
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", false, err
	}
	if !safefs.OpenedRegular(fi) {
		return "", false, fmt.Errorf("%s is not a regular file", path)
	}
	if check != nil {
		if err := check(fi); err != nil {
			return "", false, err
		}
	}
	size := fi.Size()
	start := max(size-int64(maxBytes), 0)
	buf := make([]byte, size-start)
	n, err := f.ReadAt(buf, start)
	if err != nil && err != io.EOF {
		return "", false, err
	}
	return tailLines(buf[:n], start > 0, maxLines)
}

// tailLines keeps the last maxLines lines of b, the end of a text; cut
// says whether b starts inside it.
func tailLines(b []byte, cut bool, maxLines int) (string, bool, error) {
	if cut {
		// Drop the partial first line, unless it is all there is.
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b) {
			b = b[i+1:]
		}
	}
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	lines := 0
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			if lines++; lines == maxLines {
				b, cut = b[i+1:], true
				break
			}
		}
	}
	for len(b) > 0 && !utf8.RuneStart(b[0]) {
		b, cut = b[1:], true
	}
	return string(b), cut, nil
}
