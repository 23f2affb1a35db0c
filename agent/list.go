package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

const (
	listDefaultDepth = protocol.ListDepth
	listMaxDepth     = protocol.ListMaxDepth
	// listMaxEntries bounds the entries one listing shows.
	listMaxEntries = protocol.ListMaxEntries
)

// listEntry is one entry of a listing.
type listEntry struct {
	// Path is relative to the listed directory, with "/" between names.
	Path string `json:"path"`
	// Type is file, dir, symlink or other.
	Type string `json:"type"`
	// Size is the size in bytes as the file system reports it.
	Size int64 `json:"size"`
	// Target is a symbolic link's destination, as written in the link.
	Target string `json:"target,omitempty"`
	// Kind names what an "other" entry is: named pipe, socket, device.
	Kind string `json:"kind,omitempty"`
	// Error says why a directory's entries are missing.
	Error string `json:"error,omitempty"`
}

// listing is what a list call found.
type listing struct {
	Path    string      `json:"path"`
	Depth   int         `json:"depth"`
	Entries []listEntry `json:"entries"`
	// Hidden counts the entries left out because the host policy does
	// not let the tools read them (or they are the agent's own).
	Hidden int `json:"hidden"`
	// Truncated is set when the listing stopped at listMaxEntries;
	// Unlisted then counts the entries known to be left out.
	Truncated bool `json:"truncated"`
	Unlisted  int  `json:"unlisted,omitempty"`
	// Unexpanded counts the directories at the depth limit, whose
	// entries are not shown.
	Unexpanded int `json:"unexpanded"`
	// Crowded names directories with more than dirReadMax entries, of
	// which only the first dirReadMax read were considered.
	Crowded []string `json:"crowded,omitempty"`
}

// list shows a directory tree to a bounded depth, breadth first so that
// a listing cut at listMaxEntries keeps the upper levels whole. Links are
// never followed; entries the host policy does not let the tools read are
// left out and counted.
func (t *toolbox) list(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.ListArgs
	if r := decodeArgs(tc, protocol.ToolList, &a); r != nil {
		return r
	}
	switch {
	case a.Depth < 0 || a.Depth > listMaxDepth:
		return toolFailure(tc, "depth %d is out of range; give 1 to %d (default %d)", a.Depth, listMaxDepth, listDefaultDepth)
	case a.Depth == 0:
		a.Depth = listDefaultDepth
	}
	if a.Path == "" {
		a.Path = "."
	}
	path, target, r := t.checkedPath(tc, a.Path, policy.Read)
	if r != nil {
		return r
	}
	if !isRoot(target) {
		d, meta, err := entryMeta(target)
		if err != nil {
			return toolFailure(tc, "%s", safefs.Problem(path, err))
		}
		d.Close()
		if !meta.Mode.IsDir() {
			return toolFailure(tc, "%s is a %s (%d bytes), not a directory; use read for a file", path, typeName(meta.Mode), meta.Size)
		}
	}
	root, err := safefs.OpenDir(target, false)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	defer root.Close()
	l := &lister{t: t, path: path, target: target, out: listing{Path: path, Depth: a.Depth, Entries: []listEntry{}}}
	if err := l.walk(ctx, root); err != nil {
		if ctx.Err() != nil {
			return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "list "+path+": cancelled")
		}
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	slices.SortFunc(l.out.Entries, func(x, y listEntry) int { return comparePaths(x.Path, y.Path) })
	r = toolText(tc, l.out.text())
	r.Structured, _ = json.Marshal(l.out)
	return r
}

// lister walks one listing.
type lister struct {
	t            *toolbox
	path, target string
	out          listing
}

// walk lists the tree below root level by level. It fails when ctx ends
// or the top directory cannot be read; a subdirectory that cannot be read
// is marked on its entry.
func (l *lister) walk(ctx context.Context, root *safefs.Dir) error {
	level := []string{""} // the directories to read at this depth, relative to root
	for depth := 1; len(level) > 0; depth++ {
		var next []string
		for _, rel := range level {
			if err := ctx.Err(); err != nil {
				return err
			}
			subs, full, err := l.readDir(root, rel, depth)
			if err != nil {
				return err
			}
			next = append(next, subs...)
			if full {
				return nil
			}
		}
		level = next
	}
	return nil
}

// readDir adds the entries of the directory at rel (depth levels below
// the top) and returns its subdirectories to read next, and whether the
// listing is full. Only the top directory's failure is an error.
func (l *lister) readDir(root *safefs.Dir, rel string, depth int) (subs []string, full bool, err error) {
	d, err := openRel(root, rel)
	var names []string
	if err == nil {
		defer d.Close()
		names, err = l.readNames(d, rel)
	}
	if err != nil {
		if rel == "" {
			return nil, false, err
		}
		// Say so on the directory's entry.
		msg := strings.TrimPrefix(safefs.Problem(under(l.path, rel), err), under(l.path, rel)+": ")
		if i := slices.IndexFunc(l.out.Entries, func(e listEntry) bool { return e.Path == rel }); i >= 0 {
			l.out.Entries[i].Error = msg
		}
		return nil, false, nil
	}
	for i, name := range names {
		if len(l.out.Entries) == listMaxEntries {
			l.out.Truncated = true
			l.out.Unlisted += len(names) - i
			return subs, true, nil
		}
		e, ok := l.entry(d, relJoin(rel, name), name)
		if !ok {
			continue
		}
		l.out.Entries = append(l.out.Entries, e)
		switch {
		case e.Type != "dir" || e.Error != "":
		case depth < l.out.Depth:
			subs = append(subs, e.Path)
		default:
			l.out.Unexpanded++
		}
	}
	return subs, false, nil
}

// readNames returns the names in d, the directory at rel, sorted.
func (l *lister) readNames(d *safefs.Dir, rel string) ([]string, error) {
	names, more, err := d.ReadNames(dirReadMax)
	if more {
		l.out.Crowded = append(l.out.Crowded, relOrDot(rel))
	}
	slices.Sort(names)
	return names, err
}

// entry describes name, an entry of d at rel, if the tools may read it.
func (l *lister) entry(d *safefs.Dir, rel, name string) (listEntry, bool) {
	if err := l.t.guard.checkResolved(under(l.path, rel), under(l.target, rel), policy.Read); err != nil {
		l.out.Hidden++
		return listEntry{}, false
	}
	e := listEntry{Path: rel}
	meta, err := d.Lstat(name)
	if err != nil {
		e.Type, e.Error = "other", strings.TrimPrefix(safefs.Problem(rel, err), rel+": ")
		return e, true
	}
	e.Size = meta.Size
	switch {
	case meta.Mode.IsRegular():
		e.Type = "file"
	case meta.Mode.IsDir():
		e.Type = "dir"
	case meta.Mode&fs.ModeSymlink != 0:
		e.Type = "symlink"
		if e.Target, err = d.Readlink(name); err != nil {
			e.Error = strings.TrimPrefix(safefs.Problem(rel, err), rel+": ")
		}
	default:
		e.Type, e.Kind = "other", typeName(meta.Mode)
	}
	return e, true
}

// openRel opens the directory rel below root one name at a time, never
// following a link.
func openRel(root *safefs.Dir, rel string) (*safefs.Dir, error) {
	cur := root
	for name := range strings.SplitSeq(rel, "/") {
		if name == "" {
			continue
		}
		next, err := cur.Sub(name)
		if cur != root {
			cur.Close()
		}
		if err != nil {
			return nil, err
		}
		cur = next
	}
	if cur == root {
		// The caller closes what it gets: give it its own handle.
		return root.Sub(".")
	}
	return cur, nil
}

// text renders the listing for the model.
func (o *listing) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s, depth %d)\n", o.Path, plural(len(o.Entries), "entry", "entries"), o.Depth)
	if len(o.Entries) == 0 {
		b.WriteString("(empty directory)\n")
	}
	for _, e := range o.Entries {
		switch e.Type {
		case "dir":
			b.WriteString(e.Path + "/")
		case "file":
			fmt.Fprintf(&b, "%s  %s", e.Path, humanSize(e.Size))
		case "symlink":
			b.WriteString(e.Path + " -> " + e.Target)
		default:
			fmt.Fprintf(&b, "%s  [%s]", e.Path, e.Kind)
		}
		if e.Error != "" {
			b.WriteString("  [unreadable: " + e.Error + "]")
		}
		b.WriteByte('\n')
	}
	var notes []string
	if o.Truncated {
		notes = append(notes, fmt.Sprintf("Stopped at %d entries; at least %d more not shown. List a subdirectory, or give a smaller depth.", listMaxEntries, o.Unlisted))
	}
	if o.Unexpanded > 0 {
		notes = append(notes, fmt.Sprintf("%s at depth %d not expanded; list one of them, or give a larger depth (at most %d).", plural(o.Unexpanded, "directory", "directories"), o.Depth, listMaxDepth))
	}
	if o.Hidden > 0 {
		notes = append(notes, plural(o.Hidden, "entry hidden: the host policy does not let the tools read it, or it is the agent's own.",
			"entries hidden: the host policy does not let the tools read them, or they are the agent's own."))
	}
	for _, c := range o.Crowded {
		notes = append(notes, fmt.Sprintf("%s has more than %d entries; only %d of them were considered. Use bash to look at it.", c, dirReadMax, dirReadMax))
	}
	if len(notes) > 0 {
		b.WriteString("\n[" + strings.Join(notes, "]\n[") + "]\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// comparePaths orders "/"-separated paths name by name, so that a
// directory's entries follow it directly.
func comparePaths(x, y string) int {
	for {
		xn, xrest, xmore := strings.Cut(x, "/")
		yn, yrest, ymore := strings.Cut(y, "/")
		if c := strings.Compare(xn, yn); c != 0 {
			return c
		}
		switch {
		case !xmore && !ymore:
			return 0
		case !xmore:
			return -1
		case !ymore:
			return 1
		}
		x, y = xrest, yrest
	}
}

func relOrDot(rel string) string {
	if rel == "" {
		return "."
	}
	return filepath.FromSlash(rel)
}

// plural counts n things.
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
