package policy

import (
	"fmt"
	"path"
	"strings"
	"unicode/utf8"

	"github.com/bmatcuk/doublestar/v4"
)

// Paths on a Windows host (Env.OS "windows") are matched in one canonical
// form: separators as "/", letters folded to lower case (NTFS compares
// names without case), the drive letter or the UNC server and share as
// the root: C:\Users\Bob and c:/users/bob are the same path, and so are
// \\srv\share\x and //srv/share/x. Patterns are written with either
// separator; "\" is never an escape on Windows.
//
// Names Windows itself reads differently from their text are refused
// rather than matched: device paths (\\?\, \\.\, \??\) and UNC paths
// unless an allow rule written that way covers them, alternate data
// streams (file.txt:stream, file.txt::$DATA), components that end in a
// dot or a space (Windows drops them: "secret.txt." opens secret.txt),
// and reserved device names (NUL, CON, COM1, ... with any extension).

// osWindows is the Env.OS of a Windows host.
const osWindows = "windows"

// pathKind tells what root a canonical Windows path has.
type pathKind int

const (
	kindDrive  pathKind = iota // c:/...
	kindUNC                    // //server/share/...
	kindDevice                 // //?/... or //./... (\??\ becomes //?/)
)

// winPath is a Windows path in canonical form.
type winPath struct {
	key  string // canonical form
	kind pathKind
	root string // the drive ("c:/"), the share ("//srv/share") or the device prefix ("//?/", "//./")
}

// parseWinPath returns the canonical form of p, an absolute Windows path,
// or an error saying why it cannot be matched.
func parseWinPath(p string) (winPath, error) {
	s := strings.ReplaceAll(p, `\`, "/")
	if strings.HasPrefix(s, "/??/") {
		s = "//?/" + s[4:]
	}
	var w winPath
	switch {
	case len(s) >= 3 && isDriveLetter(s[0]) && s[1] == ':' && s[2] == '/':
		w.kind, w.root, s = kindDrive, strings.ToLower(s[:2])+"/", s[3:]
	case strings.HasPrefix(s, "//?/") || strings.HasPrefix(s, "//./"):
		w.kind, w.root, s = kindDevice, s[:4], s[4:]
	case strings.HasPrefix(s, "//"):
		server, rest, _ := strings.Cut(s[2:], "/")
		share, rest, _ := strings.Cut(rest, "/")
		if server == "" || share == "" {
			return w, fmt.Errorf("%s: a UNC path needs a server and a share (\\\\server\\share\\...)", p)
		}
		w.kind, w.root, s = kindUNC, "//"+foldCase(server)+"/"+foldCase(share), rest
	default:
		return w, fmt.Errorf("%s is not an absolute Windows path (C:\\... or \\\\server\\share\\...)", p)
	}
	clean := path.Clean("/" + s) // ".." never climbs above the root
	for i, name := range strings.Split(clean, "/")[1:] {
		if name == "" || i == 0 && w.kind == kindDevice {
			continue // a device path's first component names the device (C:, UNC, pipe)
		}
		if err := checkWinName(name); err != nil {
			return w, fmt.Errorf("%s: %w", p, err)
		}
	}
	switch {
	case w.kind == kindUNC && clean != "/":
		w.key = foldCase(w.root + clean)
	case w.kind == kindUNC:
		w.key = w.root
	default:
		w.key = foldCase(w.root + strings.TrimPrefix(clean, "/"))
	}
	return w, nil
}

func isDriveLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// foldCase folds s the way the path rules compare names on Windows.
func foldCase(s string) string { return strings.ToLower(s) }

// reservedNames are the DOS device names Windows opens as devices in any
// directory, whatever the extension.
var reservedNames = map[string]bool{
	"con": true, "prn": true, "aux": true, "nul": true, "conin$": true, "conout$": true,
	"com1": true, "com2": true, "com3": true, "com4": true, "com5": true, "com6": true, "com7": true, "com8": true, "com9": true,
	"lpt1": true, "lpt2": true, "lpt3": true, "lpt4": true, "lpt5": true, "lpt6": true, "lpt7": true, "lpt8": true, "lpt9": true,
	"com¹": true, "com²": true, "com³": true, "lpt¹": true, "lpt²": true, "lpt³": true,
}

// checkWinName refuses a path component whose name Windows reads as
// something other than its text.
func checkWinName(name string) error {
	if !utf8.ValidString(name) {
		return fmt.Errorf("%q is not valid UTF-8", name)
	}
	if strings.ContainsAny(name, `:*?"<>|`) || strings.ContainsFunc(name, func(r rune) bool { return r < ' ' }) {
		return fmt.Errorf("%q contains a character Windows does not allow in a name (: names an alternate data stream)", name)
	}
	if name != "." && name != ".." && strings.TrimRight(name, ". ") != name {
		return fmt.Errorf("%q ends in a dot or a space, which Windows drops (it would open %q)", name, strings.TrimRight(name, ". "))
	}
	base, _, _ := strings.Cut(foldCase(name), ".")
	if reservedNames[strings.TrimRight(base, " ")] {
		return fmt.Errorf("%q is a reserved device name on Windows (NUL, CON, COM1, ...)", name)
	}
	return nil
}

// winJoin joins rel, a relative Windows path, to dir, an absolute one.
func winJoin(dir, rel string) string {
	return strings.TrimRight(dir, `\/`) + "/" + rel
}

// isWinAbs reports whether p has a Windows root: a drive with a
// separator, or two leading separators (UNC, device).
func isWinAbs(p string) bool {
	s := strings.ReplaceAll(p, `\`, "/")
	return len(s) >= 3 && isDriveLetter(s[0]) && s[1] == ':' && s[2] == '/' || strings.HasPrefix(s, "//") || strings.HasPrefix(s, "/??/")
}

// winDir returns the directory above key, a canonical path with the
// given root, or "" at the root.
func winDir(key, root string) string {
	if len(key) <= len(root) {
		return ""
	}
	d := key[:strings.LastIndexByte(key, '/')]
	if len(d) < len(root) {
		return root
	}
	return d
}

// compileWinPattern compiles a path pattern for a Windows host.
func compileWinPattern(text string, env Env) (pathPattern, error) {
	pp := pathPattern{text: text}
	t := text
	switch {
	case t == "":
		return pp, fmt.Errorf("empty pattern")
	case strings.ContainsFunc(t, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return pp, fmt.Errorf("%q contains a control character", text)
	case t == "~" || strings.HasPrefix(t, `~/`) || strings.HasPrefix(t, `~\`):
		if env.Home == "" {
			return pp, fmt.Errorf("%q: cannot expand ~: the agent's user has no home directory; write the path out", text)
		}
		t = winJoin(env.Home, t[1:])
	case strings.HasPrefix(t, "~"):
		return pp, fmt.Errorf("%q: only ~ and ~\\ are expanded (the agent's own home); write other users' paths out", text)
	case strings.ContainsRune("*?[", rune(t[0])):
		pp.unanchored = true
		t = foldCase(strings.ReplaceAll(t, `\`, "/"))
		if t != "**" && !strings.HasPrefix(t, "**/") {
			t = "**/" + t
		}
	case !isWinAbs(t):
		t = winJoin(env.Cwd, t)
	}
	if !pp.unanchored {
		root, rest := splitWinPattern(t)
		if root == "" {
			return pp, fmt.Errorf("%q is not an absolute Windows path (C:\\... or \\\\server\\share\\...)", text)
		}
		pp.special = !(len(root) == 3 && root[1] == ':')
		if !strings.ContainsAny(rest, "*?[{") {
			w, err := parseWinPath(t)
			if err != nil {
				return pp, err
			}
			pp.lit = w.key
			return pp, nil
		}
		t = root + foldCase(path.Clean("/" + strings.ReplaceAll(rest, `\`, "/")))[1:]
	}
	if !doublestar.ValidatePattern(t) {
		return pp, fmt.Errorf("%q is not a valid glob (check its [ ] and { } pairs)", text)
	}
	pp.glob = t
	return pp, nil
}

// splitWinPattern returns the canonical root of an absolute Windows path
// pattern and the rest as written; root is "" for a pattern without one.
func splitWinPattern(t string) (root, rest string) {
	s := strings.ReplaceAll(t, `\`, "/")
	if strings.HasPrefix(s, "/??/") {
		s = "//?/" + s[4:]
	}
	switch {
	case len(s) >= 3 && isDriveLetter(s[0]) && s[1] == ':' && s[2] == '/':
		return foldCase(s[:3]), s[3:]
	case strings.HasPrefix(s, "//?/") || strings.HasPrefix(s, "//./"):
		return s[:4], s[4:]
	case strings.HasPrefix(s, "//"):
		server, r, _ := strings.Cut(s[2:], "/")
		share, r, _ := strings.Cut(r, "/")
		if server == "" || share == "" || strings.ContainsAny(server+share, "*?[{") {
			return "", ""
		}
		return "//" + foldCase(server) + "/" + foldCase(share) + "/", r
	}
	return "", ""
}

// checkWinDeny is CheckPathDeny on a Windows host.
func (p *Policy) checkWinDeny(op Op, given, resolved string) error {
	shown := describePath(given, resolved)
	g, err := parseWinPath(given)
	if err == nil {
		var r winPath
		if r, err = parseWinPath(resolved); err == nil {
			return p.checkDeny(op, g.key, r.key, shown, func(k string) string {
				if strings.HasPrefix(k, g.root) {
					return winDir(k, g.root)
				}
				return winDir(k, r.root)
			})
		}
	}
	return &Denial{"paths", fmt.Sprintf("%s %s: %v", op, shown, err)}
}

// checkWinAllow is the allow half of CheckPath on a Windows host, whose
// deny rules have passed: UNC and device paths need an allow rule written
// that way, other paths any allow rule when there are some.
func (p *Policy) checkWinAllow(op Op, given, resolved string) error {
	shown := describePath(given, resolved)
	r, err := parseWinPath(resolved)
	if err != nil {
		return &Denial{"paths", fmt.Sprintf("%s %s: %v", op, shown, err)}
	}
	special := r.kind != kindDrive
	covered := false
	for _, l := range p.paths.byOp[op].allow {
		if len(l.pats) == 0 {
			continue
		}
		pp := l.first(r.key)
		if pp == nil {
			return &Denial{l.name, fmt.Sprintf("%s %s: outside %s (%s)", op, shown, l.name, l.texts())}
		}
		covered = covered || pp.special
	}
	if special && !covered {
		what := "a UNC path (\\\\server\\share\\...)"
		if r.kind == kindDevice {
			what = "a device path (\\\\?\\..., \\\\.\\...); write the path as C:\\... instead"
		}
		return &Denial{"paths", fmt.Sprintf("%s %s: it is %s, which this host's tools reach only where a paths allow rule written that way covers it", op, shown, what)}
	}
	return nil
}

// shellName is the name of a shell given by name or path, for messages.
func shellName(shell string) string {
	return path.Base(strings.ReplaceAll(shell, `\`, "/"))
}
