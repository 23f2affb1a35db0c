package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"regexp/syntax"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

const (
	searchDefaultResults = protocol.SearchResults
	searchMaxResults     = protocol.SearchMaxResults
	// searchMaxBytes bounds the text of the matches shown.
	searchMaxBytes = truncMaxBytes
	// searchLineWidth bounds one shown line; longer lines are cut around
	// the match.
	searchLineWidth = protocol.SearchLineWidth
	// searchMaxFileSize: larger files are skipped.
	searchMaxFileSize = protocol.SearchMaxFileSize
	// searchMaxEntries bounds the directory entries one search examines.
	searchMaxEntries = protocol.SearchMaxEntries
	// searchMaxQuery bounds the query.
	searchMaxQuery = protocol.SearchMaxQuery
	// searchMaxLine bounds how much of one line is matched.
	searchMaxLine = 1 << 20
	// searchTimeBudget bounds one search; it stops sooner when the
	// call's deadline is nearer.
	searchTimeBudget = protocol.SearchTimeBudget
)

// vcsDirs are version-control directories, which search skips.
var vcsDirs = []string{".git", ".hg", ".svn"}

// searchMatch is one matching line.
type searchMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// searchResult is what a search found, and what it left out.
type searchResult struct {
	Path    string        `json:"path"`
	Query   string        `json:"query"`
	Regex   bool          `json:"regex"`
	Matches []searchMatch `json:"matches"`
	// Stopped says why the search ended early: "max_results" or "bytes"
	// (more matches remain), "entries" or "time" (not everything was
	// searched); empty when it searched everything.
	Stopped string `json:"stopped,omitempty"`
	// Unsearched counts the entries not examined once it stopped.
	Unsearched    int `json:"unsearched,omitempty"`
	FilesSearched int `json:"files_searched"`
	SkippedBinary int `json:"skipped_binary"`
	SkippedLarge  int `json:"skipped_large"`
	// Hidden counts files and directories the host policy does not let
	// the tools read (or that are the agent's own); Unreadable those the
	// file system refused.
	Hidden     int `json:"hidden"`
	Unreadable int `json:"unreadable"`
	bytes      int
	examined   int
	budget     time.Duration // the time it had
}

// search finds lines that contain a text or match a regular expression
// in one file or in the files below a directory, with the same checks as
// read for every file it opens.
func (t *toolbox) search(ctx context.Context, tc *toolCall) *protocol.Result {
	return t.searchWithin(ctx, tc, searchMaxEntries, searchDeadline(ctx))
}

// searchWithin is search examining at most maxEntries directory entries
// and stopping at stopAt.
func (t *toolbox) searchWithin(ctx context.Context, tc *toolCall, maxEntries int, stopAt time.Time) *protocol.Result {
	var a protocol.SearchArgs
	if r := decodeArgs(tc, protocol.ToolSearch, &a); r != nil {
		return r
	}
	switch {
	case a.MaxResults < 0 || a.MaxResults > searchMaxResults:
		return toolFailure(tc, "max_results %d is out of range; give 1 to %d (default %d)", a.MaxResults, searchMaxResults, searchDefaultResults)
	case a.MaxResults == 0:
		a.MaxResults = searchDefaultResults
	}
	m, err := compileQuery(a.Query, a.Regex)
	if err != nil {
		return toolFailure(tc, "%v", err)
	}
	if a.Glob != "" && !doublestar.ValidatePattern(a.Glob) {
		return toolFailure(tc, "glob %q is not a valid pattern; use * and ? within a name, ** across directories, {a,b} for alternatives, such as *.go or src/**/*.{ts,tsx}", a.Glob)
	}
	if a.Path == "" {
		a.Path = "."
	}
	path, target, r := t.checkedPath(tc, a.Path, policy.Read)
	if r != nil {
		return r
	}
	s := &searcher{t: t, ctx: ctx, m: m, glob: a.Glob, max: a.MaxResults, path: path, target: target,
		shown: filepath.Clean(a.Path), maxEntries: maxEntries, stopAt: stopAt,
		out: searchResult{Path: path, Query: a.Query, Regex: a.Regex, Matches: []searchMatch{}, budget: roughly(time.Until(stopAt))}}
	if r := s.run(tc); r != nil {
		return r
	}
	r = toolText(tc, s.out.text())
	r.Structured, _ = json.Marshal(s.out)
	return r
}

// searchDeadline is when a search stops: after searchTimeBudget, or
// halfway to the call's deadline when that is nearer, so that what was
// found still reaches the caller.
func searchDeadline(ctx context.Context) time.Time {
	now := time.Now()
	stop := now.Add(searchTimeBudget)
	if d, ok := ctx.Deadline(); ok && now.Add(d.Sub(now)/2).Before(stop) {
		stop = now.Add(d.Sub(now) / 2)
	}
	return stop
}

// roughly rounds d for a message.
func roughly(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return max(0, d.Round(100*time.Millisecond))
}

// searcher runs one search.
type searcher struct {
	t            *toolbox
	ctx          context.Context
	m            matcher
	glob         string
	max          int
	path, target string // the top, as resolved for messages and as checked
	shown        string // the top as the caller gave it, for match paths
	maxEntries   int
	stopAt       time.Time
	entries      int
	out          searchResult
	// full is set once max matches are shown: the next match only
	// tells that more remain.
	full bool
}

// run searches the top, a file or a directory. It returns a result only
// when the search cannot give one of its own.
func (s *searcher) run(tc *toolCall) *protocol.Result {
	if isRoot(s.target) {
		return s.runDir(tc)
	}
	d, meta, err := entryMeta(s.target)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(s.path, err))
	}
	defer d.Close()
	switch {
	case meta.Mode.IsDir():
		return s.runDir(tc)
	case !meta.Mode.IsRegular():
		return toolFailure(tc, "%s is a %s; search looks in regular files and directories", s.path, typeName(meta.Mode))
	case s.glob != "" && !s.globMatch(filepath.Base(s.target), filepath.Base(s.target)):
		return toolFailure(tc, "%s does not match glob %q; leave glob out to search this file", s.path, s.glob)
	case meta.Size > searchMaxFileSize:
		return toolFailure(tc, "%s is %s, more than search reads (%s); use bash grep for it", s.path, humanSize(meta.Size), humanSize(searchMaxFileSize))
	}
	skip, err := s.file(d, filepath.Base(s.target), "")
	switch {
	case s.ctx.Err() != nil:
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "search "+s.path+": cancelled")
	case isDenied(err):
		return deniedResult(tc, err)
	case err != nil:
		return toolFailure(tc, "%s", safefs.Problem(s.path, err))
	case skip == "binary":
		return toolFailure(tc, "%s is a binary file; search looks in text files only", s.path)
	}
	return nil
}

func (s *searcher) runDir(tc *toolCall) *protocol.Result {
	d, err := safefs.OpenDir(s.target, false)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(s.path, err))
	}
	defer d.Close()
	if err := s.dir(d, "", 0); err != nil {
		if s.ctx.Err() != nil {
			return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "search "+s.path+": cancelled")
		}
		return toolFailure(tc, "%s", safefs.Problem(s.path, err))
	}
	return nil
}

// dir searches the directory d at rel, depth-first in name order. It
// fails only when ctx ends or the top directory cannot be read.
func (s *searcher) dir(d *safefs.Dir, rel string, level int) error {
	names, more, err := d.ReadNames(dirReadMax)
	if err != nil {
		if rel == "" {
			return err
		}
		s.out.Unreadable++
		return nil
	}
	if more {
		s.out.Unsearched++ // at least one name was never read
	}
	slices.Sort(names)
	for i, name := range names {
		if s.out.Stopped != "" {
			s.out.Unsearched += len(names) - i
			return nil
		}
		if err := s.ctx.Err(); err != nil {
			return err
		}
		if s.entries++; s.entries > s.maxEntries {
			s.out.examined = s.maxEntries
			s.stop("entries")
			s.out.Unsearched += len(names) - i
			return nil
		}
		if s.entries%256 == 0 && time.Now().After(s.stopAt) {
			s.stop("time")
			s.out.Unsearched += len(names) - i
			return nil
		}
		if err := s.entry(d, relJoin(rel, name), name, level); err != nil {
			return err
		}
	}
	return nil
}

// entry searches one entry of d.
func (s *searcher) entry(d *safefs.Dir, rel, name string, level int) error {
	meta, err := d.Lstat(name)
	if err != nil {
		s.out.Unreadable++
		return nil
	}
	switch {
	case meta.Mode.IsDir():
		if slices.Contains(vcsDirs, name) {
			return nil
		}
		if !s.allowed(rel) {
			return nil
		}
		if level+1 >= treeMaxDepth {
			s.out.Unsearched++
			return nil
		}
		sub, err := d.Sub(name)
		if err != nil {
			s.out.Unreadable++
			return nil
		}
		defer sub.Close()
		return s.dir(sub, rel, level+1)
	case !meta.Mode.IsRegular(), s.glob != "" && !s.globMatch(rel, name), !s.allowed(rel):
		// Links are never followed; pipes and devices never opened.
		return nil
	case meta.Size > searchMaxFileSize:
		s.out.SkippedLarge++
		return nil
	}
	skip, err := s.file(d, name, rel)
	switch {
	case s.ctx.Err() != nil:
		return s.ctx.Err()
	case isDenied(err):
		s.out.Hidden++
	case err != nil:
		s.out.Unreadable++
	case skip == "binary":
		s.out.SkippedBinary++
	}
	return nil
}

// allowed reports whether the host policy lets the tools read the entry
// at rel, and counts it when not.
func (s *searcher) allowed(rel string) bool {
	if s.t.guard.checkResolved(under(s.path, rel), under(s.target, rel), policy.Read) != nil {
		s.out.Hidden++
		return false
	}
	return true
}

// globMatch matches the glob against a file's name, or against its path
// relative to the top when the glob has a "/".
func (s *searcher) globMatch(rel, name string) bool {
	subject := name
	if strings.Contains(s.glob, "/") {
		subject = rel
	}
	ok, _ := doublestar.Match(s.glob, subject)
	return ok
}

// file searches the regular file name in d (at rel below the top). It
// reports "binary" for a file that is not text.
func (s *searcher) file(d *safefs.Dir, name, rel string) (skip string, err error) {
	f, err := d.OpenRead(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !safefs.OpenedRegular(fi) {
		return "other", nil // changed since it was looked at
	}
	shown := filepath.Join(s.shown, filepath.FromSlash(rel))
	if err := s.t.guard.checkOpened(shown, fi); err != nil {
		return "", err
	}
	// Files in /proc and /sys report size 0 whatever they hold: the
	// size cap holds for what is read, too.
	br := bufio.NewReaderSize(io.LimitReader(f, searchMaxFileSize), min(64<<10, max(sniffLen, int(fi.Size())+1)))
	head, err := br.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	if looksBinary(head, len(head) < sniffLen) {
		return "binary", nil
	}
	s.out.FilesSearched++
	return "", s.scan(br, shown)
}

// searchCheckEvery is how much text search matches between checks of
// its context and time limit (every 4096 lines at most): a regular
// expression can take microseconds a byte, and one line is matched in
// one call.
const searchCheckEvery = 16 << 10

// scan matches the lines of r, the file shown as shown.
func (s *searcher) scan(r *bufio.Reader, shown string) error {
	var long []byte // a line longer than r's buffer, up to searchMaxLine
	inLong := false
	read := 0 // bytes since the last check
	for n := 1; ; {
		chunk, err := r.ReadSlice('\n')
		read += len(chunk)
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long, chunk[:min(len(chunk), max(0, searchMaxLine-len(long)))]...)
			inLong = true
			continue
		}
		if len(chunk) == 0 && !inLong {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		line := chunk
		if inLong {
			long = append(long, chunk[:min(len(chunk), max(0, searchMaxLine-len(long)))]...)
			line, long, inLong = long, long[:0], false
		}
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if start, end, ok := s.m.find(line); ok && s.add(shown, n, line, start, end) {
			return nil
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if n++; n%4096 == 0 || read >= searchCheckEvery {
			read = 0
			if err := s.ctx.Err(); err != nil {
				return err
			}
			if time.Now().After(s.stopAt) {
				s.stop("time")
				return nil
			}
		}
	}
}

// add records a match and reports whether the search is over.
func (s *searcher) add(shown string, line int, text []byte, start, end int) bool {
	if s.full {
		s.stop("max_results")
		return true
	}
	m := searchMatch{Path: shown, Line: line, Text: clipLine(text, start, end)}
	size := len(m.Path) + len(m.Text) + 16
	if s.out.bytes+size > searchMaxBytes {
		s.stop("bytes")
		return true
	}
	s.out.bytes += size
	s.out.Matches = append(s.out.Matches, m)
	s.full = len(s.out.Matches) == s.max
	return false
}

func (s *searcher) stop(why string) {
	if s.out.Stopped == "" {
		s.out.Stopped = why
	}
}

// clipLine shortens a line to searchLineWidth bytes around the match at
// [start, end), marking what was cut with "…", and makes it valid UTF-8.
func clipLine(line []byte, start, end int) string {
	if len(line) <= searchLineWidth {
		return strings.ToValidUTF8(string(line), "\uFFFD")
	}
	from := max(0, min(start-searchLineWidth/4, len(line)-searchLineWidth))
	if end-from > searchLineWidth {
		from = start // the match alone is longer than the width
	}
	to := min(len(line), from+searchLineWidth)
	for from > 0 && !utf8.RuneStart(line[from]) {
		from--
	}
	for to < len(line) && !utf8.RuneStart(line[to]) {
		to--
	}
	out := strings.ToValidUTF8(string(line[from:to]), "\uFFFD")
	if from > 0 {
		out = "…" + out
	}
	if to < len(line) {
		out += "…"
	}
	return out
}

// text renders the search result for the model.
func (o *searchResult) text() string {
	var b strings.Builder
	for _, m := range o.Matches {
		fmt.Fprintf(&b, "%s:%d: %s\n", m.Path, m.Line, m.Text)
	}
	if len(o.Matches) == 0 {
		fmt.Fprintf(&b, "No matches for %q in %s (%s searched).\n", o.Query, o.Path, plural(o.FilesSearched, "file", "files"))
	}
	var notes []string
	switch o.Stopped {
	case "max_results":
		notes = append(notes, fmt.Sprintf("Showing the first %s; more remain. Narrow the search with path or glob, or raise max_results (at most %d).", plural(len(o.Matches), "match", "matches"), searchMaxResults))
	case "bytes":
		notes = append(notes, fmt.Sprintf("Showing the first %s (%s limit); more remain. Narrow the search with path or glob.", plural(len(o.Matches), "match", "matches"), humanSize(searchMaxBytes)))
	case "entries":
		notes = append(notes, fmt.Sprintf("Stopped at the limit of %d directory entries examined; at least %s not searched. Narrow the search with path or glob.", o.examined, plural(o.Unsearched, "more entry was", "more entries were")))
	case "time":
		notes = append(notes, fmt.Sprintf("Stopped at the time limit of %s; at least %s not searched. Narrow the search with path or glob.", o.budget, plural(o.Unsearched, "entry was", "entries were")))
	}
	if o.Stopped == "" && o.Unsearched > 0 {
		notes = append(notes, fmt.Sprintf("%s not searched (directories nested too deep, or with more than %d entries).", plural(o.Unsearched, "entry was", "entries were"), dirReadMax))
	}
	var skipped []string
	for _, c := range []struct {
		n         int
		one, many string
	}{
		{o.SkippedBinary, "binary file", "binary files"},
		{o.SkippedLarge, "file larger than " + humanSize(searchMaxFileSize), "files larger than " + humanSize(searchMaxFileSize)},
		{o.Hidden, "entry the tools may not read (host policy or the agent's own files)", "entries the tools may not read (host policy or the agent's own files)"},
		{o.Unreadable, "unreadable entry", "unreadable entries"},
	} {
		if c.n > 0 {
			skipped = append(skipped, plural(c.n, c.one, c.many))
		}
	}
	if len(skipped) > 0 {
		notes = append(notes, "Not searched: "+strings.Join(skipped, ", ")+".")
	}
	if len(notes) > 0 {
		b.WriteString("\n[" + strings.Join(notes, "]\n[") + "]\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// matcher finds a literal text or a regular expression in a line.
type matcher struct {
	lit []byte
	re  *regexp.Regexp
}

// find returns where the first match in line is.
func (m matcher) find(line []byte) (start, end int, ok bool) {
	if m.re != nil {
		loc := m.re.FindIndex(line)
		if loc == nil {
			return 0, 0, false
		}
		return loc[0], loc[1], true
	}
	i := bytes.Index(line, m.lit)
	return i, i + len(m.lit), i >= 0
}

// compileQuery checks a search query and returns its matcher. An invalid
// regular expression gets an error that says what is wrong and where.
func compileQuery(query string, regex bool) (matcher, error) {
	switch {
	case query == "":
		return matcher{}, errors.New("query is empty; give the text to search for")
	case len(query) > searchMaxQuery:
		return matcher{}, fmt.Errorf("query is %d bytes, more than %d; search for a shorter part of it", len(query), searchMaxQuery)
	case !regex && strings.ContainsAny(query, "\n\r"):
		return matcher{}, errors.New("query has a line break, but search matches one line at a time; search for one line of it")
	case !regex:
		return matcher{lit: []byte(query)}, nil
	}
	re, err := regexp.Compile(query)
	if err != nil {
		return matcher{}, regexError(query, err)
	}
	return matcher{re: re}, nil
}

// regexError describes why query is not a valid RE2 expression, with the
// byte offset of the problem where it can be told.
func regexError(query string, err error) error {
	const hint = "; escape special characters with \\, or set regex to false to search for the text as it is"
	var se *syntax.Error
	if !errors.As(err, &se) {
		return fmt.Errorf("query is not a valid regular expression: %w%s", err, hint)
	}
	what := fmt.Sprintf("%s: `%s`", se.Code, se.Expr)
	if pos, ok := regexErrorOffset(query, se); ok {
		where := fmt.Sprintf("at byte %d", pos)
		if len(query) <= 80 {
			where += fmt.Sprintf(" (%s⟨here⟩%s)", query[:pos], query[pos:])
		}
		return fmt.Errorf("query is not a valid RE2 regular expression: %s %s%s", what, where, hint)
	}
	return fmt.Errorf("query is not a valid RE2 regular expression: %s%s", what, hint)
}

// regexErrorOffset finds where in query the parser met the error se. The
// parser reads left to right and stops at the first error, so a prefix
// of query fails the same way exactly when it holds the part in error: a
// binary search finds the shortest such prefix, which ends with that part
// (for an unexpected ")", with the ")" itself). Errors about the whole
// expression (a missing ")", too large) have no offset.
func regexErrorOffset(query string, se *syntax.Error) (int, bool) {
	switch se.Code {
	case syntax.ErrMissingParen, syntax.ErrLarge, syntax.ErrNestingDepth, syntax.ErrInternalError:
		return 0, false
	case syntax.ErrTrailingBackslash:
		return len(query) - 1, true
	}
	whole := se.Code == syntax.ErrUnexpectedParen
	boundary := func(n int) int { // prefixes end between characters
		for n < len(query) && !utf8.RuneStart(query[n]) {
			n++
		}
		return n
	}
	n := boundary(sort.Search(len(query), func(n int) bool {
		_, err := syntax.Parse(query[:boundary(n+1)], syntax.Perl)
		var pe *syntax.Error
		return errors.As(err, &pe) && pe.Code == se.Code && (whole || pe.Expr == se.Expr)
	}) + 1)
	switch {
	case n > len(query):
		return 0, false
	case whole:
		return n - 1, true
	case strings.HasSuffix(query[:n], se.Expr):
		return n - len(se.Expr), true
	}
	return 0, false
}
