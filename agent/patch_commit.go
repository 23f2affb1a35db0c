package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// This file writes a patch that applied in memory to the tree, all of it
// or none: every new content is first written to a temporary file in
// its directory; then the new files are renamed in one after another
// and, last, the deleted files removed. Each replaced or removed file is
// first given a hidden second name (a hard link), so a failure midway
// can put every file back as it was by renaming; where the file system
// has no hard links the old content is restored from memory.

// commitStep is the change to one file.
type commitStep struct {
	pt       *patchTarget
	d        *dirHandle
	name     string
	tmp      string    // the staged new content; "" for a deletion
	meta     *fileMeta // the file replaced or removed
	backup   string    // its hidden second name; "" when there is none
	madeDirs []string  // directories made for a new file, outermost first
	done     bool
}

// commitError is a commit that failed; unrestored lists the files left
// with the patch's version because putting them back failed too.
type commitError struct {
	msg        string
	unrestored []string
}

func (e *commitError) Error() string { return e.msg }

// commitPatch writes the targets' new contents. On failure the tree is
// as it was, or the *commitError says which files could not be
// restored.
func commitPatch(targets []*patchTarget, hooks *patchHooks) error {
	var writes, deletes []*commitStep
	defer func() {
		for _, s := range append(writes, deletes...) {
			s.d.Close()
		}
	}()
	for _, pt := range targets {
		if pt.action() == "unchanged" {
			continue
		}
		s, err := prepareStep(pt)
		if err != nil {
			discard(append(writes, deletes...))
			return &commitError{msg: "the patch was not applied; nothing was changed: " + err.Error()}
		}
		if pt.exists {
			writes = append(writes, s)
		} else {
			deletes = append(deletes, s)
		}
	}
	steps := append(writes, deletes...)
	for i, s := range steps {
		if hooks != nil && hooks.before != nil {
			hooks.before(i, s.pt.path)
		}
		if err := s.run(); err != nil {
			return rollback(steps, err)
		}
		s.done = true
	}
	for _, s := range steps {
		if s.backup != "" {
			_ = s.d.remove(s.backup, false)
		}
		s.d.sync()
	}
	return nil
}

// prepareStep opens the file's directory (making it for a new file),
// checks the file is still what was read, and stages its new content.
func prepareStep(pt *patchTarget) (*commitStep, error) {
	dir := filepath.Dir(pt.target)
	s := &commitStep{pt: pt, name: filepath.Base(pt.target)}
	if !pt.existed {
		s.madeDirs = missingDirs(dir)
	}
	d, err := openDir(dir, !pt.existed)
	if err != nil {
		removeDirs(s.madeDirs)
		return nil, errors.New(fsProblem(dir, err))
	}
	s.d = d
	meta, err := d.lstat(s.name)
	switch {
	case !pt.existed && err == nil:
		err = fmt.Errorf("%s appeared while the patch was being applied", pt.path)
	case !pt.existed && errors.Is(err, fs.ErrNotExist):
		err = nil
		meta = &fileMeta{mode: 0o644, uid: os.Geteuid(), gid: os.Getegid()}
		if pt.mode != 0 {
			meta.mode = pt.mode
		}
	case err != nil:
		err = errors.New(fsProblem(pt.path, err))
	case !meta.mode.IsRegular():
		err = fmt.Errorf("%s changed while the patch was being applied: it is no longer a regular file", pt.path)
	}
	if err == nil && pt.exists {
		s.tmp, err = d.stage(s.name, []byte(pt.data), meta)
	}
	if err != nil {
		d.Close()
		removeDirs(s.madeDirs)
		return nil, err
	}
	if pt.existed {
		s.meta = meta
	}
	return s, nil
}

// run makes the step's change: a new file is renamed in without
// replacing anything, a changed file replaces the old one (kept under
// a hidden name), a deleted file is removed (likewise kept).
func (s *commitStep) run() error {
	if !s.pt.existed {
		if err := s.d.linkNew(s.tmp, s.name); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create %s: %s appeared while the patch was being applied", s.pt.path, s.pt.path)
			}
			return fmt.Errorf("create %s: %s", s.pt.path, fsProblem(s.pt.path, err))
		}
		s.tmp = ""
		return nil
	}
	if b, err := s.d.linkAside(s.name); err == nil {
		s.backup = b
	}
	var err error
	if s.pt.exists {
		err = s.d.rename(s.tmp, s.name)
		if err == nil {
			s.tmp = ""
		}
	} else {
		err = s.d.remove(s.name, false)
	}
	if err != nil {
		if s.backup != "" {
			_ = s.d.remove(s.backup, false)
			s.backup = ""
		}
		verb := "replace"
		if !s.pt.exists {
			verb = "remove"
		}
		return fmt.Errorf("%s %s: %s", verb, s.pt.path, fsProblem(s.pt.path, err))
	}
	return nil
}

// undo puts the step's file back as it was.
func (s *commitStep) undo() error {
	switch {
	case !s.pt.existed:
		err := s.d.remove(s.name, false)
		removeDirs(s.madeDirs)
		return err
	case s.backup != "":
		if err := s.d.rename(s.backup, s.name); err != nil {
			return err
		}
		s.backup = ""
		return nil
	}
	return s.d.replace(s.name, []byte(s.pt.old), s.meta)
}

// rollback undoes the steps done before failed, removes what was staged
// and reports err and the outcome.
func rollback(steps []*commitStep, err error) error {
	var lost, paths []string
	for i := len(steps) - 1; i >= 0; i-- {
		s := steps[i]
		if !s.done {
			continue
		}
		if uerr := s.undo(); uerr != nil {
			msg := fmt.Sprintf("%s (%s): it has the patch's version", s.pt.path, fsProblem(s.pt.path, uerr))
			if s.backup != "" {
				msg += ", its old content is in " + filepath.Join(s.d.path, s.backup)
			}
			lost = append(lost, msg)
			paths = append(paths, s.pt.path)
		}
	}
	discard(steps)
	if len(lost) == 0 {
		return &commitError{msg: fmt.Sprintf("the patch was not applied: %v; every file was put back as it was, nothing was changed", err)}
	}
	return &commitError{
		msg: fmt.Sprintf("the patch was not applied: %v; putting the files back failed for %s; every other file is as it was. Check them and repair by hand",
			err, strings.Join(lost, "; ")),
		unrestored: paths,
	}
}

// discard removes staged files, backups not needed and directories
// made for new files that were not created.
func discard(steps []*commitStep) {
	for _, s := range steps {
		if s.tmp != "" {
			_ = s.d.remove(s.tmp, false)
			s.tmp = ""
		}
		if s.backup != "" && !s.done {
			_ = s.d.remove(s.backup, false)
			s.backup = ""
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if !steps[i].done {
			removeDirs(steps[i].madeDirs)
		}
	}
}

// missingDirs lists the directories that do not exist on the way to
// dir, outermost first.
func missingDirs(dir string) []string {
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
			break
		}
		missing = append([]string{d}, missing...)
	}
	return missing
}

// removeDirs removes the directories of dirs that are empty, innermost
// first.
func removeDirs(dirs []string) {
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			return
		}
	}
}
