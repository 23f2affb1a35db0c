//go:build unix

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbFile writes content to name under dir and returns its path.
func tbFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRead(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	ten := tbFile(t, dir, "ten.txt", numbered(10))
	big := tbFile(t, dir, "big.txt", numbered(5000))
	wide := strings.Repeat(strings.Repeat("y", 99)+"\n", 600)
	wideFile := tbFile(t, dir, "wide.txt", wide)
	longLine := tbFile(t, dir, "long.txt", "short\n"+strings.Repeat("x", 60000)+"\nend\n")
	spaced := tbFile(t, dir, "it's here.txt", strings.Repeat("x", 60000))
	tbFile(t, dir, "empty.txt", "")
	noEOL := tbFile(t, dir, "noeol.txt", "a\nb")
	nul := tbFile(t, dir, "nul.bin", "text\x00more")
	latin1 := tbFile(t, dir, "latin1.txt", "caf\xe9\n")
	// A multi-byte character across the 8 KiB sniffing boundary is text.
	straddle := tbFile(t, dir, "straddle.txt", strings.Repeat("a", sniffLen-1)+"€\n")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		args  map[string]any
		isErr bool
		want  string
	}{
		{"whole file", map[string]any{"path": ten}, false, numbered(10)},
		{"relative path", map[string]any{"path": "ten.txt"}, false, numbered(10)},
		{"no final newline", map[string]any{"path": noEOL}, false, "a\nb"},
		{"offset", map[string]any{"path": ten, "offset": 8}, false, "8\n9\n10\n"},
		{"last line", map[string]any{"path": noEOL, "offset": 2}, false, "b"},
		{"limit to the end", map[string]any{"path": ten, "offset": 8, "limit": 3}, false, "8\n9\n10\n"},
		{"limit stops short", map[string]any{"path": ten, "offset": 3, "limit": 4}, false,
			"3\n4\n5\n6\n\n[4 more lines in file. Use offset=7 to continue.]"},
		{"line limit", map[string]any{"path": big}, false,
			strings.TrimSuffix(numbered(2000), "\n") + "\n\n[Showing lines 1-2000 of 5000. Use offset=2001 to continue.]"},
		{"line limit from offset", map[string]any{"path": big, "offset": 2001}, false,
			strings.TrimSuffix(strings.TrimPrefix(numbered(4000), numbered(2000)), "\n") +
				"\n\n[Showing lines 2001-4000 of 5000. Use offset=4001 to continue.]"},
		{"line limit with caller's limit", map[string]any{"path": big, "offset": 1, "limit": 2500}, false,
			strings.TrimSuffix(numbered(2000), "\n") + "\n\n[Showing lines 1-2000 of 5000. Use offset=2001 to continue.]"},
		{"byte limit", map[string]any{"path": wideFile}, false,
			strings.TrimSuffix(wide[:512*100], "\n") + "\n\n[Showing lines 1-512 of 600 (50KB limit). Use offset=513 to continue.]"},
		{"first line too long", map[string]any{"path": longLine, "offset": 2}, false,
			"[Line 2 is 58.6KB, exceeds 50KB limit. Use bash: sed -n '2p' " + longLine + " | head -c 51200]"},
		{"stops before a long line", map[string]any{"path": longLine}, false,
			"short\n\n[Showing lines 1-1 of 3 (50KB limit). Use offset=2 to continue.]"},
		{"long line path quoted", map[string]any{"path": spaced}, false,
			"[Line 1 is 58.6KB, exceeds 50KB limit. Use bash: sed -n '1p' '" + strings.ReplaceAll(spaced, "'", `'\''`) + "' | head -c 51200]"},
		{"empty file", map[string]any{"path": "empty.txt"}, false, "(empty file)"},
		{"utf8 across sniff boundary", map[string]any{"path": straddle}, false, strings.Repeat("a", sniffLen-1) + "€\n"},

		{"empty path", map[string]any{"path": ""}, true, "path is empty; give the file to read"},
		{"missing", map[string]any{"path": "nope.txt"}, true, filepath.Join(dir, "nope.txt") + ": no such file"},
		{"directory", map[string]any{"path": "sub"}, true, filepath.Join(dir, "sub") + " is a directory; use list to see what is in it"},
		{"NUL byte", map[string]any{"path": nul}, true, nul + " is a binary file (9 bytes); read returns text only"},
		{"invalid UTF-8", map[string]any{"path": latin1}, true, latin1 + " is a binary file (5 bytes); read returns text only"},
		{"offset beyond end", map[string]any{"path": ten, "offset": 11}, true, "offset 11 is beyond the end of " + ten + " (10 lines)"},
		{"offset beyond empty", map[string]any{"path": "empty.txt", "offset": 2}, true,
			"offset 2 is beyond the end of " + filepath.Join(dir, "empty.txt") + " (0 lines)"},
		{"negative offset", map[string]any{"path": ten, "offset": -1}, true, "offset -1 is negative; lines are numbered from 1"},
		{"negative limit", map[string]any{"path": ten, "limit": -5}, true, "limit -5 is negative; give a positive number of lines, or leave it out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := tbCall(t, context.Background(), tb, "read", tt.args)
			tbWant(t, r, tt.isErr, tt.want)
			if tt.isErr {
				if r.Structured != nil {
					t.Errorf("structured = %s, want none", r.Structured)
				}
				return
			}
			info := tbReadInfo(t, r)
			p, _ := tb.resolve(tt.args["path"].(string))
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			want := readInfo{Path: p, SHA256: sha256Hex(data), TotalLines: countTextLines(string(data))}
			if info != want {
				t.Errorf("structured = %+v, want %+v", info, want)
			}
		})
	}
}

// tbReadInfo decodes the structured result of a read.
func tbReadInfo(t *testing.T, r *protocol.Result) readInfo {
	t.Helper()
	var info readInfo
	dec := json.NewDecoder(bytes.NewReader(r.Structured))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&info); err != nil {
		t.Fatalf("structured %s: %v", r.Structured, err)
	}
	return info
}

// The hash covers the whole file whatever part is shown, including a
// file far larger than the read buffer, and matches the one write and
// edit check.
func TestReadHash(t *testing.T) {
	tb := tbNew(t)
	content := numbered(200000) // about 1.2 MB
	p := tbFile(t, tb.cfg.Cwd, "big.txt", content)
	want := sha256Hex([]byte(content))
	for _, args := range []map[string]any{
		{"path": p},
		{"path": p, "offset": 5, "limit": 1},
		{"path": p, "offset": 200000},
		{"path": p, "anchor": "\n123456\n"},
	} {
		r, _ := tbCall(t, context.Background(), tb, "read", args)
		if r.IsError {
			t.Fatalf("read %v: %s", args, tbText(t, r))
		}
		if info := tbReadInfo(t, r); info.SHA256 != want || info.TotalLines != 200000 {
			t.Errorf("read %v: structured %+v, want sha256 %s and 200000 lines", args, info, want)
		}
	}
	if got, err := tb.currentSHA256(context.Background(), p); err != nil || got != want {
		t.Errorf("currentSHA256 = %q, %v; want %s", got, err, want)
	}
}

func TestReadCancelled(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "f.txt", numbered(10))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, _ := tbCall(t, ctx, tb, "read", map[string]any{"path": p})
	if r.Error == nil || r.Error.Code != "cancelled" {
		t.Fatalf("result = %+v, want a cancelled error", r)
	}
}

func TestReadHome(t *testing.T) {
	tb := tbNew(t)
	tb.home = t.TempDir()
	tbFile(t, tb.home, "notes/todo.txt", "milk\n")
	r, _ := tbCall(t, context.Background(), tb, "read", map[string]any{"path": "~/notes/todo.txt"})
	tbWant(t, r, false, "milk\n")
}

func TestReadLooksBinary(t *testing.T) {
	tests := []struct {
		in    string
		atEOF bool
		want  bool
	}{
		{"plain", true, false},
		{"", true, false},
		{"a\x00b", false, true},
		{"caf\xc3\xa9", true, false},
		{"cut \xe2\x82", false, false}, // the rest of "€" lies beyond
		{"cut \xe2\x82", true, true},   // ...unless the file ends there
		{"bad \xff tail", false, true},
	}
	for _, tt := range tests {
		if got := looksBinary([]byte(tt.in), tt.atEOF); got != tt.want {
			t.Errorf("looksBinary(%q, %v) = %v, want %v", tt.in, tt.atEOF, got, tt.want)
		}
	}
}

// Named pipes and devices are refused at once: opening a pipe for reading
// would wait for a writer, and the call would hang.
func TestSpecialFilesRefused(t *testing.T) {
	tb := tbNew(t)
	fifo := filepath.Join(tb.cfg.Cwd, "pipe")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	const pipe = " is a named pipe (FIFO), not a regular file; "
	tests := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read", map[string]any{"path": "pipe"}, fifo + pipe + "read returns text only"},
		{"edit", map[string]any{"path": "pipe", "edits": edits("a", "b")}, fifo + pipe + "edit works on text files only"},
		{"write", map[string]any{"path": "pipe", "content": "x"}, fifo + " is not a regular file; only regular files can be written"},
		{"read", map[string]any{"path": "/dev/null"}, "/dev/null is a device, not a regular file; read returns text only"},
	}
	for _, tt := range tests {
		done := make(chan *protocol.Result, 1)
		go func() {
			r, _ := tbCall(t, context.Background(), tb, tt.tool, tt.args)
			done <- r
		}()
		select {
		case r := <-done:
			tbWant(t, r, true, tt.want)
		case <-time.After(5 * time.Second):
			// Be the writer the open waits for, so the tool returns.
			if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
				w.Close()
			}
			<-done
			t.Errorf("%s %v did not return within 5s", tt.tool, tt.args["path"])
		}
	}
}
