//go:build unix

package agent

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

// numbered returns n lines "1\n2\n...".
func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

func TestTruncateHead(t *testing.T) {
	long := strings.Repeat("x", truncMaxBytes+1)
	tests := []struct {
		name             string
		in               string
		want             string
		truncated        bool
		by               string
		total, output    int
		start, end       int
		firstLineTooLong bool
	}{
		{name: "empty", in: "", want: ""},
		{name: "one line no newline", in: "abc", want: "abc", total: 1, output: 1, start: 1, end: 1},
		{name: "two lines", in: "a\nb\n", want: "a\nb\n", total: 2, output: 2, start: 1, end: 2},
		{name: "blank line", in: "\n", want: "\n", total: 1, output: 1, start: 1, end: 1},
		{name: "at line limit", in: numbered(2000), want: numbered(2000), total: 2000, output: 2000, start: 1, end: 2000},
		{name: "over line limit", in: numbered(2001), want: numbered(2000), truncated: true, by: "lines", total: 2001, output: 2000, start: 1, end: 2000},
		{name: "over byte limit", in: strings.Repeat(strings.Repeat("y", 99)+"\n", 600),
			want: strings.Repeat(strings.Repeat("y", 99)+"\n", 512), truncated: true, by: "bytes", total: 600, output: 512, start: 1, end: 512},
		{name: "exactly 50KB", in: strings.Repeat("z", truncMaxBytes), want: strings.Repeat("z", truncMaxBytes), total: 1, output: 1, start: 1, end: 1},
		{name: "first line too long", in: long + "\nshort\n", truncated: true, by: "bytes", total: 2, firstLineTooLong: true},
		{name: "later line too long", in: "a\n" + long, want: "a\n", truncated: true, by: "bytes", total: 2, output: 1, start: 1, end: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := truncateHead(tt.in)
			want := truncation{Content: tt.want, Truncated: tt.truncated, By: tt.by, TotalLines: tt.total,
				OutputLines: tt.output, StartLine: tt.start, EndLine: tt.end, FirstLineTooLong: tt.firstLineTooLong}
			if got != want {
				got.Content, want.Content = abbrev(got.Content), abbrev(want.Content)
				t.Errorf("truncateHead:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestTruncateTail(t *testing.T) {
	long := strings.Repeat("x", truncMaxBytes+10)
	euro := strings.Repeat("€", 20000) // 3 bytes each, 60000 bytes
	tests := []struct {
		name          string
		in            string
		want          string
		truncated     bool
		by            string
		total, output int
		start, end    int
		partial       bool
	}{
		{name: "empty", in: "", want: ""},
		{name: "small", in: "a\nb", want: "a\nb", total: 2, output: 2, start: 1, end: 2},
		{name: "over line limit", in: numbered(2500), want: strings.TrimPrefix(numbered(2500), numbered(500)),
			truncated: true, by: "lines", total: 2500, output: 2000, start: 501, end: 2500},
		{name: "over byte limit", in: strings.Repeat(strings.Repeat("y", 99)+"\n", 600),
			want: strings.Repeat(strings.Repeat("y", 99)+"\n", 512), truncated: true, by: "bytes", total: 600, output: 512, start: 89, end: 600},
		{name: "last line too long", in: "a\n" + long, want: long[10:], truncated: true, by: "bytes", total: 2, output: 1, start: 2, end: 2, partial: true},
		{name: "long line then short", in: long + "\nend\n", want: "end\n", truncated: true, by: "bytes", total: 2, output: 1, start: 2, end: 2},
		{name: "utf8 boundary", in: euro, want: euro[len(euro)-truncMaxBytes+2:], truncated: true, by: "bytes", total: 1, output: 1, start: 1, end: 1, partial: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := truncateTail(tt.in)
			want := truncation{Content: tt.want, Truncated: tt.truncated, By: tt.by, TotalLines: tt.total,
				OutputLines: tt.output, StartLine: tt.start, EndLine: tt.end, LastLinePartial: tt.partial}
			if got != want {
				got.Content, want.Content = abbrev(got.Content), abbrev(want.Content)
				t.Errorf("truncateTail:\n got %+v\nwant %+v", got, want)
			}
			if !utf8.ValidString(got.Content) {
				t.Errorf("content is not valid UTF-8")
			}
		})
	}
}

func TestTruncateHumanSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KB", 51200: "50.0KB", 1536 << 10: "1.5MB"} {
		if got := humanSize(n); got != want {
			t.Errorf("humanSize(%d) = %q, want %q", n, got, want)
		}
	}
}

// abbrev shortens s for error messages.
func abbrev(s string) string {
	if len(s) <= 60 {
		return s
	}
	return fmt.Sprintf("%q...(%d bytes)", s[:40], len(s))
}

func FuzzTruncate(f *testing.F) {
	f.Add("a\nb\nc\n", uint8(2), uint16(3), uint16(1))
	f.Add("€€€€\n€€", uint8(5), uint16(4), uint16(2))
	f.Add("\n\n\n", uint8(1), uint16(1), uint16(0))
	f.Add("long line without newline", uint8(3), uint16(7), uint16(5))
	f.Fuzz(func(t *testing.T, s string, maxLines uint8, maxBytes, skip uint16) {
		lim := outputLimits{lines: int(maxLines)%40 + 1, bytes: int(maxBytes)%200 + 4}
		total := countTextLines(s)

		h := cutHead(s, total, true, lim)
		checkTruncation(t, "head", s, h, lim)
		if !strings.HasPrefix(s, h.Content) {
			t.Fatalf("head %q is not a prefix of %q", h.Content, s)
		}
		if h.StartLine != min(1, h.OutputLines) || h.EndLine != h.OutputLines {
			t.Fatalf("head range %d-%d for %d lines", h.StartLine, h.EndLine, h.OutputLines)
		}
		if h.FirstLineTooLong && h.Content != "" {
			t.Fatalf("first line too long but kept %q", h.Content)
		}

		tl := cutTail(s, total, true, lim)
		checkTruncation(t, "tail", s, tl, lim)
		if !strings.HasSuffix(s, tl.Content) {
			t.Fatalf("tail %q is not a suffix of %q", tl.Content, s)
		}
		if rest := len(s) - len(tl.Content); !tl.LastLinePartial && rest > 0 && s[rest-1] != '\n' {
			t.Fatalf("tail %q does not start at a line", tl.Content)
		}
		if tl.OutputLines > 0 && tl.StartLine != total-tl.OutputLines+1 {
			t.Fatalf("tail starts at line %d, want %d", tl.StartLine, total-tl.OutputLines+1)
		}
		if utf8.ValidString(s) && !utf8.ValidString(tl.Content) {
			t.Fatalf("tail %q cuts a UTF-8 sequence", tl.Content)
		}

		// The tail of a suffix window longer than the byte limit must
		// match the tail of the whole text: bash keeps only such a window.
		if n := lim.bytes + 1 + int(skip)%8; len(s) > n {
			w := cutTail(s[len(s)-n:], total, false, lim)
			if w != tl {
				t.Fatalf("window tail %+v, whole tail %+v", w, tl)
			}
		}
	})
}

// checkTruncation checks the invariants shared by head and tail.
func checkTruncation(t *testing.T, kind, s string, tr truncation, lim outputLimits) {
	t.Helper()
	if len(tr.Content) > lim.bytes {
		t.Fatalf("%s kept %d bytes, limit %d", kind, len(tr.Content), lim.bytes)
	}
	if tr.OutputLines > lim.lines {
		t.Fatalf("%s kept %d lines, limit %d", kind, tr.OutputLines, lim.lines)
	}
	if tr.TotalLines != countTextLines(s) {
		t.Fatalf("%s total %d lines, want %d", kind, tr.TotalLines, countTextLines(s))
	}
	if tr.Truncated != (tr.Content != s) {
		t.Fatalf("%s truncated=%v but content %q of %q", kind, tr.Truncated, tr.Content, s)
	}
	if !tr.Truncated && (len(s) > lim.bytes || tr.TotalLines > lim.lines) {
		t.Fatalf("%s not truncated but %d bytes, %d lines exceed %+v", kind, len(s), tr.TotalLines, lim)
	}
	if tr.Truncated != (tr.By != "") || (tr.By != "" && tr.By != "lines" && tr.By != "bytes") {
		t.Fatalf("%s truncated=%v by %q", kind, tr.Truncated, tr.By)
	}
	if tr.Content != "" && !tr.LastLinePartial && countTextLines(tr.Content) != tr.OutputLines {
		t.Fatalf("%s content has %d lines, reported %d", kind, countTextLines(tr.Content), tr.OutputLines)
	}
	if tr.OutputLines > 0 && tr.EndLine-tr.StartLine+1 != tr.OutputLines {
		t.Fatalf("%s range %d-%d for %d lines", kind, tr.StartLine, tr.EndLine, tr.OutputLines)
	}
}
