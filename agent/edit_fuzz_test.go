package agent

import (
	"strings"
	"testing"
)

// refReplace is eolDoc.replace done the plain way, for comparison: a
// position table instead of a list of removed carriage returns, and a
// fresh search for each replacement's line ending.
func refReplace(text, old, new string, all bool) string {
	var norm []byte
	var at []int // at[i] is where norm[i] is in text; a '\n' that lost its '\r' is at the '\r'
	for i := 0; i < len(text); i++ {
		if text[i] == '\r' && i+1 < len(text) && text[i+1] == '\n' {
			norm, at = append(norm, '\n'), append(at, i)
			i++
			continue
		}
		norm, at = append(norm, text[i]), append(at, i)
	}
	at = append(at, len(text))
	var b strings.Builder
	prev := 0
	for i := 0; ; {
		j := strings.Index(string(norm[i:]), old)
		if j < 0 {
			break
		}
		start, end := at[i+j], at[i+j+len(old)]
		nl := strings.IndexByte(text[start:], '\n')
		if nl >= 0 {
			nl += start
		} else {
			nl = strings.LastIndexByte(text, '\n')
		}
		ins := new
		if nl > 0 && text[nl-1] == '\r' {
			ins = strings.ReplaceAll(new, "\n", "\r\n")
		}
		b.WriteString(text[prev:start] + ins)
		prev, i = end, i+j+len(old)
		if !all {
			break
		}
	}
	return b.String() + text[prev:]
}

// loneCR reports whether s has a '\r' that does not begin a "\r\n".
func loneCR(s string) bool {
	return strings.Count(s, "\r") != strings.Count(s, "\r\n")
}

// occurrences counts where sub occurs in s, overlapping places included.
func occurrences(s, sub string) int {
	n := 0
	for i := 0; ; n++ {
		j := strings.Index(s[i:], sub)
		if j < 0 {
			return n
		}
		i += j + 1
	}
}

// uniformEOL reports whether every line break of s is "\r\n", or every
// one is "\n" (so also when s has none).
func uniformEOL(s string) bool {
	crlf := strings.Count(s, "\r\n")
	return crlf == 0 || crlf == strings.Count(s, "\n")
}

// FuzzApplyEdits checks the edit matcher, its line ending and byte order
// mark handling included: it never panics, applies edits one after the
// other, agrees with refReplace, keeps the BOM and a uniform CRLF style,
// and an edit followed by its inverse gives back the original.
func FuzzApplyEdits(f *testing.F) {
	f.Add("hello world", "world", "there", false, "hello", "hi", true)
	f.Add("aaa", "a", "b", true, "bbb", "", false)
	f.Add("x", "", "y", false, "x", "x", false)
	f.Add("\uFEFFone\r\ntwo\r\nthree\r\n", "one\ntwo", "1\n2\n2.5", false, "three\n", "3\r\n", false)
	f.Add("mixed\nends\r\nhere\n", "ends\nhere", "E\nH", false, "E", "e", true)
	f.Add("a\r\r\nb\rc\n", "\r\nb", "\n", false, "c", "\r", false)
	f.Add("\uFEFF", "\uFEFFx", "y", false, "y", "\uFEFF", false)
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
		if err2 == nil && (err != nil || got != want || n != n1+n2) {
			t.Fatalf("both = %q, %d, %v; one by one = %q, %d", got, n, err, want, n1+n2)
		}
		if err2 != nil && (err == nil || !strings.HasPrefix(err.Error(), "edit 2 of 2: ")) {
			t.Fatalf("second edit fails (%v) but both give %v", err2, err)
		}

		// The first edit did what was asked, in lfText form, keeping the
		// byte order mark.
		body, bom := strings.CutPrefix(content, utf8BOM)
		old, new := lfText(old1), lfText(new1)
		if bom {
			old, new = strings.TrimPrefix(old, utf8BOM), strings.TrimPrefix(new, utf8BOM)
		}
		count := strings.Count(lfText(body), old)
		if old == "" || old == new || count == 0 || (count > 1 && !all1) {
			t.Fatalf("edit %+v of %q succeeded", e1, content)
		}
		midBody, midBOM := strings.CutPrefix(mid, utf8BOM)
		if bom && !midBOM {
			t.Fatalf("edit of %q lost the byte order mark: %q", content, mid)
		}
		if bom {
			mid = midBody
		}
		crlf := strings.Contains(body, "\n") && strings.Count(body, "\r\n") == strings.Count(body, "\n")
		if expect := refReplace(body, old, new, all1); n1 != count || mid != expect {
			t.Fatalf("edit %+v of %q gave %q, %d; want %q, %d", e1, content, mid, n1, expect, count)
		}
		if crlf && strings.Count(mid, "\r\n") != strings.Count(mid, "\n") {
			t.Fatalf("edit of CRLF text %q gave %q", content, mid)
		}
		if !strings.Contains(body+new1, "\r") && strings.Contains(mid, "\r") {
			t.Fatalf("edit of LF text %q gave %q", content, mid)
		}

		// The inverse edit gives the original back: its text always, its
		// bytes when its line endings are uniform and the edit left a line
		// break to take the ending from. A lone '\r' next to an inserted
		// '\n' would form a new line ending, so none is allowed.
		if all1 || loneCR(content+old1+new1) || strings.Contains(old1+new1, utf8BOM) || new == "" ||
			occurrences(lfText(mid), new) != 1 {
			return
		}
		back, _, err := applyEdits(content[:len(content)-len(body)]+mid, "f", []editSpec{{OldString: new1, NewString: old1}})
		if err != nil {
			t.Fatalf("inverse of %+v on %q: %v", e1, mid, err)
		}
		if lfText(back) != lfText(content) || (uniformEOL(body) && strings.Contains(mid, "\n") && back != content) {
			t.Fatalf("edit %+v and its inverse turned %q into %q", e1, content, back)
		}
	})
}
