//go:build unix

package agent

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
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
		e1 := protocol.EditOp{OldString: old1, NewString: new1, ReplaceAll: all1}
		e2 := protocol.EditOp{OldString: old2, NewString: new2, ReplaceAll: all2}
		got, n, err := applyEdits(context.Background(), content, "f", []protocol.EditOp{e1, e2})

		// Two edits at once are the same as one after the other.
		mid, n1, err1 := applyEdits(context.Background(), content, "f", []protocol.EditOp{e1})
		if err1 != nil {
			if err == nil || !strings.HasPrefix(err.Error(), "edit 1 of 2: ") {
				t.Fatalf("first edit fails (%v) but both give %v", err1, err)
			}
			return
		}
		want, n2, err2 := applyEdits(context.Background(), mid, "f", []protocol.EditOp{e2})
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
		back, _, err := applyEdits(context.Background(), content[:len(content)-len(body)]+mid, "f", []protocol.EditOp{{OldString: new1, NewString: old1}})
		if err != nil {
			t.Fatalf("inverse of %+v on %q: %v", e1, mid, err)
		}
		if lfText(back) != lfText(content) || (uniformEOL(body) && strings.Contains(mid, "\n") && back != content) {
			t.Fatalf("edit %+v and its inverse turned %q into %q", e1, content, back)
		}
	})
}

// refApplyEdits is applyEdits done the plain way, one pass over the
// whole text per edit and more, as the edit tool once did: the
// reference the edit engine must agree with exactly.
func refApplyEdits(content, path string, edits []protocol.EditOp) (string, int, error) {
	bom := ""
	if strings.HasPrefix(content, utf8BOM) {
		bom, content = utf8BOM, content[len(utf8BOM):]
	}
	total := 0
	for i, e := range edits {
		which := fmt.Sprintf("edit %d of %d", i+1, len(edits))
		old, new := lfText(e.OldString), lfText(e.NewString)
		if bom != "" {
			old, new = strings.TrimPrefix(old, utf8BOM), strings.TrimPrefix(new, utf8BOM)
		}
		if old == "" {
			return "", 0, fmt.Errorf("%s: old_string is empty; give the exact text to replace", which)
		}
		if new == old {
			return "", 0, fmt.Errorf("%s: new_string equals old_string, so the edit makes no change", which)
		}
		doc := newEOLDoc(content)
		n := strings.Count(doc.norm, old)
		switch {
		case n == 0:
			return "", 0, fmt.Errorf("%s: old_string not found in %s", which, path)
		case n > 1 && !e.ReplaceAll:
			return "", 0, fmt.Errorf("%s: old_string matches %d times in %s; add surrounding context to make it unique, or set replace_all", which, n, path)
		}
		times := 1
		if e.ReplaceAll {
			times = n
		}
		if size := len(bom) + len(content) + times*(len(new)+strings.Count(new, "\n")-len(old)); size > maxEditFileBytes {
			return "", 0, fmt.Errorf("%s: the result would be up to %s (%d replacements), more than edit writes (%s); make fewer or smaller replacements at a time",
				which, humanSize(int64(size)), times, humanSize(maxEditFileBytes))
		}
		content = doc.replace(old, new, e.ReplaceAll)
		total += n
	}
	return bom + content, total, nil
}

// editCase builds a text and edits from the bytes of data: small
// alphabets of letters, CR, LF and the byte order mark, and edits whose
// old strings are mostly taken from the text as the edits before left
// it, so that edits meet, overlap, cross line endings and undo each
// other.
func editCase(data []byte) (string, []protocol.EditOp) {
	next := func() int {
		if len(data) == 0 {
			return 0
		}
		b := int(data[0])
		data = data[1:]
		return b
	}
	atoms := []string{"a", "b", "ab", "\n", "\r\n", "\r", "x", "\uFEFF", "aa"}
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(atoms[next()%len(atoms)])
		}
		return b.String()
	}
	text := word(next() % 40)
	if next()%4 == 0 {
		text = utf8BOM + text
	}
	var edits []protocol.EditOp
	cur := text
	for range 1 + next()%10 {
		var old string
		if r := next(); r%5 != 0 && len(cur) > 0 {
			i := next() % len(cur)
			j := i + 1 + next()%6
			old = cur[i:min(j, len(cur))]
		} else {
			old = word(1 + next()%3)
		}
		e := protocol.EditOp{OldString: old, NewString: word(next() % 4), ReplaceAll: next()%3 == 0}
		edits = append(edits, e)
		if out, _, err := refApplyEdits(cur, "f", []protocol.EditOp{e}); err == nil {
			cur = out
		}
	}
	return text, edits
}

// tightLimits make the engine split its index into matchers of two
// patterns, leave out patterns with more than a few places, give up
// indexing after a little work, search little text around replacements
// (and long old strings the slow way, likewise giving up) and join the
// pieces often, so that small tests take those paths.
func tightLimits(r uint32) editLimits {
	return editLimits{matcher: matcherLimits{cells: 1 + int(r%64), patterns: 2}, indexed: int(r % 5), scan: int(r % 7), scanPerByte: int(r % 3), windows: int(r % 11),
		context: int(r>>8) % 5, pieces: 1 + int(r>>12)%6}
}

// checkEditsAgree fails unless applyEdits, with the default limits and
// with tight ones, and refApplyEdits agree.
func checkEditsAgree(t *testing.T, text string, edits []protocol.EditOp, tight uint32) {
	t.Helper()
	want, wn, werr := refApplyEdits(text, "f", edits)
	for _, lim := range []editLimits{defaultEditLimits(), tightLimits(tight)} {
		got, n, err := applyEditsWithin(context.Background(), text, "f", edits, lim)
		if fmt.Sprint(err) != fmt.Sprint(werr) || got != want || n != wn {
			t.Fatalf("applyEdits(%q, %+v) with %+v\n= %q, %d, %v\nwant %q, %d, %v", text, edits, lim, got, n, err, want, wn, werr)
		}
	}
}

// TestApplyEditsAgreesWithReference runs many random edit sequences.
func TestApplyEditsAgreesWithReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := 20000
	if testing.Short() {
		cases = 2000
	}
	for range cases {
		data := make([]byte, 64)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		text, edits := editCase(data)
		checkEditsAgree(t, text, edits, r.Uint32())
	}
}

// FuzzApplyEditsMany: many edits at once give exactly what applying
// them the plain way one after the other gives.
func FuzzApplyEditsMany(f *testing.F) {
	f.Add([]byte("\x05\x01\x02\x03\x04\x05\x06\x07\x08"), uint32(0))
	f.Add([]byte("\x20\x00\x03\x04\x05\x04\x03\x00\x01\x02\x05\x03\x01\x02\x00\x03"), uint32(17))
	f.Add([]byte("\x10\x01\x04\x04\x05\x05\x04\x01\x02\x03\x00\x01\x00\x02\x01\x02\x00\x00"), uint32(99))
	f.Fuzz(func(t *testing.T, data []byte, tight uint32) {
		text, edits := editCase(data)
		checkEditsAgree(t, text, edits, tight)
	})
}
