//go:build unix

package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testManager returns an open manager on a fresh state directory whose
// tasks run their command with sh -c.
func testManager(t *testing.T, stateDir string) *Manager {
	t.Helper()
	m, err := New(Config{Poll: 20 * time.Millisecond}, Setup{
		StateDir: stateDir, Shell: "/bin/sh", Cwd: t.TempDir(), Env: os.Environ(),
		Invocation: func(shell, _, command string, _ map[string]json.RawMessage) ([]string, []string, error) {
			return []string{shell, "-c", command}, nil, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// A recorded PID now used by another process (another start time) is
// never taken for the task, nor killed: the task is lost.
func TestLostWhenPIDReused(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	s := &diskStore{dir: stateDir + "/tasks"}
	stranger := mustStart(t, "sleep", "300")
	now := time.Now()
	reused := Status{State: Running, Created: now, Started: now, Deadline: now.Add(time.Hour), PID: stranger, ProcStart: "1", BootID: bootID()}
	id := newID(now)
	if err := s.create(Request{ID: id, Command: "sleep 300", Shell: "/bin/sh", Cwd: "/", TimeoutMS: 1000, Created: now}, reused); err != nil {
		t.Fatal(err)
	}
	m := testManager(t, stateDir)
	st, _, err := m.Await(context.Background(), id, 0)
	if err != nil || st.State != Lost {
		t.Fatalf("PID reused by another process: %+v, %v", st, err)
	}
	if st.Alive() {
		t.Error("the stranger passes for the task's process")
	}
	if err := syscall.Kill(stranger, 0); err != nil {
		t.Fatalf("the process that reused the PID was hit: %v", err)
	}
}

// A task submitted to the manager runs, and its status, request and
// output are read back through the manager.
func TestManagerRunsTask(t *testing.T) {
	m := testManager(t, filepath.Join(t.TempDir(), "state"))
	id, err := m.Submit(Request{Command: "echo hello; exit 3", TimeoutMS: 10000})
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidID(id); err != nil {
		t.Fatal(err)
	}
	st, _, err := m.Await(context.Background(), id, 30*time.Second)
	if err != nil || st.State != Failed || st.ExitCode == nil || *st.ExitCode != 3 {
		t.Fatalf("status %+v, %v", st, err)
	}
	if _, req, err := m.Record(id); err != nil || req.Command != "echo hello; exit 3" || req.Timeout() != 10*time.Second {
		t.Fatalf("request %+v, %v", req, err)
	}
	if tail, cut, err := m.Tail(id, nil); err != nil || tail != "hello\n" || cut {
		t.Fatalf("tail %q %v %v", tail, cut, err)
	}
	if n := m.OutputSize(id); n != int64(len("hello\n")) {
		t.Errorf("output size %d", n)
	}
	if ids, err := m.List(); err != nil || len(ids) != 1 || ids[0] != id {
		t.Errorf("list %v, %v", ids, err)
	}
	if _, _, err := m.Record("t20260514-093012-123456-9f3a1c2e"); !errors.Is(err, ErrUnknown) {
		t.Errorf("an unknown task: %v", err)
	}
	if _, err := m.Cancel(context.Background(), id); !errors.Is(err, ErrEnded) {
		t.Errorf("cancel of an ended task: %v", err)
	}
}

// A truncated status file makes a task unparseable: reported, never
// removed, and never mistaken for a task to take over.
func TestTaskStoreAtomicityAndRetention(t *testing.T) {
	s := &diskStore{dir: filepath.Join(t.TempDir(), "tasks")}
	now := time.Now()
	mk := func(age time.Duration, state State, outBytes int) string {
		t.Helper()
		created := now.Add(-age - time.Minute)
		id := newID(created)
		st := Status{State: state, Created: created}
		if state.Ended() {
			st.Started, st.Ended = created, now.Add(-age)
		}
		if err := s.create(Request{ID: id, Command: "x", TimeoutMS: 1000, Created: created}, st); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(s.path(id, OutputFileName), make([]byte, outBytes), 0o600); err != nil {
			t.Fatal(err)
		}
		return id
	}
	day := 24 * time.Hour
	oldDone := mk(40*day, Succeeded, 10)
	oldRunning := mk(40*day, Running, 10)
	oldQueued := mk(40*day, Queued, 10)
	broken := mk(40*day, Failed, 10)
	data, _ := os.ReadFile(s.path(broken, statusFile))
	os.WriteFile(s.path(broken, statusFile), data[:len(data)/2], 0o600)
	recent := []string{mk(3*day, Failed, 100), mk(2*day, Cancelled, 100), mk(day, Succeeded, 100)}

	if _, err := s.readStatus(broken); !errors.As(err, new(*unparseableError)) {
		t.Fatalf("truncated status: %v", err)
	}
	// No temporary files are left beside the status files.
	entries, _ := os.ReadDir(filepath.Join(s.dir, recent[0]))
	if len(entries) != 3 {
		t.Fatalf("task folder holds %d entries, want request, status and output", len(entries))
	}

	r := retentionRules{maxAge: 30 * day, maxTasks: 1000, maxBytes: 1 << 30}
	removed := s.prune(now, r, 0)
	if len(removed) != 1 || removed[0] != oldDone {
		t.Fatalf("age retention removed %v, want only %s", removed, oldDone)
	}
	// Count: 6 folders; room for 4 plus one new: the two oldest finished go.
	r.maxTasks = 5
	removed = s.prune(now, r, 1)
	if len(removed) != 2 || removed[0] != recent[0] || removed[1] != recent[1] {
		t.Fatalf("count retention removed %v, want %v", removed, recent[:2])
	}
	// Bytes: everything finished goes, never the rest.
	r.maxTasks, r.maxBytes = 1000, 1
	removed = s.prune(now, r, 0)
	if len(removed) != 1 || removed[0] != recent[2] {
		t.Fatalf("size retention removed %v", removed)
	}
	ids, _ := s.ids()
	if want := []string{oldRunning, oldQueued, broken}; fmt.Sprint(ids) != fmt.Sprint(sortedCopy(want)) {
		t.Fatalf("kept %v, want %v", ids, want)
	}

	// A folder a crash left half-built goes once it is an hour old.
	half := filepath.Join(s.dir, tempPrefix+"123")
	os.Mkdir(half, 0o700)
	s.prune(now, r, 0)
	if _, err := os.Stat(half); err != nil {
		t.Fatal("a fresh half-built folder was removed")
	}
	s.prune(now.Add(2*time.Hour), r, 0)
	if _, err := os.Stat(half); err == nil {
		t.Fatal("an old half-built folder was kept")
	}
}

func sortedCopy(s []string) []string {
	c := append([]string(nil), s...)
	for i := range c {
		for j := i + 1; j < len(c); j++ {
			if c[j] < c[i] {
				c[i], c[j] = c[j], c[i]
			}
		}
	}
	return c
}

func TestTaskIDs(t *testing.T) {
	now := time.Date(2026, 5, 14, 9, 30, 12, 123456789, time.UTC)
	id := newID(now)
	if !strings.HasPrefix(id, "t20260514-093012-123456-") || ValidID(id) != nil {
		t.Fatalf("id %q", id)
	}
	if later := newID(now.Add(time.Microsecond)); later < id {
		t.Fatalf("%s sorts before %s", later, id)
	}
	for _, bad := range []string{"", "t", id + "0", strings.ToUpper(id), "../" + id[3:], strings.Replace(id, "-", "_", 1)} {
		if ValidID(bad) == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func TestReadTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out")
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	os.WriteFile(path, []byte(b.String()), 0o600)
	tail, cut, err := readTail(path, 8<<10, 3, nil)
	if err != nil || tail != "line 97\nline 98\nline 99\n" || !cut {
		t.Fatalf("3 lines: %q %v %v", tail, cut, err)
	}
	tail, cut, _ = readTail(path, 20, 50, nil)
	if tail != "line 98\nline 99\n" || !cut {
		t.Fatalf("20 bytes: %q %v", tail, cut)
	}
	os.WriteFile(path, []byte("é"+strings.Repeat("x", 30)), 0o600)
	tail, cut, _ = readTail(path, 31, 50, nil)
	if tail != strings.Repeat("x", 30) || !cut {
		t.Fatalf("one long line: %q %v", tail, cut)
	}
	os.WriteFile(path, []byte("a\nb"), 0o600)
	if tail, cut, _ = readTail(path, 100, 50, nil); tail != "a\nb" || cut {
		t.Fatalf("whole: %q %v", tail, cut)
	}
}

func FuzzParseTaskFiles(f *testing.F) {
	code := 3
	good, _ := json.Marshal(Status{State: Failed, Created: time.Unix(1, 0), Ended: time.Unix(2, 0), ExitCode: &code, PID: 12})
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"state":"running","created":"2026-01-01T00:00:00Z","pid":-1}`))
	f.Add([]byte("0\n"))
	f.Add([]byte("255\n"))
	f.Add([]byte("256\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if st, err := parseStatus(data); err == nil {
			again, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			st2, err := parseStatus(again)
			if err != nil {
				t.Fatalf("a parsed status does not survive a round trip: %v\n%s", err, again)
			}
			if st2.State != st.State || st2.PID != st.PID {
				t.Fatalf("round trip changed the status: %+v vs %+v", st, st2)
			}
		}
		if code, err := parseExitCode(data); err == nil {
			n, aerr := strconv.Atoi(strings.TrimSuffix(string(data), "\n"))
			if aerr != nil || n != code || code < 0 || code > 255 {
				t.Fatalf("exit file %q parsed as %d", data, code)
			}
		}
		_, _ = parseRequest(data)
		if err := ValidID(string(data)); err == nil && (len(data) != idLen || strings.ContainsAny(string(data), "/.\\ \x00")) {
			t.Fatalf("unsafe task ID %q accepted", data)
		}
	})
}

func FuzzTailLines(f *testing.F) {
	f.Add([]byte("a\nb\nc\n"), true, 2)
	f.Add([]byte("\xe9\x80\x80abc"), true, 1)
	f.Fuzz(func(t *testing.T, data []byte, cut bool, maxLines int) {
		if maxLines < 1 || maxLines > 100 {
			return
		}
		tail, _, _ := tailLines(data, cut, maxLines)
		if !strings.HasSuffix(string(data), tail) {
			t.Fatalf("tail %q is not a suffix of %q", tail, data)
		}
		if n := strings.Count(strings.TrimSuffix(tail, "\n"), "\n"); n >= maxLines {
			t.Fatalf("%d lines kept, limit %d", n+1, maxLines)
		}
	})
}

// mustStart starts a process outside any task and kills it when the test
// ends.
func mustStart(t *testing.T, name string, args ...string) int {
	t.Helper()
	p, err := os.StartProcess("/bin/"+name, append([]string{name}, args...), &os.ProcAttr{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill(); p.Wait() })
	return p.Pid
}

// TestTaskTailWithinResultLimit: a task_status tail larger than its
// result may carry is refused at start, naming the flag.
func TestTaskTailWithinResultLimit(t *testing.T) {
	c := Config{TailBytes: 1 << 20}
	c.setDefaults()
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "--task_tail_bytes") {
		t.Errorf("a 1 MiB tail: %v", err)
	}
	c.TailBytes = MaxTail
	if err := c.validate(); err != nil {
		t.Errorf("a tail at the limit: %v", err)
	}
}
