package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file has what the tools that act on directory entries themselves
// (delete, move) and on whole trees (list, search, recursive delete,
// directory move) share: the check of a path whose last element is not
// followed, the refusal of trees that hold the agent's own files, and a
// bounded walk that never follows a link.

const (
	// treeMaxEntries bounds the entries a recursive delete or a directory
	// move checks; beyond it the call is refused before anything changes.
	treeMaxEntries = protocol.TreeMaxEntries
	// treeMaxDepth bounds how deep the walks descend. Each level holds an
	// open directory.
	treeMaxDepth = 128
	// dirReadMax bounds the names list and search read from one
	// directory.
	dirReadMax = 100_000
)

// checkLink resolves given, an absolute clean path, for a tool that acts
// on the entry itself (delete, move): the links in its parent are
// followed, its last element is not, so a symbolic link is deleted or
// moved, not what it points to. It returns the resolved path if the tools
// may do every one of ops with it.
func (g *guard) checkLink(given string, ops ...policy.Op) (string, error) {
	if isRoot(given) {
		return "", fmt.Errorf("%s is the root directory; no tool deletes or moves it", given)
	}
	parent, err := safefs.RealPath(filepath.Dir(given))
	if err != nil {
		return "", err
	}
	name, err := safefs.RealName(parent, filepath.Base(given))
	if err != nil {
		return "", err
	}
	resolved := filepath.Join(parent, name)
	if err := g.checkResolved(given, resolved, ops...); err != nil {
		return "", err
	}
	return resolved, nil
}

// checkNoOwnInside refuses a tree that holds one of the agent's own files
// or directories: deleting or moving it would take them along.
func (g *guard) checkNoOwnInside(verb, given, resolved string) error {
	for _, o := range g.own {
		for _, p := range []string{given, resolved} {
			if within(o.path, p) {
				return &ownError{fmt.Sprintf("denied: %s %s: it holds %s, which belongs to the agent (%s); no tool may %s it, whatever the host policy says",
					verb, given, o.path, o.what, verb)}
			}
		}
	}
	return nil
}

// checkedLink is checkedPath for tools that act on the entry itself (see
// guard.checkLink).
func (t *toolbox) checkedLink(tc *toolCall, raw string, ops ...policy.Op) (path, target string, r *protocol.Result) {
	path, err := t.resolve(raw)
	if err != nil {
		return "", "", toolFailure(tc, "%v", err)
	}
	if target, err = t.guard.checkLink(path, ops...); err != nil {
		return "", "", pathFailure(tc, path, err)
	}
	return path, target, nil
}

// refuseTree refuses to delete or move (verb) the tree at path (resolved
// to target) when it holds the agent's own files or its working
// directory.
func (t *toolbox) refuseTree(tc *toolCall, verb, path, target string) *protocol.Result {
	if err := t.guard.checkNoOwnInside(verb, path, target); err != nil {
		return deniedResult(tc, err)
	}
	cwds := []string{t.cfg.Cwd}
	if real, err := safefs.RealPath(t.cfg.Cwd); err == nil {
		cwds = append(cwds, real)
	}
	for _, cwd := range cwds {
		if within(cwd, path) || within(cwd, target) {
			return toolFailure(tc, "%s is the agent's working directory or holds it (%s): relative paths and bash depend on it, so %s refuses to %s it", path, cwd, verb, verb)
		}
	}
	return nil
}

// entryMeta opens the directory that holds target and describes target
// without following a link. The caller closes the directory.
func entryMeta(target string) (*safefs.Dir, *safefs.Meta, error) {
	d, err := safefs.OpenDir(filepath.Dir(target), false)
	if err != nil {
		return nil, nil, err
	}
	meta, err := d.Lstat(filepath.Base(target))
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return d, meta, nil
}

// typeName names the type of an entry for messages and listings.
func typeName(mode fs.FileMode) string {
	switch {
	case mode.IsRegular():
		return "file"
	case mode.IsDir():
		return "directory"
	case mode&fs.ModeSymlink != 0:
		return "symbolic link"
	case mode&fs.ModeNamedPipe != 0:
		return "named pipe"
	case mode&fs.ModeSocket != 0:
		return "socket"
	case mode&fs.ModeCharDevice != 0:
		return "character device"
	case mode&fs.ModeDevice != 0:
		return "block device"
	}
	return "special file"
}

// treeWalk visits every entry below one directory depth-first without
// following links, within the bounds above, and refuses to cross into
// another file system. check is called for each entry with its path
// relative to the top; an error from it ends the walk.
type treeWalk struct {
	ctx     context.Context
	top     string // for messages
	dev     uint64 // the top directory's file system
	entries int
	check   func(rel string, meta *safefs.Meta) error
}

// treeLimit is a tree that is too large or too deep for a walk, or
// crosses into another file system.
type treeLimit struct{ msg, advice string }

func (e *treeLimit) Error() string { return e.msg }

// enter checks a subdirectory before the walk descends into it.
func (w *treeWalk) enter(rel string, meta *safefs.Meta, level int) error {
	switch {
	case meta.Dev != w.dev:
		return &treeLimit{fmt.Sprintf("%s is a mount point (another file system)", under(w.top, rel)), "Unmount it first, or work below it."}
	case level >= treeMaxDepth:
		return &treeLimit{fmt.Sprintf("%s is nested more than %d directories deep below %s", under(w.top, rel), treeMaxDepth, w.top), "Work on a deeper directory first."}
	}
	return nil
}

// count counts one more entry.
func (w *treeWalk) count() error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if w.entries++; w.entries > treeMaxEntries {
		return w.tooMany()
	}
	return nil
}

func (w *treeWalk) tooMany() error {
	return &treeLimit{fmt.Sprintf("%s holds more than %d entries", w.top, treeMaxEntries), "Work on its subdirectories one at a time."}
}

// visit checks every entry below d, the directory at rel (level levels
// below the top).
func (w *treeWalk) visit(d *safefs.Dir, rel string, level int) error {
	names, more, err := d.ReadNames(treeMaxEntries - w.entries + 1)
	if err != nil {
		return err
	}
	if more {
		return w.tooMany()
	}
	for _, name := range names {
		if err := w.count(); err != nil {
			return err
		}
		r := relJoin(rel, name)
		meta, err := d.Lstat(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone meanwhile
		}
		if err != nil {
			return err
		}
		if err := w.check(r, meta); err != nil {
			return err
		}
		if !meta.Mode.IsDir() {
			continue
		}
		if err := w.enter(r, meta, level+1); err != nil {
			return err
		}
		sub, err := d.Sub(name)
		if err != nil {
			return err
		}
		err = w.visit(sub, r, level+1)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// removeAll deletes everything below d, the directory at rel, deepest
// first, checking each entry again as it goes: an entry that appeared
// after the first walk and is refused stops the deletion. removed counts
// the entries deleted.
func (w *treeWalk) removeAll(d *safefs.Dir, rel string, level int, removed *int) error {
	for {
		names, _, err := d.ReadNames(1024)
		if err != nil || len(names) == 0 {
			return err
		}
		for _, name := range names {
			if err := w.count(); err != nil {
				return err
			}
			r := relJoin(rel, name)
			meta, err := d.Lstat(name)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if err := w.check(r, meta); err != nil {
				return err
			}
			if meta.Mode.IsDir() {
				if err := w.enter(r, meta, level+1); err != nil {
					return err
				}
				sub, err := d.Sub(name)
				if err != nil {
					return err
				}
				err = w.removeAll(sub, r, level+1, removed)
				sub.Close()
				if err != nil {
					return err
				}
			}
			if err := d.Remove(name, meta.Mode.IsDir()); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			*removed++
		}
	}
}

// relJoin joins a relative path and a name with "/".
func relJoin(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// under returns the path rel below top ("" is top itself).
func under(top, rel string) string {
	if rel == "" {
		return top
	}
	return filepath.Join(top, filepath.FromSlash(rel))
}

// treeFailure is the result of a tree walk below path that stopped with
// err; outcome says what was changed, such as "nothing was deleted".
func treeFailure(tc *toolCall, path string, err error, outcome string) *protocol.Result {
	var lim *treeLimit
	var pe *fs.PathError
	switch {
	case isDenied(err):
		return protocol.ErrorResult(tc.ID, protocol.CodeDenied, err.Error()+"; "+outcome)
	case errors.As(err, &lim):
		return toolFailure(tc, "%s; %s. %s", lim.msg, outcome, lim.advice)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, path+": cancelled; "+outcome)
	case errors.As(err, &pe):
		return toolFailure(tc, "%s; %s", safefs.Problem(pe.Path, err), outcome)
	}
	return toolFailure(tc, "%s: %v; %s", path, err, outcome)
}
