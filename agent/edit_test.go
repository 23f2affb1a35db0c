//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// edits builds the edits argument from old/new pairs.
func edits(pairs ...string) []map[string]any {
	var es []map[string]any
	for i := 0; i+1 < len(pairs); i += 2 {
		es = append(es, map[string]any{"old_string": pairs[i], "new_string": pairs[i+1]})
	}
	return es
}

func TestEdit(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	p := tbFile(t, tb.cfg.Cwd, "main.go", "package main\n\nfunc a() {}\nfunc b() {}\n")
	if err := os.Chmod(p, 0o755); err != nil {
		t.Fatal(err)
	}
	r, _ := tbCall(t, ctx, tb, "edit", map[string]any{"path": "main.go", "edits": edits("func a", "func alpha", "func b", "func beta")})
	tbWant(t, r, false, "Successfully applied 2 edit(s) to "+p+" (2 replacement(s))")
	if got, want := tbRead(t, p), "package main\n\nfunc alpha() {}\nfunc beta() {}\n"; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	if m := tbMode(t, p); m != 0o755 {
		t.Errorf("mode = %v, want 0755", m)
	}

	// Each edit sees the result of the ones before it.
	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "edits": edits("alpha", "gamma", "gamma()", "gamma(x int)")})
	tbWant(t, r, false, "Successfully applied 2 edit(s) to "+p+" (2 replacement(s))")

	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "edits": []map[string]any{
		{"old_string": "{}", "new_string": "{ return }", "replace_all": true},
	}})
	tbWant(t, r, false, "Successfully applied 1 edit(s) to "+p+" (2 replacement(s))")
	if got, want := tbRead(t, p), "package main\n\nfunc gamma(x int) { return }\nfunc beta() { return }\n"; got != want {
		t.Errorf("content = %q, want %q", got, want)
	}
	tbOnly(t, tb.cfg.Cwd, "main.go")
}

func TestEditFailures(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	const orig = "one two two three three three\n"
	p := tbFile(t, dir, "f.txt", orig)
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	bin := tbFile(t, dir, "b.bin", "\x00\x01\x02")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		path  string
		edits any
		want  string
	}{
		{"not found", p, edits("one", "1", "two two", "2", "four", "4"), "edit 3 of 3: old_string not found in " + p},
		{"second not found after first", p, edits("one", "1", "one", "uno"), "edit 2 of 2: old_string not found in " + p},
		{"ambiguous", p, edits("three", "3"), "edit 1 of 1: old_string matches 3 times in " + p + "; add surrounding context to make it unique, or set replace_all"},
		{"no change", p, edits("one", "one"), "edit 1 of 1: new_string equals old_string, so the edit makes no change"},
		{"empty old_string", p, edits("one", "1", "", "x"), "edit 2 of 2: old_string is empty; give the exact text to replace"},
		{"no edits", p, []any{}, "edits is empty; give at least one {old_string, new_string}"},
		{"no edits given", p, nil, "edits is empty; give at least one {old_string, new_string}"},
		{"empty path", "", edits("a", "b"), "path is empty; give the file to edit"},
		{"missing", filepath.Join(dir, "nope.txt"), edits("a", "b"), filepath.Join(dir, "nope.txt") + ": no such file"},
		{"directory", "sub", edits("a", "b"), filepath.Join(dir, "sub") + " is a directory; use list to see what is in it"},
		{"binary", bin, edits("a", "b"), bin + " is a binary file (3 bytes); edit works on text files only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := tbCall(t, context.Background(), tb, "edit", map[string]any{"path": tt.path, "edits": tt.edits})
			tbWant(t, r, true, tt.want)
		})
	}
	if got := tbRead(t, p); got != orig {
		t.Errorf("content changed to %q", got)
	}
	if fi, err := os.Stat(p); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("file was rewritten: %v", err)
	}
	tbOnly(t, dir, "b.bin", "f.txt", "sub")
}

func TestEditWriteFailureLeavesTarget(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "f.txt", "small\n")
	withFileSizeLimit(t, func(limit int) {
		r, _ := tbCall(t, context.Background(), tb, "edit", map[string]any{"path": p, "edits": edits("small", strings.Repeat("big", limit/3+100000))})
		if !r.IsError {
			t.Errorf("oversized edit succeeded: %+v", r)
		}
	})
	if got := tbRead(t, p); got != "small\n" {
		t.Errorf("content changed to %q", abbrev(got))
	}
	tbOnly(t, tb.cfg.Cwd, "f.txt")
}

func TestEditSymlink(t *testing.T) {
	tb := tbNew(t)
	real := tbFile(t, tb.cfg.Cwd, "real.txt", "hello world\n")
	link := filepath.Join(tb.cfg.Cwd, "link.txt")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	r, _ := tbCall(t, context.Background(), tb, "edit", map[string]any{"path": link, "edits": edits("world", "there")})
	tbWant(t, r, false, "Successfully applied 1 edit(s) to "+link+" (1 replacement(s))")
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("link replaced by a file (%v)", err)
	}
	if got := tbRead(t, real); got != "hello there\n" {
		t.Errorf("target content = %q", got)
	}
}

func TestEditApply(t *testing.T) {
	tests := []struct {
		name    string
		content string
		edits   []editSpec
		want    string
		n       int
		err     string
	}{
		{"single", "a b c", []editSpec{{OldString: "b", NewString: "B"}}, "a B c", 1, ""},
		{"delete", "a b c", []editSpec{{OldString: " b", NewString: ""}}, "a c", 1, ""},
		{"replace all", "x.x.x", []editSpec{{OldString: "x", NewString: "yy", ReplaceAll: true}}, "yy.yy.yy", 3, ""},
		{"replace all once", "x.y", []editSpec{{OldString: "x", NewString: "z", ReplaceAll: true}}, "z.y", 1, ""},
		{"chained", "abc", []editSpec{{OldString: "b", NewString: "XX"}, {OldString: "XX", NewString: "b", ReplaceAll: false}}, "abc", 2, ""},
		{"multiline", "l1\nl2\nl3\n", []editSpec{{OldString: "l1\nl2\n", NewString: "L\n"}}, "L\nl3\n", 1, ""},
		{"overlapping count", "aaa", []editSpec{{OldString: "aa", NewString: "b"}}, "ba", 1, ""},
		{"ambiguous", "aXa", []editSpec{{OldString: "a", NewString: "b"}}, "", 0, "edit 1 of 1: old_string matches 2 times in f; add surrounding context to make it unique, or set replace_all"},
		{"missing", "abc", []editSpec{{OldString: "b", NewString: "c"}, {OldString: "b", NewString: "d"}}, "", 0, "edit 2 of 2: old_string not found in f"},
		{"case sensitive", "Abc", []editSpec{{OldString: "abc", NewString: "x"}}, "", 0, "edit 1 of 1: old_string not found in f"},

		// Line endings and the byte order mark.
		{"CRLF matched with LF", "a\r\nb\r\nc\r\n", []editSpec{{OldString: "a\nb\n", NewString: "x\ny\nz\n"}}, "x\r\ny\r\nz\r\nc\r\n", 1, ""},
		{"CRLF matched with CRLF", "a\r\nb\r\n", []editSpec{{OldString: "a\r\nb", NewString: "B\r\nA"}}, "B\r\nA\r\n", 1, ""},
		{"CRLF inside a line", "one two\r\nthree\r\n", []editSpec{{OldString: "two", NewString: "2\n2"}}, "one 2\r\n2\r\nthree\r\n", 1, ""},
		{"CRLF last line", "a\r\nb", []editSpec{{OldString: "b", NewString: "b\nc"}}, "a\r\nb\r\nc", 1, ""},
		{"CRLF delete a line break", "a\r\nb\r\n", []editSpec{{OldString: "a\n", NewString: ""}}, "b\r\n", 1, ""},
		{"CRLF replace all", "x\r\nx\r\n", []editSpec{{OldString: "x\n", NewString: "y\n\n", ReplaceAll: true}}, "y\r\n\r\ny\r\n\r\n", 2, ""},
		{"LF file, CRLF edit", "a\nb\n", []editSpec{{OldString: "a\r\nb", NewString: "c\r\nd"}}, "c\nd\n", 1, ""},
		{"CRLF no change", "a\r\nb", []editSpec{{OldString: "a\r\nb", NewString: "a\nb"}}, "", 0, "edit 1 of 1: new_string equals old_string, so the edit makes no change"},
		{"mixed: LF line", "unix\ndos\r\n", []editSpec{{OldString: "unix", NewString: "un\nix"}}, "un\nix\ndos\r\n", 1, ""},
		{"mixed: CRLF line", "unix\ndos\r\n", []editSpec{{OldString: "dos", NewString: "d\nos"}}, "unix\nd\r\nos\r\n", 1, ""},
		{"mixed: across lines takes the first line's", "unix\ndos\r\n", []editSpec{{OldString: "ix\ndo", NewString: "1\n2\n3"}}, "un1\n2\n3s\r\n", 1, ""},
		{"lone CR kept", "a\rb\r\n", []editSpec{{OldString: "b", NewString: "c"}}, "a\rc\r\n", 1, ""},
		{"BOM kept", "\uFEFFfirst\r\nsecond\r\n", []editSpec{{OldString: "first", NewString: "1st"}}, "\uFEFF1st\r\nsecond\r\n", 1, ""},
		{"BOM in old_string", "\uFEFFfirst\n", []editSpec{{OldString: "\uFEFFfirst", NewString: "\uFEFF1st"}}, "\uFEFF1st\n", 1, ""},
		{"BOM not matched", "\uFEFFx", []editSpec{{OldString: "\uFEFF", NewString: "y"}}, "", 0, "edit 1 of 1: old_string is empty; give the exact text to replace"},
		{"replace at start keeps BOM", "\uFEFFab", []editSpec{{OldString: "ab", NewString: "cd"}}, "\uFEFFcd", 1, ""},
	}
	for _, tt := range tests {
		got, n, err := applyEdits(context.Background(), tt.content, "f", tt.edits)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want || n != tt.n {
			t.Errorf("%s: applyEdits = %q, %d, %v; want %q, %d", tt.name, got, n, err, tt.want, tt.n)
		}
	}
}

// A CRLF file with a byte order mark edited with LF text keeps every
// byte of the lines the edit does not touch, and the new lines end CRLF.
func TestEditKeepsLineEndings(t *testing.T) {
	tb := tbNew(t)
	var b strings.Builder
	b.WriteString(utf8BOM)
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&b, "line %d\t \r\n", i)
	}
	orig := b.String()
	p := tbFile(t, tb.cfg.Cwd, "win.txt", orig)
	r, _ := tbCall(t, context.Background(), tb, "edit", map[string]any{"path": p, "edits": edits(
		"line 1\t \nline 2\t ", "first\nsecond\nthird",
		"line 50\t \n", "last\n")})
	tbWant(t, r, false, "Successfully applied 2 edit(s) to "+p+" (2 replacement(s))")
	got := tbRead(t, p)
	want := utf8BOM + "first\r\nsecond\r\nthird\r\n" + strings.TrimPrefix(orig, utf8BOM+"line 1\t \r\nline 2\t \r\n")
	want = strings.TrimSuffix(want, "line 50\t \r\n") + "last\r\n"
	if got != want {
		t.Fatalf("content = %q\nwant      %q", got, want)
	}
	// Undoing the edits gives back the original bytes.
	r, _ = tbCall(t, context.Background(), tb, "edit", map[string]any{"path": p, "edits": edits(
		"first\nsecond\nthird", "line 1\t \nline 2\t ",
		"last\n", "line 50\t \n")})
	if r.IsError {
		t.Fatal(tbText(t, r))
	}
	if got := tbRead(t, p); got != orig {
		t.Fatalf("after undo = %q\nwant         %q", got, orig)
	}
	if info := tbStructured(t, r); info["sha256"] != sha256Hex([]byte(orig)) || info["path"] != p {
		t.Errorf("structured = %v, want the sha256 of the original", info)
	}
}

// tbStructured decodes a structured result.
func tbStructured(t *testing.T, r *protocol.Result) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Structured, &m); err != nil {
		t.Fatalf("structured %s: %v", r.Structured, err)
	}
	return m
}

func TestEditCompareAndSwap(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	p := tbFile(t, tb.cfg.Cwd, "f.txt", "version one\n")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	one := sha256Hex([]byte("version one\n"))
	stale := sha256Hex([]byte("version zero\n"))

	r, _ := tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "expected_sha256": stale, "edits": edits("one", "two")})
	tbWant(t, r, true, p+" has changed: its sha256 is "+one+", not the expected "+stale+"; nothing was changed. Read the file again and redo the change against its current content.")
	if info := tbStructured(t, r); info["current_sha256"] != one {
		t.Errorf("structured = %v, want current_sha256 %s", info, one)
	}
	if fi, err := os.Stat(p); err != nil || !fi.ModTime().Equal(old) || tbRead(t, p) != "version one\n" {
		t.Fatalf("file touched by a refused edit (%v)", err)
	}

	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "expected_sha256": "sha256:" + strings.ToUpper(one), "edits": edits("one", "two")})
	tbWant(t, r, false, "Successfully applied 1 edit(s) to "+p+" (1 replacement(s))")
	two := sha256Hex([]byte("version two\n"))
	if info := tbStructured(t, r); info["sha256"] != two {
		t.Errorf("structured = %v, want sha256 %s", info, two)
	}
	// The hash edit returns is the one the next edit expects.
	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "expected_sha256": two, "edits": edits("two", "three")})
	if r.IsError || tbRead(t, p) != "version three\n" {
		t.Fatalf("edit with the returned hash: %s", tbText(t, r))
	}

	gone := filepath.Join(tb.cfg.Cwd, "gone.txt")
	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": gone, "expected_sha256": one, "edits": edits("a", "b")})
	tbWant(t, r, true, gone+" does not exist (expected sha256 "+one+"); nothing was changed. Check the path, or leave out expected_sha256 to create it.")

	r, _ = tbCall(t, ctx, tb, "edit", map[string]any{"path": p, "expected_sha256": "abc", "edits": edits("a", "b")})
	tbWant(t, r, true, `expected_sha256 "abc" is not a SHA-256 hash; give the 64 hexadecimal digits that read returned as sha256`)
	tbOnly(t, tb.cfg.Cwd, "f.txt")
}

func TestEditArgsStrict(t *testing.T) {
	tb := tbNew(t)
	r, _ := tbCall(t, context.Background(), tb, "edit", json.RawMessage(`{"path":"f","edits":[{"old_string":"a","new_string":"b","replace_all":"yes"}]}`))
	tbBadArgs(t, r, `edit: invalid arguments: field "edits.replace_all" must be a boolean, not string`)
}

// edit holds a file in memory several times over: it refuses files
// larger than maxEditFileBytes before reading them, and edits whose
// result would be larger, whatever replace_all multiplies.
func TestEditSizeLimits(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd

	// A text file that is mostly a hole: cheap on disk, large to read.
	big := tbFile(t, dir, "big.txt", strings.Repeat("hello world\n", 2000))
	if err := os.Truncate(big, maxEditFileBytes+1); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, "edit a file over the limit", run(t, tb, "edit", map[string]any{"path": "big.txt", "edits": edits("hello", "bye")}),
		big+" is 64.0MB (67108865 bytes); edit works on files up to 64.0MB. Use patch, or bash (e.g. sed -i), for it")
	if fi, err := os.Stat(big); err != nil || fi.Size() != maxEditFileBytes+1 {
		t.Errorf("the large file changed: %v %v", fi, err)
	}

	line := strings.Repeat("a", 1023) + "\n"
	small := tbFile(t, dir, "small.txt", strings.Repeat(line, 1024)) // 1 MiB
	r := run(t, tb, "edit", map[string]any{"path": "small.txt", "edits": []map[string]any{
		{"old_string": "a", "new_string": strings.Repeat("b", 100), "replace_all": true},
	}})
	wantFailure(t, "an edit that multiplies the file", r, "edit 1 of 1: the result would be")
	wantFailure(t, "an edit that multiplies the file", r, "more than edit writes (64.0MB)")
	if tbRead(t, small) != strings.Repeat(line, 1024) {
		t.Error("a refused edit changed the file")
	}
}
