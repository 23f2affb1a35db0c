package agent

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
		{"directory", "sub", edits("a", "b"), filepath.Join(dir, "sub") + " is a directory; use bash ls to list it"},
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
	}
	for _, tt := range tests {
		got, n, err := applyEdits(tt.content, "f", tt.edits)
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

func FuzzApplyEdits(f *testing.F) {
	f.Add("hello world", "world", "there", false, "hello", "hi", true)
	f.Add("aaa", "a", "b", true, "bbb", "", false)
	f.Add("x", "", "y", false, "x", "x", false)
	f.Fuzz(func(t *testing.T, content, old1, new1 string, all1 bool, old2, new2 string, all2 bool) {
		e1 := editSpec{OldString: old1, NewString: new1, ReplaceAll: all1}
		e2 := editSpec{OldString: old2, NewString: new2, ReplaceAll: all2}
		got, n, err := applyEdits(content, "f", []editSpec{e1, e2})

		// Two edits at once are the same as one after the other.
		mid, n1, err1 := applyEdits(content, "f", []editSpec{e1})
		if err1 != nil {
			if err == nil || !strings.HasPrefix(err.Error(), "edit 1 of 2: ") {
				t.Fatalf("first edit fails (%v) but both give %v", err1, err)
			}
			return
		}
		want, n2, err2 := applyEdits(mid, "f", []editSpec{e2})
		if err2 != nil {
			if err == nil || !strings.HasPrefix(err.Error(), "edit 2 of 2: ") {
				t.Fatalf("second edit fails (%v) but both give %v", err2, err)
			}
			return
		}
		if err != nil || got != want || n != n1+n2 {
			t.Fatalf("both = %q, %d, %v; one by one = %q, %d", got, n, err, want, n1+n2)
		}

		// A successful single edit replaced what it was asked to.
		count := strings.Count(content, old1)
		if old1 == "" || old1 == new1 || count == 0 || (count > 1 && !all1) {
			t.Fatalf("edit %+v of %q succeeded", e1, content)
		}
		expect := strings.Replace(content, old1, new1, 1)
		if all1 {
			expect = strings.ReplaceAll(content, old1, new1)
		}
		if n1 != count || mid != expect {
			t.Fatalf("edit %+v of %q gave %q, %d", e1, content, mid, n1)
		}
	})
}

func TestEditArgsStrict(t *testing.T) {
	tb := tbNew(t)
	r, _ := tbCall(t, context.Background(), tb, "edit", json.RawMessage(`{"path":"f","edits":[{"old_string":"a","new_string":"b","replace_all":"yes"}]}`))
	tbBadArgs(t, r, `edit: invalid arguments: field "edits.replace_all" must be a boolean, not string`)
}
