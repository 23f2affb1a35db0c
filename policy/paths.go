package policy

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/bmatcuk/doublestar/v4"
)

// pathPattern is one compiled path rule.
//
//   - A pattern without wildcards covers that path and everything under
//     it: "/srv/app" matches /srv/app and /srv/app/x, never /srv/app_evil.
//   - "*" and "?" stop at "/", "**" crosses it (doublestar).
//   - A pattern that starts with a wildcard ("*.pem", "**/.ssh/**") is
//     unanchored: it may match at any depth.
//   - "~" and "~/..." expand to the home directory; other relative
//     patterns resolve against the working directory.
//
// On Windows (see winpath.go) patterns are compared in the canonical form
// of Windows paths, "/" separated and without case; a pattern written as
// a UNC or device path is what lets the tools reach such paths. With
// Env.FoldCase (macOS), patterns and paths are compared in the caseless,
// normalized form the file system compares names in (see fold.go).
type pathPattern struct {
	text       string // as written
	lit        string // for a pattern without wildcards: the absolute path
	glob       string // otherwise: the doublestar pattern
	unanchored bool   // glob matches the path without its leading "/"
	special    bool   // on Windows: written as a UNC or device path
}

func (pp *pathPattern) match(path string) bool {
	if pp.glob == "" {
		return path == pp.lit || strings.HasPrefix(path, strings.TrimSuffix(pp.lit, "/")+"/")
	}
	if pp.unanchored {
		path = strings.TrimLeft(path, "/")
	}
	ok, err := doublestar.Match(pp.glob, path)
	return ok && err == nil
}

// compilePathPattern compiles text for env.
func compilePathPattern(text string, env Env) (pathPattern, error) {
	if env.OS == osWindows {
		return compileWinPattern(text, env)
	}
	pp := pathPattern{text: text}
	t := text
	switch {
	case t == "":
		return pp, fmt.Errorf("empty pattern")
	case strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return pp, fmt.Errorf("%q contains a control character", text)
	case t == "~" || strings.HasPrefix(t, "~/"):
		if env.Home == "" {
			return pp, fmt.Errorf("%q: cannot expand ~: the agent's user has no home directory; write the path out", text)
		}
		t = filepath.Join(env.Home, t[1:])
	case strings.HasPrefix(t, "~"):
		return pp, fmt.Errorf("%q: only ~ and ~/ are expanded (the agent's own home); write other users' paths out", text)
	case strings.ContainsRune("*?[", rune(t[0])):
		pp.unanchored = true
		if t != "**" && !strings.HasPrefix(t, "**/") {
			t = "**/" + t
		}
	case !filepath.IsAbs(t):
		t = filepath.Join(env.Cwd, t)
	}
	if !pp.unanchored {
		t = filepath.Clean(t)
	}
	if env.FoldCase {
		t = FoldName(t)
	}
	if !strings.ContainsAny(t, `*?[{\`) {
		pp.lit = t
		return pp, nil
	}
	if !doublestar.ValidatePattern(t) {
		return pp, fmt.Errorf("%q is not a valid glob (check its [ ] and { } pairs and backslashes)", text)
	}
	pp.glob = t
	return pp, nil
}

// pathList is one named list of path rules.
type pathList struct {
	name string // such as "paths.write.deny"
	pats []pathPattern
}

func (l *pathList) first(path string) *pathPattern {
	for i := range l.pats {
		if l.pats[i].match(path) {
			return &l.pats[i]
		}
	}
	return nil
}

// texts lists the patterns as written, for messages.
func (l *pathList) texts() string {
	const most = 5
	var b []string
	for i, p := range l.pats {
		if i == most {
			b = append(b, fmt.Sprintf("and %d more", len(l.pats)-most))
			break
		}
		b = append(b, p.text)
	}
	return strings.Join(b, ", ")
}

// pathRules are the compiled path rules: lists that apply to every
// operation, then each operation's own.
type pathRules struct {
	// byOp is indexed by Op: the common list first, then the op's own.
	byOp [2]struct{ allow, deny []*pathList }
}

func (p *Policy) compilePaths() []error {
	var errs []error
	build := func(name string, texts []string) *pathList {
		l := &pathList{name: name}
		for _, t := range texts {
			pp, err := compilePathPattern(t, p.env)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			l.pats = append(l.pats, pp)
		}
		return l
	}
	r := p.rules.Paths
	allow, deny := build("paths.allow", r.Allow), build("paths.deny", r.Deny)
	for op, l := range [2]listRules{Read: r.Read, Write: r.Write} {
		name := "paths." + Op(op).String()
		p.paths.byOp[op].allow = []*pathList{allow, build(name+".allow", l.Allow)}
		p.paths.byOp[op].deny = []*pathList{deny, build(name+".deny", l.Deny)}
	}
	return errs
}

// HasPathRules reports whether any path rule applies to op (a caller's
// own rules included; see ForCaller).
func (p *Policy) HasPathRules(op Op) bool {
	return p.hasOwnPathRules(op) || p != nil && p.narrow.hasOwnPathRules(op)
}

// hasOwnPathRules is HasPathRules for p's own rules.
func (p *Policy) hasOwnPathRules(op Op) bool {
	if p == nil {
		return false
	}
	for _, l := range append(p.paths.byOp[op].allow, p.paths.byOp[op].deny...) {
		if len(l.pats) > 0 {
			return true
		}
	}
	return false
}

// CheckPath returns nil when op may act on the file a caller named given,
// which resolves to resolved, or a *Denial. Both are absolute paths; given
// has ".." collapsed and resolved has its symbolic links followed (for a
// file that does not exist yet, those of its nearest existing parent).
//
// Deny rules match either path, and any directory above them: a denied
// directory denies what is in it, and denying a symbolic link by its own
// name works. Allow rules match the resolved path only, so a link cannot
// lead out of an allowed tree. Deny always wins over allow; an empty allow
// list restricts nothing. A policy narrowed for a caller (ForCaller)
// checks the caller's own rules too.
func (p *Policy) CheckPath(op Op, given, resolved string) error {
	if err := p.checkOwnPath(op, given, resolved); err != nil || p == nil || p.narrow == nil {
		return err
	}
	return p.narrowed(p.narrow.checkOwnPath(op, given, resolved))
}

// checkOwnPath is CheckPath with p's own rules.
func (p *Policy) checkOwnPath(op Op, given, resolved string) error {
	if err := p.checkOwnPathDeny(op, given, resolved); err != nil {
		return err
	}
	if p == nil {
		return nil
	}
	if p.env.OS == osWindows {
		return p.checkWinAllow(op, given, resolved)
	}
	given, resolved = filepath.Clean(given), filepath.Clean(resolved)
	key := p.pathKey(resolved)
	for _, l := range p.paths.byOp[op].allow {
		if len(l.pats) > 0 && l.first(key) == nil {
			return &Denial{l.name, fmt.Sprintf("%s %s: outside %s (%s)", op, describePath(given, resolved), l.name, l.texts())}
		}
	}
	return nil
}

// CheckPathDeny is CheckPath with the deny rules only: for files the agent
// itself hands out (bash full-output files), which the allow lists need not
// name.
func (p *Policy) CheckPathDeny(op Op, given, resolved string) error {
	if err := p.checkOwnPathDeny(op, given, resolved); err != nil || p == nil || p.narrow == nil {
		return err
	}
	return p.narrowed(p.narrow.checkOwnPathDeny(op, given, resolved))
}

// checkOwnPathDeny is CheckPathDeny with p's own rules.
func (p *Policy) checkOwnPathDeny(op Op, given, resolved string) error {
	if p != nil && p.env.OS == osWindows {
		return p.checkWinDeny(op, given, resolved)
	}
	given, resolved = filepath.Clean(given), filepath.Clean(resolved)
	if !filepath.IsAbs(given) || !filepath.IsAbs(resolved) {
		return &Denial{"paths", fmt.Sprintf("%s %s: not an absolute path", op, describePath(given, resolved))}
	}
	if p == nil {
		return nil
	}
	return p.checkDeny(op, p.pathKey(given), p.pathKey(resolved), describePath(given, resolved), posixDir)
}

// pathKey is the form of a clean absolute POSIX path that the patterns
// match: with Env.FoldCase, its names folded as the file system compares
// them (see fold.go).
func (p *Policy) pathKey(path string) string {
	if p.env.FoldCase {
		return FoldName(path)
	}
	return path
}

// checkDeny applies the deny rules for op to given and resolved, in the
// form the patterns match, with dir giving a path's parent ("" above the
// root); shown names them in messages.
func (p *Policy) checkDeny(op Op, given, resolved, shown string, dir func(string) string) error {
	for _, l := range p.paths.byOp[op].deny {
		if len(l.pats) == 0 {
			continue
		}
		for _, path := range []string{given, resolved} {
			if pp, under := l.firstAbove(path, dir); pp != nil {
				how := "matches"
				if under != path {
					how = under + " matches"
				}
				return &Denial{l.name, fmt.Sprintf("%s %s: %s %s %q", op, shown, how, l.name, pp.text)}
			}
		}
	}
	return nil
}

// firstAbove returns the first pattern that matches path or a directory
// above it (dir gives a path's parent, "" above the root), and what it
// matched.
func (l *pathList) firstAbove(path string, dir func(string) string) (*pathPattern, string) {
	for p := path; p != ""; p = dir(p) {
		if pp := l.first(p); pp != nil {
			return pp, p
		}
	}
	return nil, ""
}

// posixDir is filepath.Dir for a clean absolute POSIX path, "" above "/".
func posixDir(p string) string {
	if p == "/" || p == "." {
		return ""
	}
	return filepath.Dir(p)
}

func describePath(given, resolved string) string {
	if given == resolved {
		return given
	}
	return given + " (resolves to " + resolved + ")"
}
