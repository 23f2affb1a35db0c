//go:build unix

package agent

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// numberedFrom returns lines "prefix1" to "prefixN", each ending "\n".
func linesOf(n int, format string) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, format+"\n", i)
	}
	return b.String()
}

// tbReadWindow is what read shows for lines first to first+limit-1 with
// offset and limit.
func tbReadWindow(t *testing.T, tb *toolbox, path string, first, limit int) string {
	t.Helper()
	r, _ := tbCall(t, context.Background(), tb, "read", map[string]any{"path": path, "offset": first, "limit": limit})
	if r.IsError {
		t.Fatalf("read offset %d limit %d: %s", first, limit, tbText(t, r))
	}
	return tbText(t, r)
}

func TestReadAnchor(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	hundred := tbFile(t, dir, "hundred.txt", linesOf(100, "line %d"))
	crlf := tbFile(t, dir, "crlf.txt", strings.ReplaceAll(linesOf(30, "row %d"), "\n", "\r\n"))
	noEOL := tbFile(t, dir, "noeol.txt", "alpha\nbeta\ngamma")
	// Lines of 1000 bytes: 500 lines of context would be 500 KB.
	wide := tbFile(t, dir, "wide.txt", linesOf(2000, "%04d "+strings.Repeat("w", 994)))
	// A line longer than the read buffer, with the anchor at its end.
	long := tbFile(t, dir, "long.txt", "first\n"+strings.Repeat("x", 200<<10)+"NEEDLE\nlast\n")

	tests := []struct {
		name        string
		path        string
		args        map[string]any
		start, end  int // lines of the anchor
		first, last int // lines of the window asked for
	}{
		{"default context", hundred, map[string]any{"anchor": "line 50\n"}, 50, 50, 40, 60},
		{"within a line", hundred, map[string]any{"anchor": "ne 77", "context": 2}, 77, 77, 75, 79},
		{"no context", hundred, map[string]any{"anchor": "line 7\n", "context": 0}, 7, 7, 7, 7},
		{"at the start", hundred, map[string]any{"anchor": "line 2\n", "context": 5}, 2, 2, 1, 7},
		{"first line", hundred, map[string]any{"anchor": "line 1\n"}, 1, 1, 1, 11},
		{"at the end", hundred, map[string]any{"anchor": "line 99\n", "context": 3}, 99, 99, 96, 102},
		{"last line", hundred, map[string]any{"anchor": "line 100"}, 100, 100, 90, 110},
		{"spans lines", hundred, map[string]any{"anchor": "9\nline 10\nline 1", "context": 1}, 9, 11, 8, 12},
		{"starts with a line break", hundred, map[string]any{"anchor": "\nline 33\n", "context": 0}, 32, 33, 32, 33},
		{"whole file as context", hundred, map[string]any{"anchor": "line 60\n", "context": 500}, 60, 60, 1, 560},
		{"CRLF file, LF anchor", crlf, map[string]any{"anchor": "row 12\nrow 13\n", "context": 1}, 12, 13, 11, 14},
		{"CRLF file, CRLF anchor", crlf, map[string]any{"anchor": "row 12\r\nrow 13", "context": 1}, 12, 13, 11, 14},
		{"LF file, CRLF anchor", hundred, map[string]any{"anchor": "line 12\r\nline 13\r\n", "context": 1}, 12, 13, 11, 14},
		{"last line without newline", noEOL, map[string]any{"anchor": "beta\ngam"}, 2, 3, 1, 13},
		{"long line", long, map[string]any{"anchor": "xNEEDLE", "context": 1}, 2, 2, 1, 3},
		{"long line alone", long, map[string]any{"anchor": "NEEDLE\nla", "context": 0}, 2, 3, 2, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := map[string]any{"path": tt.path}
			for k, v := range tt.args {
				args[k] = v
			}
			r, _ := tbCall(t, context.Background(), tb, "read", args)
			if r.IsError {
				t.Fatalf("read: %s", tbText(t, r))
			}
			want := tbReadWindow(t, tb, tt.path, tt.first, tt.last-tt.first+1)
			if got := tbText(t, r); got != want {
				t.Errorf("text = %q\nwant   %q", abbrev(got), abbrev(want))
			}
			data, _ := os.ReadFile(tt.path)
			info := tbReadInfo(t, r)
			if info.AnchorLine != tt.start || info.StartLine != tt.first || info.SHA256 != sha256Hex(data) || info.TotalLines != countTextLines(string(data)) {
				t.Errorf("structured = %+v, want anchor_line %d, start_line %d", info, tt.start, tt.first)
			}
		})
	}

	// Wide lines: the lines before the anchor are cut to half the byte
	// limit, so that the anchor is shown.
	r, _ := tbCall(t, context.Background(), tb, "read", map[string]any{"path": wide, "anchor": "1500 w", "context": 500})
	info := tbReadInfo(t, r)
	const before = truncMaxBytes / 2 / 1000 // lines that fit in half the limit
	if info.AnchorLine != 1500 || info.StartLine != 1500-before {
		t.Fatalf("structured = %+v, want anchor_line 1500, start_line %d", info, 1500-before)
	}
	want := tbReadWindow(t, tb, wide, 1500-before, 500+before+1)
	if got := tbText(t, r); got != want || !strings.Contains(got, "1500 w") || !strings.Contains(got, "(50KB limit). Use offset=") {
		t.Errorf("text = %q\nwant   %q", abbrev(got), abbrev(want))
	}
}

func TestReadAnchorFailures(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	p := tbFile(t, dir, "f.txt", "a x\nb\nc x\nd\nx\n")
	many := tbFile(t, dir, "many.txt", strings.Repeat("dup\n", 8))
	same := tbFile(t, dir, "same.txt", "ab ab ab\nzz\n")
	tbFile(t, dir, "empty.txt", "")
	empty := filepath.Join(dir, "empty.txt")
	tests := []struct {
		name string
		args map[string]any
		want string
	}{
		{"missing", map[string]any{"path": p, "anchor": "zzz"},
			"anchor not found in " + p + " (0 matches in 5 lines); the anchor must be exact text from the file, including spaces and indentation"},
		{"empty file", map[string]any{"path": empty, "anchor": "zzz"},
			"anchor not found in " + empty + " (0 matches in 0 lines); the anchor must be exact text from the file, including spaces and indentation"},
		{"ambiguous", map[string]any{"path": p, "anchor": "x"},
			"anchor matches 3 times in " + p + " (at lines 1, 3, 5); give a longer anchor that occurs once"},
		{"overlapping", map[string]any{"path": many, "anchor": "dup\ndup"},
			"anchor matches 7 times in " + many + " (at lines 1, 2, 3, 4, 5, ...); give a longer anchor that occurs once"},
		{"several in one line", map[string]any{"path": many, "anchor": "u"},
			"anchor matches 8 times in " + many + " (at lines 1, 2, 3, 4, 5, ...); give a longer anchor that occurs once"},
		{"three times in one line", map[string]any{"path": same, "anchor": "ab"},
			"anchor matches 3 times in " + same + " (at lines 1); give a longer anchor that occurs once"},
		{"with offset", map[string]any{"path": p, "anchor": "b", "offset": 2},
			"anchor and offset cannot be combined: the anchor decides which lines are shown; leave out offset (context sets how many lines around the anchor)"},
		{"with limit", map[string]any{"path": p, "anchor": "b", "limit": 2},
			"anchor and limit cannot be combined: the anchor decides which lines are shown; leave out limit (context sets how many lines around the anchor)"},
		{"context alone", map[string]any{"path": p, "context": 2},
			"context applies to reads by anchor only; give anchor too, or use offset and limit"},
		{"negative context", map[string]any{"path": p, "anchor": "b", "context": -1},
			"context -1 is negative; give the number of lines to show before and after the anchor (default 10)"},
		{"context too large", map[string]any{"path": p, "anchor": "b", "context": 501},
			"context 501 is more than 500 lines; give at most 500, or read on with offset"},
		{"anchor too long", map[string]any{"path": p, "anchor": strings.Repeat("b", maxAnchorBytes+1)},
			fmt.Sprintf("anchor is %d bytes, more than %d; give a short piece of text that occurs once in the file", maxAnchorBytes+1, maxAnchorBytes)},
		{"anchor of too many lines", map[string]any{"path": p, "anchor": strings.Repeat("b\n", maxAnchorLines)},
			fmt.Sprintf("anchor spans %d lines, more than %d; give a short piece of text that occurs once in the file", maxAnchorLines+1, maxAnchorLines)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := tbCall(t, context.Background(), tb, "read", tt.args)
			tbWant(t, r, true, tt.want)
		})
	}

	// A failed search still says which version of the file it searched.
	r, _ := tbCall(t, context.Background(), tb, "read", map[string]any{"path": p, "anchor": "x"})
	data, _ := os.ReadFile(p)
	want := fmt.Sprintf(`{"match_lines":[1,3,5],"matches":3,"path":%q,"sha256":%q,"total_lines":5}`, p, sha256Hex(data))
	if string(r.Structured) != want {
		t.Errorf("structured = %s\nwant %s", r.Structured, want)
	}
}

// anchorReference finds the occurrences of anchor in text the simple
// way: the whole text in memory, in lfText form.
func anchorReference(text, anchor string) (starts, ends []int) {
	norm, a := lfText(text), lfText(anchor)
	line, counted := 1, 0 // line is the line of norm[counted]
	lineOf := func(p int) int {
		line += strings.Count(norm[counted:p], "\n")
		counted = p
		return line
	}
	inside := strings.Count(a[:len(a)-1], "\n")
	for i := 0; ; {
		j := strings.Index(norm[i:], a)
		if j < 0 {
			return starts, ends
		}
		p := i + j
		starts = append(starts, lineOf(p))
		ends = append(ends, line+inside)
		i = p + 1
	}
}

// FuzzReadAnchor checks the streaming anchor search against the
// reference with the smallest read buffer, so that lines come in many
// pieces, and the window it keeps against an offset and limit scan of
// the same lines.
func FuzzReadAnchor(f *testing.F) {
	f.Add("a\nb\nc\n", "b", 1)
	f.Add("a\r\nb\r\nc", "a\nb", 0)
	f.Add("xx\r\r\nyy\r", "\r\nyy\r", 2)
	f.Add(strings.Repeat("abcdefghijklmnopqrstuvwxyz", 3)+"\r\n", "xyz\n", 1)
	f.Add("one\ntwo\none\ntwo\n", "\ntwo\n", 3)
	f.Add(strings.Repeat("q", 40)+"\r", "q\r", 0)
	f.Fuzz(func(t *testing.T, text, anchor string, around int) {
		if anchor == "" || len(anchor) > maxAnchorBytes {
			return
		}
		around = min(max(around, 0), 20)
		br := bufio.NewReaderSize(strings.NewReader(text), 16)
		scan, found, err := scanAnchor(context.Background(), br, anchor, around)
		if err != nil {
			t.Fatal(err)
		}
		starts, ends := anchorReference(text, anchor)
		if found.count != len(starts) {
			t.Fatalf("%d matches, reference %d (%v)", found.count, len(starts), starts)
		}
		listed := slices.Compact(slices.Clone(starts))
		listed = listed[:min(len(listed), anchorMatchesListed)]
		if !slices.Equal(found.lines, listed) || found.moreLines != (len(slices.Compact(slices.Clone(starts))) > anchorMatchesListed) {
			t.Fatalf("lines %v, reference %v", found.lines, starts)
		}
		if scan.sum != sha256Hex([]byte(text)) || scan.total != countTextLines(text) {
			t.Fatalf("sum %s, total %d", scan.sum, scan.total)
		}
		if found.count == 0 {
			return
		}
		if found.start != starts[0] || found.end != ends[0] || found.first != max(starts[0]-around, 1) {
			t.Fatalf("first match at lines %d-%d window from %d; reference %d-%d", found.start, found.end, found.first, starts[0], ends[0])
		}
		limit := found.end + around - found.first + 1
		byLines, err := scanLines(context.Background(), bufio.NewReaderSize(strings.NewReader(text), 16), found.first, limit)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := readText("f", scan, found.first, limit), readText("f", byLines, found.first, limit); got != want {
			t.Fatalf("window %q, by lines %q", got, want)
		}
	})
}

// BenchmarkReadLarge reads an 8 MiB file of 128-byte lines: the first
// 2000 lines shown, all of it counted and hashed; by a one-line anchor
// near the end; by a three-line anchor near the end.
func BenchmarkReadLarge(b *testing.B) {
	tb, err := newToolbox(toolboxConfig{Cwd: b.TempDir(), StateDir: filepath.Join(b.TempDir(), "state"), Shell: "/bin/sh",
		BashDefaultTimeout: time.Minute, BashMaxTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	const lines = 8 << 20 / 128
	p := tbFile(b, tb.cfg.Cwd, "big.txt", linesOf(lines, "%08d "+strings.Repeat("z", 118)))
	for _, bc := range []struct {
		name string
		args string
	}{
		{"head", fmt.Sprintf(`{"path":%q}`, p)},
		{"anchor", fmt.Sprintf(`{"path":%q,"anchor":"%08d "}`, p, lines-100)},
		{"anchor-3-lines", fmt.Sprintf(`{"path":%q,"anchor":"z\n%08d z%s\n%08d "}`, p, lines-101, strings.Repeat("z", 117), lines-100)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(8 << 20)
			for b.Loop() {
				r := tb.read(context.Background(), &toolCall{ID: "c1", Args: []byte(bc.args)})
				if r.IsError || r.Error != nil {
					b.Fatalf("read: %+v", r)
				}
			}
		})
	}
}
