//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"regexp/syntax"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// searchOf decodes a search result's structured result.
func searchOf(t *testing.T, r *protocol.Result) searchResult {
	t.Helper()
	if r.Error != nil || r.IsError {
		t.Fatalf("search failed: %+v", r)
	}
	var s searchResult
	if err := json.Unmarshal(r.Structured, &s); err != nil {
		t.Fatalf("structured result %s: %v", r.Structured, err)
	}
	return s
}

func TestSearch(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	tbFile(t, dir, "src/main.go", "package main\n\nfunc main() {\n\tprintln(\"TODO: greet\")\n}\n")
	tbFile(t, dir, "src/util/util.go", "package util\n// TODO: more\r\nvar x = 1 // todo lower\n")
	tbFile(t, dir, "README.md", "# TODO list\nno match here")
	tbFile(t, dir, ".git/config", "TODO in git metadata\n")
	tbFile(t, dir, "noeol.txt", "last line TODO")

	r := run(t, tb, "search", map[string]any{"query": "TODO"})
	tbWant(t, r, false, `README.md:1: # TODO list
noeol.txt:1: last line TODO
src/main.go:4: 	println("TODO: greet")
src/util/util.go:2: // TODO: more`)
	s := searchOf(t, r)
	if len(s.Matches) != 4 || s.FilesSearched != 4 || s.Stopped != "" || s.Matches[2] != (searchMatch{Path: "src/main.go", Line: 4, Text: "\tprintln(\"TODO: greet\")"}) {
		t.Errorf("structured = %+v", s)
	}

	// A regular expression, a subdirectory given as path, and a glob.
	r = run(t, tb, "search", map[string]any{"path": "src", "query": `(?i)todo\b`, "regex": true, "glob": "util*.go"})
	tbWant(t, r, false, "src/util/util.go:2: // TODO: more\nsrc/util/util.go:3: var x = 1 // todo lower")
	r = run(t, tb, "search", map[string]any{"path": dir, "query": "package", "glob": "src/**/*.go"})
	tbWant(t, r, false, filepath.Join(dir, "src/main.go")+":1: package main\n"+filepath.Join(dir, "src/util/util.go")+":1: package util")
	r = run(t, tb, "search", map[string]any{"query": "package", "glob": "*.{md,txt}"})
	tbWant(t, r, false, `No matches for "package" in `+dir+" (2 files searched).")

	// One file.
	r = run(t, tb, "search", map[string]any{"path": "src/main.go", "query": "main"})
	tbWant(t, r, false, "src/main.go:1: package main\nsrc/main.go:3: func main() {")
}

func TestSearchFailures(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	tbFile(t, dir, "bin.dat", "text\x00more")
	tbFile(t, dir, "a.txt", "x")
	for _, tt := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"query": ""}, "query is empty"},
		{map[string]any{"query": "a\nb"}, "line break"},
		{map[string]any{"query": strings.Repeat("x", searchMaxQuery+1)}, "more than 4096"},
		{map[string]any{"query": "x", "max_results": -1}, "max_results -1 is out of range; give 1 to 1000"},
		{map[string]any{"query": "x", "max_results": 1001}, "max_results 1001 is out of range"},
		{map[string]any{"query": "x", "glob": "[a-"}, `glob "[a-" is not a valid pattern`},
		{map[string]any{"query": "x", "path": "bin.dat"}, "bin.dat is a binary file; search looks in text files only"},
		{map[string]any{"query": "x", "path": "a.txt", "glob": "*.go"}, `a.txt does not match glob "*.go"`},
		{map[string]any{"query": "x", "path": "missing"}, "missing: no such file"},
	} {
		r := run(t, tb, "search", tt.args)
		if !r.IsError || !strings.Contains(tbText(t, r), tt.want) {
			t.Errorf("search %v: %+v, want %q", tt.args, r, tt.want)
		}
	}
	tbBadArgs(t, run(t, tb, "search", map[string]any{"query": "x", "ignore_case": true}), "unknown field")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, _ := tbCall(t, ctx, tb, "search", map[string]any{"query": "x"})
	if r.Error == nil || r.Error.Code != protocol.CodeCancelled {
		t.Errorf("cancelled search: %+v", r)
	}
}

// Invalid regular expressions are refused with what is wrong and where.
func TestSearchRegexErrors(t *testing.T) {
	for _, tt := range []struct {
		query string
		want  []string
	}{
		{`a(b`, []string{"missing closing ): `a(b`"}},
		{`ab)c`, []string{"unexpected ): `ab)c`", "at byte 2 (ab⟨here⟩)c)"}},
		{`foo\Z`, []string{"invalid escape sequence: `\\Z`", "at byte 3 (foo⟨here⟩\\Z)"}},
		{`a*b(*)`, []string{"missing argument to repetition operator: `*`", "at byte 4"}},
		{`(a)(b))`, []string{"unexpected ): `(a)(b))`", "at byte 6"}},
		{`[)](x`, []string{"missing closing ): `[)](x`"}},
		{`x{2,1}`, []string{"invalid repeat count: `{2,1}`", "at byte 1"}},
		{`ok[z-a]`, []string{"invalid character class range: `z-a`", "at byte 3"}},
		{`é[b`, []string{"missing closing ]: `[b`", "at byte 2"}},
		{`ab\`, []string{"trailing backslash at end of expression", "at byte 2"}},
		{`(?<name`, []string{"invalid named capture"}},
		{strings.Repeat("(", 2000) + strings.Repeat(")", 2000), []string{"expression nests too deeply"}},
	} {
		_, err := compileQuery(tt.query, true)
		if err == nil {
			t.Errorf("%q compiled", tt.query)
			continue
		}
		for _, w := range append(tt.want, "set regex to false") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v\n  does not mention %q", tt.query, err, w)
			}
		}
	}
	// What is special in a regex is literal without regex.
	if _, err := compileQuery(`a(b`, false); err != nil {
		t.Errorf("literal query refused: %v", err)
	}
}

// FuzzCompileQuery: any query compiles exactly when Go's regexp accepts
// it, and an error's offset lies within the query.
func FuzzCompileQuery(f *testing.F) {
	for _, s := range []string{"a(b", "ab)c", `foo\Z`, "a*(*)", "x{2,1}", "[z-a]", "é[b", `ab\`, "(?i)ok", "plain"} {
		f.Add(s, true)
	}
	f.Add("line\nbreak", false)
	offset := regexp.MustCompile(`at byte (\d+)`)
	f.Fuzz(func(t *testing.T, query string, regex bool) {
		if !utf8.ValidString(query) {
			return // JSON arguments are always valid UTF-8
		}
		m, err := compileQuery(query, regex)
		if !regex || query == "" || len(query) > searchMaxQuery {
			if err == nil && m.re != nil {
				t.Fatalf("%q: literal query compiled as a regex", query)
			}
			return
		}
		_, rerr := regexp.Compile(query)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("%q: compileQuery error %v, regexp error %v", query, err, rerr)
		}
		if err == nil {
			return
		}
		sm := offset.FindStringSubmatch(err.Error())
		var se *syntax.Error
		if !errors.As(rerr, &se) {
			t.Fatalf("%q: regexp error %T", query, rerr)
		}
		pos, ok := regexErrorOffset(query, se)
		if ok != (sm != nil) || ok && sm[1] != fmt.Sprint(pos) {
			t.Fatalf("%q: message %q, offset %d %v", query, err, pos, ok)
		}
		switch {
		case !ok:
		case pos < 0 || pos >= len(query):
			t.Fatalf("%q: offset %d outside the query", query, pos)
		case se.Code == syntax.ErrUnexpectedParen && query[pos] != ')':
			t.Fatalf("%q: unexpected ) at %d, where %q is", query, pos, query[pos])
		case se.Code != syntax.ErrUnexpectedParen && se.Code != syntax.ErrTrailingBackslash && !strings.HasPrefix(query[pos:], se.Expr):
			t.Fatalf("%q: %s at %d, where %q is", query, se.Expr, pos, query[pos:])
		}
	})
}

// Binary files, large files, links and version-control metadata are not
// searched; the skipped ones are counted.
func TestSearchSkips(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	outside := t.TempDir()
	tbFile(t, outside, "out.txt", "needle outside\n")
	tbFile(t, dir, "text.txt", "needle\n")
	tbFile(t, dir, "nul.bin", "needle\x00\n")
	tbFile(t, dir, "latin1.txt", "needle caf\xe9\n")
	tbFile(t, dir, ".hg/store", "needle\n")
	big := tbFile(t, dir, "big.log", "needle\n")
	if err := os.Truncate(big, searchMaxFileSize+1); err != nil {
		t.Fatal(err)
	}
	tbLink(t, dir, "out", outside)
	tbLink(t, dir, "out.txt", filepath.Join(outside, "out.txt"))
	tbLink(t, dir, "loop", ".")
	r := run(t, tb, "search", map[string]any{"query": "needle"})
	tbWant(t, r, false, "text.txt:1: needle\n\n[Not searched: 2 binary files, 1 file larger than 10.0MB.]")
	s := searchOf(t, r)
	if s.SkippedBinary != 2 || s.SkippedLarge != 1 || s.FilesSearched != 1 {
		t.Errorf("structured = %+v", s)
	}
	r = run(t, tb, "search", map[string]any{"query": "needle", "path": "big.log"})
	if !r.IsError || !strings.Contains(tbText(t, r), "more than search reads (10.0MB); use bash grep") {
		t.Errorf("search a large file: %+v", r)
	}
}

// The caps: max_results (with a note only when more remain), the byte
// limit, long lines cut around the match, the entry bound and the time
// bound.
func TestSearchCaps(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	var lines []string
	for i := range 10 {
		lines = append(lines, fmt.Sprintf("hit %d", i))
	}
	tbFile(t, dir, "ten.txt", strings.Join(lines, "\n")+"\n")

	r := run(t, tb, "search", map[string]any{"query": "hit", "max_results": 3})
	tbWant(t, r, false, "ten.txt:1: hit 0\nten.txt:2: hit 1\nten.txt:3: hit 2\n\n"+
		"[Showing the first 3 matches; more remain. Narrow the search with path or glob, or raise max_results (at most 1000).]")
	if s := searchOf(t, r); s.Stopped != "max_results" || len(s.Matches) != 3 {
		t.Errorf("structured = %+v", s)
	}
	r = run(t, tb, "search", map[string]any{"query": "hit", "max_results": 10})
	if s := searchOf(t, r); s.Stopped != "" || len(s.Matches) != 10 || strings.Contains(tbText(t, r), "[") {
		t.Errorf("exactly max_results matches: %+v\n%s", s, tbText(t, r))
	}

	// Long lines: cut to the width around the match; the byte limit.
	long := strings.Repeat("a", 700) + "NEEDLE" + strings.Repeat("é", 500)
	tbFile(t, dir, "wide/long.txt", strings.Repeat(long+"\n", 400))
	r = run(t, tb, "search", map[string]any{"path": "wide", "query": "NEEDLE", "max_results": 1000})
	s := searchOf(t, r)
	if s.Stopped != "bytes" || len(s.Matches) < 100 || len(tbText(t, r)) > searchMaxBytes+500 {
		t.Fatalf("byte limit: stopped %q after %d matches, %d bytes", s.Stopped, len(s.Matches), len(tbText(t, r)))
	}
	text := s.Matches[0].Text
	if !strings.HasPrefix(text, "…a") || !strings.HasSuffix(text, "é…") || !strings.Contains(text, "NEEDLE") ||
		len(text) > searchLineWidth+2*len("…") || !utf8.ValidString(text) {
		t.Errorf("cut line %q (%d bytes)", text, len(text))
	}
	if !strings.Contains(tbText(t, r), fmt.Sprintf("[Showing the first %d matches (50.0KB limit); more remain.", len(s.Matches))) {
		t.Errorf("byte limit note missing: %s", tbText(t, r)[len(tbText(t, r))-300:])
	}

	// The entry bound and the time bound, with small limits.
	for i := range 300 {
		tbFile(t, dir, fmt.Sprintf("many/f%03d.txt", i), "hit\n")
	}
	search := func(maxEntries int, stopAt time.Time) *protocol.Result {
		tc := &toolCall{ID: "call-1", Args: json.RawMessage(`{"path":"many","query":"hit","max_results":1000}`), Output: func([]byte) {}}
		return tb.searchWithin(context.Background(), tc, maxEntries, stopAt)
	}
	r = search(100, time.Now().Add(time.Hour))
	if s := searchOf(t, r); s.Stopped != "entries" || len(s.Matches) != 100 || s.Unsearched != 200 ||
		!strings.Contains(tbText(t, r), "[Stopped at the limit of 100 directory entries examined; at least 200 more entries were not searched.") {
		t.Errorf("entry bound: %+v\n%s", s, tbText(t, r)[len(tbText(t, r))-200:])
	}
	r = search(searchMaxEntries, time.Now())
	if s := searchOf(t, r); s.Stopped != "time" || len(s.Matches) != 255 || s.Unsearched != 45 ||
		!strings.Contains(tbText(t, r), "[Stopped at the time limit of 0s; at least 45 entries were not searched.") {
		t.Errorf("time bound: stopped %q, %d matches, %d unsearched", s.Stopped, len(s.Matches), s.Unsearched)
	}
}

// Files the host policy does not let the tools read are skipped and
// counted, and so are the agent's own files, also under another name.
func TestSearchPolicy(t *testing.T) {
	g := tbPolicy(t, `paths: {deny: ["**/secret/**", "*.pem"]}`)
	g.file(t, "ok.txt", "token\n")
	g.file(t, "key.pem", "token\n")
	g.file(t, "secret/a.txt", "token\n")
	g.file(t, "notes.md", "token\n")
	if err := os.WriteFile(g.secret, []byte("token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(g.secret, filepath.Join(g.cwd, "hard.txt")); err != nil {
		t.Fatal(err)
	}
	r := run(t, g.toolbox, "search", map[string]any{"query": "token"})
	tbWant(t, r, false, "notes.md:1: token\nok.txt:1: token\n\n[Not searched: 3 entries the tools may not read (host policy or the agent's own files).]")
	wantDenied(t, "search a denied file", run(t, g.toolbox, "search", map[string]any{"query": "token", "path": "key.pem"}), `paths.deny "*.pem"`)
	wantDenied(t, "search the credentials by another name", run(t, g.toolbox, "search", map[string]any{"query": "token", "path": "hard.txt"}), "credentials under another name")

	// The directory that holds the agent's files: only the policy file
	// is searched.
	tbFile(t, g.state, "tasks.json", "token\n")
	own := filepath.Dir(g.state)
	r = run(t, g.toolbox, "search", map[string]any{"query": "token", "path": own})
	tbWant(t, r, false, `No matches for "token" in `+own+" (1 file searched).\n\n[Not searched: 2 entries the tools may not read (host policy or the agent's own files).]")
}
