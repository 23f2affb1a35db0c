//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbNew returns a toolbox working in a fresh temporary directory.
func tbNew(t *testing.T) *toolbox {
	t.Helper()
	tb, err := newToolbox(toolboxConfig{
		Cwd:                t.TempDir(),
		StateDir:           filepath.Join(t.TempDir(), "state"),
		Shell:              "/bin/sh",
		BashDefaultTimeout: 120 * time.Second,
		BashMaxTimeout:     600 * time.Second,
		ChildEnv:           os.Environ(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// tbCall runs tool with args (marshalled unless already json.RawMessage)
// and returns its result and the output it streamed.
func tbCall(t *testing.T, ctx context.Context, tb *toolbox, tool string, args any) (*protocol.Result, string) {
	t.Helper()
	raw, ok := args.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(args); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	var live strings.Builder
	tc := &toolCall{ID: "call-1", Args: raw, Output: func(p []byte) {
		mu.Lock()
		live.Write(p)
		mu.Unlock()
	}}
	res := tb.tools()[tool](ctx, tc)
	if res.CallID != tc.ID {
		t.Errorf("%s result has call ID %q, want %q", tool, res.CallID, tc.ID)
	}
	mu.Lock()
	defer mu.Unlock()
	return res, live.String()
}

// tbText returns the text of a result with exactly one text content.
func tbText(t *testing.T, r *protocol.Result) string {
	t.Helper()
	if r.Error != nil {
		t.Fatalf("unexpected protocol error: %v", r.Error)
	}
	if len(r.Content) != 1 || r.Content[0].Type != "text" {
		t.Fatalf("result content = %+v, want one text", r.Content)
	}
	return r.Content[0].Text
}

// tbWant checks that r is a result (a failure when isErr) with text want.
func tbWant(t *testing.T, r *protocol.Result, isErr bool, want string) {
	t.Helper()
	if got := tbText(t, r); got != want {
		t.Errorf("text = %q\nwant   %q", got, want)
	}
	if r.IsError != isErr {
		t.Errorf("IsError = %v, want %v", r.IsError, isErr)
	}
}

// tbBadArgs checks that r is a bad-request error whose message contains want.
func tbBadArgs(t *testing.T, r *protocol.Result, want string) {
	t.Helper()
	if r.Error == nil || r.Error.Code != protocol.CodeBadRequest {
		t.Fatalf("result = %+v, want a %s error", r, protocol.CodeBadRequest)
	}
	if !strings.Contains(r.Error.Message, want) {
		t.Errorf("message = %q, want it to contain %q", r.Error.Message, want)
	}
}

func TestNewToolbox(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	good := func() toolboxConfig {
		return toolboxConfig{Cwd: dir, StateDir: filepath.Join(dir, "state", "sub"), Shell: "/bin/sh",
			BashDefaultTimeout: time.Minute, BashMaxTimeout: 10 * time.Minute}
	}
	tests := []struct {
		name   string
		change func(*toolboxConfig)
		want   string
	}{
		{"relative cwd", func(c *toolboxConfig) { c.Cwd = "rel" }, `working directory "rel" is not an absolute path`},
		{"missing cwd", func(c *toolboxConfig) { c.Cwd = filepath.Join(dir, "nope") }, "create it or choose another"},
		{"cwd is a file", func(c *toolboxConfig) { c.Cwd = file }, "is not a directory"},
		{"empty shell", func(c *toolboxConfig) { c.Shell = "" }, "shell is empty"},
		{"shell not executable", func(c *toolboxConfig) { c.Shell = file }, "is not an executable file"},
		{"shell not found", func(c *toolboxConfig) { c.Shell = "no-such-shell-xyz" }, "is not an executable file"},
		{"relative state dir", func(c *toolboxConfig) { c.StateDir = "state" }, "state directory \"state\" is not an absolute path"},
		{"state dir under a file", func(c *toolboxConfig) { c.StateDir = filepath.Join(file, "state") }, "create state directory"},
		{"zero timeout", func(c *toolboxConfig) { c.BashDefaultTimeout = 0 }, "bash timeouts must be positive"},
		{"negative max", func(c *toolboxConfig) { c.BashMaxTimeout = -time.Second }, "bash timeouts must be positive"},
		{"default above max", func(c *toolboxConfig) { c.BashDefaultTimeout = time.Hour }, "exceeds the maximum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := good()
			tt.change(&cfg)
			_, err := newToolbox(cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("newToolbox error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
	tb, err := newToolbox(good())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(good().StateDir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir: %v, mode %v; want mode 0700", err, fi.Mode())
	}
	names := slices.Sorted(maps.Keys(tb.tools()))
	if want := []string{"bash", "delete", "edit", "list", "move", "patch", "read", "search", "skill", "task_cancel", "task_list", "task_status", "write"}; !slices.Equal(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}
}

func TestToolboxResolve(t *testing.T) {
	tb := &toolbox{cfg: toolboxConfig{Cwd: "/work/dir"}, home: "/home/me"}
	tests := map[string]string{
		"~":              "/home/me",
		"~/":             "/home/me",
		"~/a/../b":       "/home/me/b",
		"~other/x":       "/work/dir/~other/x",
		"file.txt":       "/work/dir/file.txt",
		"./a/./b":        "/work/dir/a/b",
		"../up":          "/work/up",
		"/abs//x/../y/.": "/abs/y",
	}
	for in, want := range tests {
		if got, err := tb.resolve(in); err != nil || got != want {
			t.Errorf("resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := tb.resolve(""); err == nil {
		t.Error("resolve(\"\") succeeded, want an error")
	}
	tb.home = ""
	if _, err := tb.resolve("~/x"); err == nil || !strings.Contains(err.Error(), "no home directory") {
		t.Errorf("resolve(~/x) without home: %v", err)
	}
}

func TestToolboxPathLocks(t *testing.T) {
	var l pathLocks
	var wg sync.WaitGroup
	var a, b int
	counts := map[string]*int{"/a": &a, "/b": &b} // only read concurrently
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []string{"/a", "/b"}[i%2]
			unlock := l.lock(p)
			*counts[p]++ // the race detector catches unserialised access
			unlock()
		}()
	}
	wg.Wait()
	if a != 25 || b != 25 {
		t.Errorf("counts = %d, %d; want 25, 25", a, b)
	}
	if n := l.size(); n != 0 {
		t.Errorf("%d lock entries left, want 0", n)
	}

	unlock := l.lock("/c")
	got := make(chan bool)
	go func() {
		u := l.lock("/c")
		got <- true
		u()
	}()
	select {
	case <-got:
		t.Fatal("second lock of /c did not wait")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	<-got
}

func TestToolboxDecodeArgs(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	tests := []struct {
		tool, args, want string
	}{
		{"read", `{"path":"x","bogus":1}`, `read: invalid arguments: unknown field "bogus"; the arguments are path, offset, limit, binary_base64, anchor, context`},
		{"read", `{"path":"x","context":"3"}`, `field "context" must be an integer, not string`},
		{"write", `{"path":"x","expected_sha256":1}`, `field "expected_sha256" must be a string, not number`},
		{"write", `{"path":"x","overwrite":"no"}`, `field "overwrite" must be a boolean, not string`},
		{"write", `{"path":"x","sha256":"ab"}`, `unknown field "sha256"; the arguments are path, content, overwrite, expected_sha256`},
		{"read", `{"path":3}`, `read: invalid arguments: field "path" must be a string, not number`},
		{"read", `{"path":"x","offset":"2"}`, `field "offset" must be an integer, not string`},
		{"read", `{"path":"x","offset":1.5}`, `field "offset" must be an integer`},
		{"read", `["x"]`, `arguments must be a JSON object, not array`},
		{"read", `{"path":"x"} {}`, `unexpected data after the arguments object`},
		{"read", `{"path":`, `malformed JSON`},
		{"write", `{"path":"x","content":true}`, `field "content" must be a string, not bool`},
		{"edit", `{"path":"x","edits":[{"old_string":"a","new":"b"}]}`, `unknown field "new"; the arguments are path, edits, edits[].old_string, edits[].new_string, edits[].replace_all, expected_sha256`},
		{"edit", `{"path":"x","edits":{}}`, `field "edits" must be an array, not object`},
		{"bash", `{"command":"true","timeout":"soon"}`, `field "timeout" must be a number, not string`},
	}
	for _, tt := range tests {
		r, _ := tbCall(t, ctx, tb, tt.tool, json.RawMessage(tt.args))
		tbBadArgs(t, r, tt.want)
	}
	// Missing arguments are an empty object: the tool reports what is
	// missing.
	r, _ := tbCall(t, ctx, tb, "read", json.RawMessage(nil))
	tbWant(t, r, true, "path is empty; give the file to read")
}

func TestToolboxLockFileThroughLinks(t *testing.T) {
	tb := tbNew(t)
	real := filepath.Join(tb.cfg.Cwd, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(tb.cfg.Cwd, "alias")); err != nil {
		t.Fatal(err)
	}
	unlock, err := tb.lockFile(filepath.Join(tb.cfg.Cwd, "alias", "f.txt"))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan bool)
	go func() {
		u, err := tb.lockFile(filepath.Join(real, "f.txt"))
		if err != nil {
			t.Error(err)
		}
		got <- true
		u()
	}()
	select {
	case <-got:
		t.Fatal("the same file through a directory link was not locked")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	<-got
}

// Two agents on one host (two toolboxes here: their in-process locks are
// separate, as two processes' would be) changing one file with the same
// expected hash: the directory lock lets exactly one win.
func TestTwoAgentsOneFileCompareAndSwap(t *testing.T) {
	a, b := tbNew(t), tbNew(t)
	p := filepath.Join(a.cfg.Cwd, "shared.txt")
	if err := os.WriteFile(p, []byte("v0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := sha256Hex([]byte("v0\n"))
	for round := range 20 {
		var wg sync.WaitGroup
		results := make([]bool, 8)
		for i := range results {
			tb := []*toolbox{a, b}[i%2]
			wg.Go(func() {
				r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": p, "content": fmt.Sprintf("round %d writer %d\n", round, i), "expected_sha256": want})
				results[i] = !r.IsError
			})
		}
		wg.Wait()
		if n := len(slices.DeleteFunc(results, func(ok bool) bool { return !ok })); n != 1 {
			t.Fatalf("round %d: %d writers won, want exactly 1", round, n)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		want = sha256Hex(data)
	}
	if len(a.dirLocks.m) != 0 {
		t.Errorf("directory locks left held: %v", a.dirLocks.m)
	}
}

// A directory another process keeps locked fails the change after the
// wait, changing nothing; a directory that does not exist yet is not
// locked.
func TestDirLockHeldElsewhere(t *testing.T) {
	dir := t.TempDir()
	release, err := flockDir(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	start := time.Now()
	if _, err := flockDir(dir, 100*time.Millisecond); !errors.Is(err, errDirLocked) {
		t.Fatalf("second lock: %v, want errDirLocked", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("gave up after %v", d)
	}
	var l dirLocks
	unlock, err := l.lock(filepath.Join(dir, "not-yet"), filepath.Join(dir, "not-yet"))
	if err != nil {
		t.Fatalf("missing directory: %v", err)
	}
	unlock()
}

func TestWithin(t *testing.T) {
	for _, tt := range []struct {
		p, dir string
		want   bool
	}{
		{"/a/b", "/a", true}, {"/a", "/a", true}, {"/ab", "/a", false}, {"/x", "/", true}, {"/", "/", true}, {"/a/b", "/a/b/c", false},
	} {
		if got := within(tt.p, tt.dir); got != tt.want {
			t.Errorf("within(%q, %q) = %v", tt.p, tt.dir, got)
		}
	}
}

func TestEvalExisting(t *testing.T) {
	dir := t.TempDir()
	real, _ := filepath.EvalSymlinks(dir)
	mkdirs(t, filepath.Join(dir, "a"))
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		filepath.Join(dir, "link", "new", "file"): filepath.Join(real, "a", "new", "file"),
		filepath.Join(dir, "a"):                   filepath.Join(real, "a"),
		filepath.Join(dir, "missing"):             filepath.Join(real, "missing"),
	} {
		if got, err := evalExisting(in); err != nil || got != want {
			t.Errorf("evalExisting(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
