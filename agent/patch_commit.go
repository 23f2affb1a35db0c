package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
)

// This file writes a patch that applied in memory to the tree, all of it
// or none, also across a crash of the agent (see patch_journal.go). The
// commit runs in phases:
//
//  1. it journals every file it will touch;
//  2. it stages every new content in a hidden file next to its target;
//  3. it gives every file it replaces or removes a hidden second name (a
//     hard link; a copy where the file system has no hard links);
//  4. it renames the new contents in and removes the deleted files;
//  5. it marks the journal committed;
//  6. it removes the backups and the journal.
//
// Nothing visible changes before phase 4, and a failure there puts every
// file back by renaming its backup over it. A crash before phase 5 is
// rolled back by recovery, one after it finished.

// commitStep is the change to one file.
type commitStep struct {
	pt       *patchTarget
	d        *safefs.Dir
	name     string
	action   string       // actModify, actCreate or actDelete
	tmp      string       // the staged new content while it exists
	backup   string       // the hidden second name of the old file while it exists
	meta     *safefs.Meta // the file replaced or removed
	madeDirs []string     // directories made for a new file, outermost first
	done     bool
	lost     bool // done, and putting it back failed
}

// commitError is a commit that failed; unrestored lists the files left
// with the patch's version because putting them back failed too.
type commitError struct {
	msg        string
	unrestored []string
	cause      error
}

func (e *commitError) Error() string { return e.msg }
func (e *commitError) Unwrap() error { return e.cause }

// commit is one patch being written.
type commit struct {
	steps   []*commitStep
	journal *liveJournal
	hooks   *patchHooks
}

// commitPatch writes the targets' new contents. On failure the tree is
// as it was, or the *commitError says which files could not be
// restored. A cancellation stops it only before any file changes.
func (t *toolbox) commitPatch(ctx context.Context, targets []*patchTarget, hooks *patchHooks) error {
	c := &commit{hooks: hooks}
	for _, pt := range targets {
		if a := pt.action(); a != "unchanged" {
			c.steps = append(c.steps, newStep(pt))
		}
	}
	// Writes first, deletions last, as before: a failed deletion is the
	// cheapest to undo.
	slices.SortStableFunc(c.steps, func(a, b *commitStep) int {
		return boolInt(a.action == actDelete) - boolInt(b.action == actDelete)
	})
	if len(c.steps) == 0 {
		return nil
	}
	rec, err := c.record(ctx)
	if err != nil {
		return nothingChanged(err)
	}
	c.journal, err = t.journals.begin(rec)
	if err != nil {
		return nothingChanged(err)
	}
	defer c.close()
	if err := c.prepare(ctx); err != nil {
		c.discard()
		return nothingChanged(err)
	}
	c.at("staged", -1)
	if err := c.makeBackups(ctx); err != nil {
		c.discard()
		return nothingChanged(err)
	}
	c.at("backed-up", -1)
	for i, s := range c.steps {
		c.at("rename", i)
		if hooks != nil && hooks.before != nil {
			hooks.before(i, s.pt.path)
		}
		if err := s.run(); err != nil {
			return c.rollback(err)
		}
		s.done = true
	}
	c.syncDirs()
	if err := c.journal.commit(); err != nil {
		return c.rollback(fmt.Errorf("record the commit in the journal: %w", err))
	}
	c.at("committed", -1)
	for _, s := range c.steps {
		s.removeBackup()
	}
	c.syncDirs()
	c.at("cleaned", -1)
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func nothingChanged(err error) error {
	return &commitError{msg: "the patch was not applied; nothing was changed: " + err.Error(), cause: err}
}

func newStep(pt *patchTarget) *commitStep {
	s := &commitStep{pt: pt, name: filepath.Base(pt.target)}
	switch {
	case !pt.existed:
		s.action = actCreate
		s.madeDirs = missingDirs(filepath.Dir(pt.target))
	case pt.exists:
		s.action = actModify
	default:
		s.action = actDelete
	}
	return s
}

// at runs the test hook for a point of the commit.
func (c *commit) at(point string, step int) {
	if c.hooks != nil && c.hooks.at != nil {
		c.hooks.at(point, step)
	}
}

// record returns the journal of the commit and names the steps' hidden
// files after it.
func (c *commit) record(ctx context.Context) (*journalRecord, error) {
	rec := &journalRecord{Version: journalVersion, ID: newJournalID(), Entries: make([]journalEntry, len(c.steps))}
	for i, s := range c.steps {
		if err := ctx.Err(); err != nil {
			return nil, errCancelled
		}
		e := journalEntry{Dir: filepath.Dir(s.pt.target), Name: s.name, Action: s.action, Made: s.madeDirs}
		if s.action != actCreate {
			e.Old = sha256Hex([]byte(s.pt.old))
		}
		if s.action != actDelete {
			e.New = s.pt.sum()
		}
		rec.Entries[i] = e
	}
	return rec, nil
}

// errCancelled is a call cancelled before it changed anything.
var errCancelled = errors.New("the call was cancelled")

// prepare opens each file's directory (making it for a new file), checks
// the file is still what was read, and stages its new content.
func (c *commit) prepare(ctx context.Context) error {
	for i, s := range c.steps {
		if ctx.Err() != nil {
			return errCancelled
		}
		if err := s.prepare(c.journal.rec.staged(i)); err != nil {
			return err
		}
	}
	return nil
}

func (s *commitStep) prepare(tmp string) error {
	pt := s.pt
	dir := filepath.Dir(pt.target)
	d, err := safefs.OpenDir(dir, s.action == actCreate)
	if err != nil {
		return errors.New(safefs.Problem(dir, err))
	}
	s.d = d
	meta, err := d.Lstat(s.name)
	switch {
	case s.action == actCreate && err == nil:
		return fmt.Errorf("%s appeared while the patch was being applied", pt.path)
	case s.action == actCreate && errors.Is(err, fs.ErrNotExist):
		meta = &safefs.Meta{Mode: 0o644, UID: os.Geteuid(), GID: os.Getegid()}
		if pt.mode != 0 {
			meta.Mode = pt.mode
		}
	case err != nil:
		return errors.New(safefs.Problem(pt.path, err))
	case !meta.Mode.IsRegular():
		return fmt.Errorf("%s changed while the patch was being applied: it is no longer a regular file", pt.path)
	default:
		s.meta = meta
	}
	if s.action == actDelete {
		return nil
	}
	if err := d.StageAs(tmp, []byte(pt.data), meta); err != nil {
		return fmt.Errorf("stage the new content of %s: %s", pt.path, safefs.Problem(filepath.Join(dir, tmp), err))
	}
	s.tmp = tmp
	return nil
}

// makeBackups gives every file the commit replaces or removes its hidden
// second name, and makes the names durable before anything changes.
func (c *commit) makeBackups(ctx context.Context) error {
	for i, s := range c.steps {
		if s.action == actCreate {
			continue
		}
		if ctx.Err() != nil {
			return errCancelled
		}
		name := c.journal.rec.backup(i)
		err := s.d.Link(s.name, name)
		if err != nil && safefs.NoHardLinks(err) {
			err = s.d.StageAs(name, []byte(s.pt.old), s.meta)
		}
		if err != nil {
			return fmt.Errorf("keep the old content of %s: %s", s.pt.path, safefs.Problem(s.pt.path, err))
		}
		s.backup = name
	}
	c.syncDirs()
	return nil
}

// run makes the step's change: a new file is renamed in without
// replacing anything, a changed file replaces the old one, a deleted
// file is removed.
func (s *commitStep) run() error {
	var err error
	switch s.action {
	case actCreate:
		if err = s.d.LinkNew(s.tmp, s.name); err == nil {
			s.tmp = ""
			return nil
		}
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create %s: %s appeared while the patch was being applied", s.pt.path, s.pt.path)
		}
		return fmt.Errorf("create %s: %s", s.pt.path, safefs.Problem(s.pt.path, err))
	case actModify:
		if err = s.d.Rename(s.tmp, s.name); err == nil {
			s.tmp = ""
			return nil
		}
		return fmt.Errorf("replace %s: %s", s.pt.path, safefs.Problem(s.pt.path, err))
	}
	if err = s.d.Remove(s.name, false); err != nil {
		return fmt.Errorf("remove %s: %s", s.pt.path, safefs.Problem(s.pt.path, err))
	}
	return nil
}

// undo puts the step's file back as it was.
func (s *commitStep) undo() error {
	switch s.action {
	case actCreate:
		err := s.d.Remove(s.name, false)
		removeDirs(s.madeDirs)
		return err
	case actModify:
		if err := s.d.Rename(s.backup, s.name); err != nil {
			return err
		}
	default:
		if err := s.d.RenameNew(s.backup, s.name); err != nil {
			return err
		}
	}
	s.backup = ""
	return nil
}

// rollback undoes the steps done, removes what was staged and reports
// err and the outcome.
func (c *commit) rollback(err error) error {
	var lost, paths []string
	for i := len(c.steps) - 1; i >= 0; i-- {
		s := c.steps[i]
		if !s.done {
			continue
		}
		if uerr := s.undo(); uerr != nil {
			s.lost = true
			msg := fmt.Sprintf("%s (%s): it has the patch's version", s.pt.path, safefs.Problem(s.pt.path, uerr))
			if s.backup != "" {
				msg += ", its old content is in " + filepath.Join(s.d.Path, s.backup)
			}
			lost = append(lost, msg)
			paths = append(paths, s.pt.path)
		}
	}
	c.discard()
	if len(lost) == 0 {
		return &commitError{msg: fmt.Sprintf("the patch was not applied: %v; every file was put back as it was, nothing was changed", err)}
	}
	return &commitError{
		msg: fmt.Sprintf("the patch was not applied: %v; putting the files back failed for %s; every other file is as it was. Check them and repair by hand",
			err, strings.Join(lost, "; ")),
		unrestored: paths,
	}
}

// discard removes staged files, the backups of files that were put back
// or never changed, and the directories made for new files that were
// not created.
func (c *commit) discard() {
	for _, s := range c.steps {
		if s.tmp != "" {
			_ = s.d.Remove(s.tmp, false)
			s.tmp = ""
		}
		if !s.lost {
			s.removeBackup()
		}
	}
	for i := len(c.steps) - 1; i >= 0; i-- {
		if s := c.steps[i]; !s.done && s.action == actCreate {
			removeDirs(s.madeDirs)
		}
	}
	c.syncDirs()
}

func (s *commitStep) removeBackup() {
	if s.backup != "" {
		_ = s.d.Remove(s.backup, false)
		s.backup = ""
	}
}

// syncDirs makes the renames in the steps' directories durable.
func (c *commit) syncDirs() {
	synced := map[string]bool{}
	for _, s := range c.steps {
		if s.d != nil && !synced[s.d.Path] {
			synced[s.d.Path] = true
			s.d.Sync()
		}
	}
}

// close ends the commit: its directories are closed and its journal
// deleted, whatever the outcome (the call's result reports it).
func (c *commit) close() {
	for _, s := range c.steps {
		if s.d != nil {
			s.d.Close()
		}
	}
	c.journal.end()
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
