//go:build unix

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbBash runs command with the bash tool and returns the result text,
// whether it is an error and the streamed output.
func tbBash(t *testing.T, tb *toolbox, args map[string]any) (string, bool, string) {
	t.Helper()
	r, live := tbCall(t, context.Background(), tb, "bash", args)
	return tbText(t, r), r.IsError, live
}

// processGone waits up to 2 s for process pid to be gone (or a zombie
// nobody has reaped yet) and reports whether it is.
func processGone(pid int) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return true
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'Z' {
			return true
		}
	}
	return false
}

// killLater kills process pid when the test ends.
func killLater(t *testing.T, pid int) {
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
}

// pidIn parses the process id on the first line of s.
func pidIn(t *testing.T, s string) int {
	t.Helper()
	line, _, _ := strings.Cut(s, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 1 {
		t.Fatalf("no pid in %q", s)
	}
	return pid
}

func TestBashOutput(t *testing.T) {
	tb := tbNew(t)
	tests := []struct {
		name    string
		command string
		want    string
		isErr   bool
	}{
		{"merged in order", "echo a; echo b >&2; echo c", "a\nb\nc\n", false},
		{"no output", "true", "(no output)", false},
		{"exit code", "echo out; echo err >&2; exit 3", "out\nerr\n\nCommand exited with code 3", true},
		{"exit code no output", "exit 1", "(no output)\n\nCommand exited with code 1", true},
		{"signal", "kill -TERM $$", "(no output)\n\nCommand was killed by signal SIGTERM", true},
		{"working directory", "pwd", tb.cfg.Cwd + "\n", false},
		{"stdin is empty", "cat; echo done", "done\n", false},
		{"no final newline", "printf 'a\\nb'", "a\nb", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, isErr, live := tbBash(t, tb, map[string]any{"command": tt.command})
			if text != tt.want || isErr != tt.isErr {
				t.Errorf("bash %q = %q (error %v), want %q (error %v)", tt.command, text, isErr, tt.want, tt.isErr)
			}
			// The status line follows one blank line; the streamed output
			// is the command's own, with its final newline.
			out, _, cut := strings.Cut(tt.want, "\n\nCommand")
			if cut {
				live = strings.TrimSuffix(live, "\n")
			}
			if out != "(no output)" && live != out {
				t.Errorf("streamed %q, want %q", live, out)
			}
		})
	}
}

func TestBashArgs(t *testing.T) {
	tb := tbNew(t)
	tests := []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"command": ""}, "bash: invalid arguments: command is empty; give a shell command to run"},
		{map[string]any{"command": "  \n"}, "command is empty"},
		{map[string]any{}, "command is empty"},
		{map[string]any{"command": "true", "timeout": 0}, "bash: invalid arguments: timeout must be a positive number of seconds, not 0"},
		{map[string]any{"command": "true", "timeout": -2.5}, "timeout must be a positive number of seconds, not -2.5"},
		{map[string]any{"command": "true", "timeout": "10"}, `field "timeout" must be a number, not string`},
		{map[string]any{"command": "true", "dir": "/"}, `unknown field "dir"; the arguments are command, timeout`},
		{map[string]any{"command": "true", "parameters": map[string]any{"Name": "x"}}, "parameters are passed to PowerShell scripts, and this host's shell is not PowerShell"},
		{map[string]any{"command": "true", "parameters": map[string]any{"1x": "x"}}, `parameter name "1x"`},
		{map[string]any{"command": "true", "parameters": map[string]any{"a": 1, "A": 2}}, "differ only in case"},
		{map[string]any{"command": "true", "cwd": strings.Repeat("d", 5000)}, "cwd: give a directory path of at most 4096 bytes"},
	}
	for _, tt := range tests {
		r, _ := tbCall(t, context.Background(), tb, "bash", tt.args)
		tbBadArgs(t, r, tt.want)
	}
}

func TestBashTimeoutKillsGroup(t *testing.T) {
	tb := tbNew(t)
	start := time.Now()
	text, isErr, _ := tbBash(t, tb, map[string]any{"command": "sleep 30 & echo $!; wait", "timeout": 0.3})
	pid := pidIn(t, text)
	killLater(t, pid)
	if want := fmt.Sprintf("%d\n\nCommand timed out after 0.3 seconds", pid); text != want || !isErr {
		t.Errorf("text = %q (error %v), want %q", text, isErr, want)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if !processGone(pid) {
		t.Errorf("background process %d survived the timeout", pid)
	}
}

func TestBashTimeoutCapped(t *testing.T) {
	tb := tbNew(t)
	tb.cfg.BashMaxTimeout = 300 * time.Millisecond
	text, isErr, _ := tbBash(t, tb, map[string]any{"command": "sleep 10", "timeout": 1e9})
	if want := "(no output)\n\nCommand timed out after 0.3 seconds"; text != want || !isErr {
		t.Errorf("text = %q, want %q", text, want)
	}
	tb.cfg.BashDefaultTimeout = 200 * time.Millisecond
	text, _, _ = tbBash(t, tb, map[string]any{"command": "sleep 10"})
	if want := "(no output)\n\nCommand timed out after 0.2 seconds"; text != want {
		t.Errorf("text = %q, want %q", text, want)
	}
}

func TestBashCancel(t *testing.T) {
	tb := tbNew(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	// One child stays in the group, one escapes it; both hold the pipe.
	cmd := fmt.Sprintf("sleep 30 & setsid sh -c 'echo $$ > %s; exec sleep 30' & echo started; wait", pidFile)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	var once sync.Once
	tc := &toolCall{ID: "cancel-me", Args: []byte(`{"command":` + strconv.Quote(cmd) + `}`), Output: func(p []byte) {
		if bytes.Contains(p, []byte("started")) {
			once.Do(func() { close(started) })
		}
	}}
	done := make(chan *protocol.Result, 1)
	go func() { done <- tb.bash(ctx, tc) }()
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("command did not start")
	}
	for i := 0; i < 200; i++ {
		if b, err := os.ReadFile(pidFile); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			killLater(t, pidIn(t, string(b)))
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case r := <-done:
		if text, want := tbText(t, r), "started\n\nCommand cancelled"; text != want || !r.IsError {
			t.Errorf("text = %q (error %v), want %q", text, r.IsError, want)
		}
	case <-time.After(time.Second):
		t.Fatal("bash did not return within 1 s of cancel")
	}
}

func TestBashDaemonDoesNotHang(t *testing.T) {
	tb := tbNew(t)
	start := time.Now()
	text, isErr, _ := tbBash(t, tb, map[string]any{"command": "sleep 30 & echo $!"})
	pid := pidIn(t, text)
	killLater(t, pid)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("bash waited %v for a background process", d)
	}
	if isErr || text != fmt.Sprintf("%d\n", pid) {
		t.Errorf("text = %q (error %v)", text, isErr)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("background process %d was killed: %v", pid, err)
	}
}

func TestBashLargeOutput(t *testing.T) {
	tb := tbNew(t)
	text, isErr, live := tbBash(t, tb, map[string]any{"command": "seq 1 100000"})
	spill := filepath.Join(tb.cfg.StateDir, "output", "call-1.log")
	all := numbered(100000)
	want := strings.TrimSuffix(strings.TrimPrefix(all, numbered(98000)), "\n") + "\n\n[Showing lines 98001-100000 of 100000. Full output: " + spill + "]"
	if isErr || text != want {
		t.Errorf("text = %s (error %v), want %s", abbrev(text), isErr, abbrev(want))
	}
	if !strings.HasSuffix(text, "\n100000\n\n[Showing lines 98001-100000 of 100000. Full output: "+spill+"]") {
		t.Errorf("text ends %q", text[len(text)-120:])
	}
	if live != all {
		t.Errorf("streamed %d bytes, want %d", len(live), len(all))
	}
	if got := tbRead(t, spill); got != all {
		t.Errorf("full output file has %d bytes, want %d", len(got), len(all))
	}
	if m := tbMode(t, spill); m != 0o600 {
		t.Errorf("full output file mode %v, want 0600", m)
	}
	if m := tbMode(t, filepath.Dir(spill)); m != 0o700 {
		t.Errorf("output directory mode %v, want 0700", m)
	}
}

func TestBashTruncationNotes(t *testing.T) {
	tb := tbNew(t)
	spill := filepath.Join(tb.cfg.StateDir, "output", "call-1.log")
	wide := strings.Repeat(strings.Repeat("0", 99)+"\n", 600)
	tests := []struct {
		name, command, want, full string
	}{
		{"lines, small output", "seq 1 3000",
			strings.TrimSuffix(strings.TrimPrefix(numbered(3000), numbered(1000)), "\n") + "\n\n[Showing lines 1001-3000 of 3000. Full output: " + spill + "]",
			numbered(3000)},
		{"bytes", `i=0; while [ $i -lt 600 ]; do printf '%099d\n' 0; i=$((i+1)); done`,
			strings.TrimSuffix(wide[88*100:], "\n") + "\n\n[Showing lines 89-600 of 600 (50KB limit). Full output: " + spill + "]",
			wide},
		{"last line partial", `head -c 60000 /dev/zero | tr '\0' x`,
			strings.Repeat("x", truncMaxBytes) + "\n\n[Showing last 50KB of line 1 (line is 58.6KB). Full output: " + spill + "]",
			strings.Repeat("x", 60000)},
		{"last line partial after others", `echo first; head -c 60000 /dev/zero | tr '\0' x; echo`,
			strings.Repeat("x", truncMaxBytes-1) + "\n\n[Showing last 50KB of line 2 (line is 58.6KB). Full output: " + spill + "]",
			"first\n" + strings.Repeat("x", 60000) + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			text, _, _ := tbBash(t, tb, map[string]any{"command": tt.command})
			if text != tt.want {
				t.Errorf("text = %s\nwant   %s", abbrev(text), abbrev(tt.want))
				if i := strings.LastIndex(text, "\n\n"); i >= 0 {
					t.Logf("note: %q", text[i:])
				}
			}
			if got := tbRead(t, spill); got != tt.full {
				t.Errorf("full output %s, want %s", abbrev(got), abbrev(tt.full))
			}
		})
	}
}

func TestBashStructured(t *testing.T) {
	tb := tbNew(t)
	tests := []struct {
		command, want string
	}{
		{`printf '  {"a": 1, "b": [2]}\n\n'`, `{"a": 1, "b": [2]}`},
		{`echo '[1, 2]'`, ""},
		{`echo '{"a": 1} {"b": 2}'`, ""},
		{`echo '{"a": '`, ""},
		{`echo '{"a": 1}'; exit 2`, ""},
		{`echo 'ok'`, ""},
	}
	for _, tt := range tests {
		r, _ := tbCall(t, context.Background(), tb, "bash", map[string]any{"command": tt.command})
		if string(r.Structured) != tt.want {
			t.Errorf("bash %q: structured = %s, want %s", tt.command, r.Structured, tt.want)
		}
	}
}

func TestBashOutputSinkBounded(t *testing.T) {
	spill := filepath.Join(t.TempDir(), "output", "x.log")
	var streamed int
	s := newOutputSink(func(p []byte) { streamed += len(p) }, spill, defaultLimits())
	rng := rand.New(rand.NewPCG(1, 2))
	var all bytes.Buffer
	var maxCap int
	for all.Len() < 8<<20 {
		var chunk []byte
		for len(chunk) < rng.IntN(bashReadSize)+1 {
			switch rng.IntN(4) {
			case 0:
				chunk = append(chunk, '\n')
			case 1:
				chunk = append(chunk, "€uro "...)
			case 2:
				chunk = append(chunk, bytes.Repeat([]byte("long"), rng.IntN(20000))...)
			default:
				chunk = append(chunk, "word "...)
			}
		}
		all.Write(chunk)
		s.write(chunk)
		maxCap = max(maxCap, cap(s.buf))
	}
	if bound := 4*(truncMaxBytes+1) + 4*bashReadSize + 160000; maxCap > bound {
		t.Errorf("buffer grew to %d bytes for %d bytes of output, want at most %d", maxCap, all.Len(), bound)
	}
	want := truncateTail(all.String())
	if got := s.truncation(); got != want {
		got.Content, want.Content = abbrev(got.Content), abbrev(want.Content)
		t.Errorf("truncation = %+v\nwant         %+v", got, want)
	}
	lines := strings.Split(strings.TrimSuffix(all.String(), "\n"), "\n")
	if got, want := s.lastLineLen(), int64(len(lines[len(lines)-1])); got != want {
		t.Errorf("last line length %d, want %d", got, want)
	}
	if path, err := s.finish(true); err != nil || path != spill {
		t.Fatalf("finish = %s, %v", path, err)
	}
	if got := tbRead(t, spill); got != all.String() || streamed != all.Len() {
		t.Errorf("saved %d and streamed %d bytes, want %d", len(got), streamed, all.Len())
	}
}

func TestBashPruneSpillFiles(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	touch := func(name string, age time.Duration) string {
		p := tbFile(t, dir, name, "x")
		if err := os.Chtimes(p, now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for i := range 5 {
		touch(fmt.Sprintf("ancient-%d.log", i), 8*24*time.Hour)
	}
	for i := range 510 {
		// file-000 is the oldest.
		touch(fmt.Sprintf("file-%03d.log", i), time.Duration(600-i)*time.Minute)
	}
	other := touch("notes.txt", 30*24*time.Hour)
	keep := touch("current.log", 0)

	pruneSpillFiles(dir, keep, now, spillMaxAge, spillMaxFiles, spillMaxTotal)

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	logs := 0
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".log") {
			logs++
		}
		if strings.HasPrefix(e.Name(), "ancient-") {
			t.Errorf("%s is older than 7 days but was kept", e.Name())
		}
	}
	if logs != spillMaxFiles {
		t.Errorf("%d full-output files left, want %d", logs, spillMaxFiles)
	}
	for _, p := range []string{keep, other, filepath.Join(dir, "file-011.log"), filepath.Join(dir, "file-509.log")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was removed: %v", filepath.Base(p), err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "file-010.log")); err == nil {
		t.Error("file-010.log, among the 11 oldest, was kept")
	}
}

func TestBashCancelledBeforeStart(t *testing.T) {
	tb := tbNew(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, _ := tbCall(t, ctx, tb, "bash", map[string]any{"command": "touch marker"})
	tbWant(t, r, true, "(no output)\n\nCommand cancelled")
	if _, err := os.Stat(filepath.Join(tb.cfg.Cwd, "marker")); err == nil {
		t.Error("a cancelled call ran its command")
	}
}

// Commands start with the configured environment minus the agent's own
// variables, and with PWD set to where they run.
func TestBashChildEnv(t *testing.T) {
	newTB := func(env []string) *toolbox {
		tb, err := newToolbox(toolboxConfig{
			Cwd: t.TempDir(), StateDir: filepath.Join(t.TempDir(), "state"), Shell: "/bin/sh",
			BashDefaultTimeout: time.Minute, BashMaxTimeout: time.Minute, ChildEnv: env,
		})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	tb := newTB([]string{"PATH=" + os.Getenv("PATH"), "FLEET_NATS_PASSWORD=s3cret", "FLEET_X=1", "KEEP=yes", "PWD=/elsewhere"})
	text, isErr, _ := tbBash(t, tb, map[string]any{"command": "env"})
	if isErr || strings.Contains(text, "FLEET_") || strings.Contains(text, "s3cret") {
		t.Errorf("env (error %v) shows the agent's variables:\n%s", isErr, text)
	}
	for _, want := range []string{"KEEP=yes\n", "PWD=" + tb.cfg.Cwd + "\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("env lacks %q:\n%s", want, text)
		}
	}

	// Without a configured environment, commands inherit nothing.
	t.Setenv("FLEETMCP_TEST_INHERITED", "yes")
	if text, _, _ := tbBash(t, newTB(nil), map[string]any{"command": "env"}); strings.Contains(text, "FLEETMCP_TEST_INHERITED") {
		t.Errorf("a command inherited the agent's environment:\n%s", text)
	}
}

// A reader that falls behind (a loaded machine) loses nothing: output
// still in the pipe when the grace period ends is waited for. A pipe held
// open with nothing in it is cut off after the grace period.
func TestDrainOutputSlowReader(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("x", 1000)
	if _, err := pw.WriteString(want); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	done := make(chan struct{})
	var got []byte
	go func() {
		defer close(done)
		time.Sleep(300 * time.Millisecond) // scheduled late
		got, _ = io.ReadAll(pr)
	}()
	drainOutput(pr, done, 20*time.Millisecond)
	pr.Close()
	if string(got) != want {
		t.Fatalf("slow reader got %d bytes, want %d", len(got), len(want))
	}

	pr, pw, err = os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close() // held open, as by a daemon
	done = make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.ReadAll(pr)
	}()
	start := time.Now()
	drainOutput(pr, done, 20*time.Millisecond)
	pr.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("an empty pipe held open took %v to cut off", d)
	}
}

// The full-output file holds at most SpillMaxBytes; the note says it is
// the start of the output and how much there was.
func TestBashFullOutputFileCapped(t *testing.T) {
	tb := tbNew(t)
	tb.cfg.SpillMaxBytes = 200 << 10
	r, _ := tbCall(t, context.Background(), tb, "bash", map[string]any{"command": "head -c 1000000 /dev/zero | tr '\\0' 'x'; echo; echo end"})
	text := tbText(t, r)
	m := regexp.MustCompile(`Full output \(its first 200\.0KB of 976\.6KB; the host saves at most 200\.0KB per command\): (\S+)\]`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("note does not describe a capped full-output file:\n%s", text[max(0, len(text)-400):])
	}
	fi, err := os.Stat(m[1])
	if err != nil || fi.Size() != 200<<10 {
		t.Fatalf("full-output file: %v, %v; want exactly %d bytes", fi, err, 200<<10)
	}
	if !strings.HasPrefix(text, "end\n\n[Showing lines 2-2 of 2") {
		t.Errorf("the shown tail lost the end of the output: %q", text[max(0, len(text)-300):])
	}
}

// The full-output files together hold at most SpillMaxTotal, however many
// commands fill theirs: a caller cannot fill the host's disk through them
// (500 files of 100 MiB each would be 50 GB), and the newest are kept.
func TestBashFullOutputFilesTotal(t *testing.T) {
	tb := tbNew(t)
	tb.cfg.SpillMaxBytes = 200 << 10
	tb.cfg.SpillMaxTotal = 700 << 10
	var last string
	for i := range 8 {
		args, _ := json.Marshal(map[string]any{"command": "head -c 300000 /dev/zero | tr '\\0' 'x'"})
		r := tb.tools()["bash"](context.Background(), &toolCall{ID: fmt.Sprintf("call-%d", i), Args: args})
		m := regexp.MustCompile(`per command\): (\S+)\]`).FindStringSubmatch(tbText(t, r))
		if m == nil {
			t.Fatalf("no full-output file named in:\n%.400s", tbText(t, r))
		}
		last = m[1]
	}
	entries, err := os.ReadDir(filepath.Dir(last))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	t.Logf("8 commands that each saved 200 KiB left %d files of %d KiB in all", len(entries), total>>10)
	if total > 700<<10 {
		t.Errorf("full-output files hold %d KiB in all; at most %d KiB", total>>10, 700)
	}
	if _, err := os.Stat(last); err != nil {
		t.Errorf("the newest full-output file was removed: %v", err)
	}
}

func TestConfigFullOutputTotal(t *testing.T) {
	cfg := Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "h1", StateDir: t.TempDir(), Cwd: t.TempDir(), Logger: quietLogger(),
		OutputFileMaxBytes: 200 << 20, OutputFilesMaxBytes: 100 << 20}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--max_output_files_mib") {
		t.Errorf("a total below one file's limit: %v", err)
	}
}

// The agent's bash output limits replace 2000 lines and 50KB: the result
// shows the last lines within both, and its note names the byte limit.
func TestBashConfiguredLimits(t *testing.T) {
	newTB := func(lines, bytes int) *toolbox {
		t.Helper()
		tb, err := newToolbox(toolboxConfig{Cwd: t.TempDir(), StateDir: filepath.Join(t.TempDir(), "state"), Shell: "/bin/sh",
			BashDefaultTimeout: 30 * time.Second, BashMaxTimeout: 30 * time.Second, BashMaxLines: lines, BashMaxBytes: bytes})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	tb := newTB(10, 0)
	spill := filepath.Join(tb.cfg.StateDir, "output", "call-1.log")
	text, _, _ := tbBash(t, tb, map[string]any{"command": "seq 1 30"})
	if want := strings.TrimSuffix(strings.TrimPrefix(numbered(30), numbered(20)), "\n") + "\n\n[Showing lines 21-30 of 30. Full output: " + spill + "]"; text != want {
		t.Errorf("10 lines: text = %q, want %q", text, want)
	}
	tb = newTB(0, 2048)
	spill = filepath.Join(tb.cfg.StateDir, "output", "call-1.log")
	text, _, _ = tbBash(t, tb, map[string]any{"command": `i=0; while [ $i -lt 100 ]; do printf '%099d\n' 0; i=$((i+1)); done`})
	wide := strings.Repeat(strings.Repeat("0", 99)+"\n", 100)
	if want := strings.TrimSuffix(wide[80*100:], "\n") + "\n\n[Showing lines 81-100 of 100 (2KB limit). Full output: " + spill + "]"; text != want {
		t.Errorf("2KB: text = %s, want %s", abbrev(text), abbrev(want))
	}
	if got := tbRead(t, spill); got != wide {
		t.Errorf("full output file has %d bytes, want %d", len(got), len(wide))
	}
	tb = newTB(0, 1500)
	text, _, _ = tbBash(t, tb, map[string]any{"command": `head -c 4000 /dev/zero | tr '\0' x`})
	if !strings.HasPrefix(text, strings.Repeat("x", 1500)+"\n\n[Showing last 1500 bytes of line 1 (line is 3.9KB).") {
		t.Errorf("1500 bytes: text = %s", abbrev(text))
	}
	for _, bad := range []struct{ lines, bytes int }{{-1, 0}, {100_001, 0}, {0, 1023}, {0, 4<<20 + 1}} {
		if _, err := newToolbox(toolboxConfig{Cwd: t.TempDir(), StateDir: filepath.Join(t.TempDir(), "state"), Shell: "/bin/sh",
			BashDefaultTimeout: time.Second, BashMaxTimeout: time.Second, BashMaxLines: bad.lines, BashMaxBytes: bad.bytes}); err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("limits %+v: err = %v", bad, err)
		}
	}
}
