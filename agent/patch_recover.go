package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
)

// This file recovers the journals of commits a dead process left
// behind; patch_journal.go says what a journal is and why recovery rolls
// back or finishes.

// recover finishes or rolls back every commit whose journal no live
// commit holds. Problems are logged; a journal that cannot be followed
// is set aside.
func (j *patchJournals) recover() {
	j.mu.Lock()
	defer j.mu.Unlock()
	d, err := os.Open(j.dir)
	if err != nil {
		j.log.Error("patch journals not recovered: cannot read their directory", "dir", j.dir, "err", err)
		return
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		j.log.Error("patch journals not recovered: cannot read their directory", "dir", j.dir, "err", err)
		return
	}
	for _, name := range names {
		if id, suffix, ok := journalFile(name); ok {
			j.recoverFile(name, id, suffix)
		}
	}
}

// recoverFile recovers the journal file name, unless a live commit holds
// it.
func (j *patchJournals) recoverFile(name, id, suffix string) {
	p := filepath.Join(j.dir, name)
	j.opening.Lock()
	f, err := os.OpenFile(p, os.O_RDONLY|safefs.NoFollow|syscall.O_NONBLOCK, 0)
	var locked bool
	if err == nil {
		locked, err = safefs.LockNB(f)
	}
	j.opening.Unlock()
	if f == nil {
		if !errors.Is(err, fs.ErrNotExist) {
			j.setAside(name, fmt.Errorf("open: %w", err))
		}
		return
	}
	defer f.Close()
	if !locked {
		if err != nil {
			j.log.Error("patch journal not recovered: cannot lock it", "journal", p, "err", err)
		}
		return // a commit in progress
	}
	// The lock is ours: the commit that wrote the file is over. It may
	// have ended between the open and the lock, renaming or removing the
	// file; only a file still under its name is recovered.
	fi, err := f.Stat()
	cur, cerr := os.Lstat(p)
	if err != nil || cerr != nil || !os.SameFile(fi, cur) {
		return
	}
	if !fi.Mode().IsRegular() {
		j.setAside(name, errors.New("not a regular file"))
		return
	}
	if suffix == journalWriting {
		// Written only in part: nothing was done after it.
		_ = os.Remove(p)
		return
	}
	data, err := readJournal(f)
	if err != nil {
		j.setAside(name, fmt.Errorf("read: %w", err))
		return
	}
	rec, err := parseJournal(data)
	if err == nil && rec.ID != id {
		err = fmt.Errorf("journal ID %s does not match its file name", rec.ID)
	}
	if err == nil {
		err = j.check(rec)
	}
	if err != nil {
		j.setAside(name, err)
		return
	}
	j.replay(p, name, rec, suffix == journalCommitted)
}

// check refuses a journal naming a file the tools may not write, as the
// host policy and the agent's own files decide now.
func (j *patchJournals) check(rec *journalRecord) error {
	for _, e := range rec.Entries {
		paths := append([]string{e.path()}, e.Made...)
		for _, p := range paths {
			if err := j.guard.checkResolved(p, p, policy.Write); err != nil {
				return fmt.Errorf("journal names %s, which the tools may not write: %w", p, err)
			}
		}
	}
	return nil
}

// replay rolls back (or, committed, finishes) the commit of rec, whose
// journal is the file p, and removes p. A journal that could not be
// followed to the end is set aside.
func (j *patchJournals) replay(p, name string, rec *journalRecord, committed bool) {
	paths := make([]string, len(rec.Entries))
	for i, e := range rec.Entries {
		paths[i] = e.path()
	}
	unlock, err := j.lock(paths...)
	if err != nil {
		j.log.Error("patch journal not recovered now: its files are locked; it is retried later", "journal", p, "err", err)
		return
	}
	defer unlock()
	r := &replayer{rec: rec, dirs: map[string]*safefs.Dir{}}
	defer r.close()
	for k := range rec.Entries {
		i := k
		if !committed {
			i = len(rec.Entries) - 1 - k // undo in reverse order
		}
		if j.hook != nil {
			j.hook(i)
		}
		if committed {
			r.finish(i)
		} else {
			r.rollBack(i)
		}
	}
	r.sync()
	for _, c := range r.conflicts {
		j.log.Warn("patch recovery: a file changed since the agent stopped mid-patch; it is kept as found", "file", c, "journal", p)
	}
	if len(r.problems) > 0 {
		j.setAside(name, errors.New(strings.Join(r.problems, "; ")))
		return
	}
	if err := os.Remove(p); err != nil {
		j.log.Error("patch journal recovered but not removed", "journal", p, "err", err)
		return
	}
	safefs.SyncDir(j.dir)
	what := "rolled back (the agent stopped before it finished; every file is as before the patch)"
	if committed {
		what = "finished (the agent stopped after every file had its new content)"
	}
	j.log.Warn("patch journal recovered: an interrupted patch was "+what, "files", len(rec.Entries), "journal", p)
}

// setAside renames a journal that cannot be followed out of the way, so
// it is kept for an operator and never acted on.
func (j *patchJournals) setAside(name string, why error) {
	p := filepath.Join(j.dir, name)
	if err := os.Rename(p, p+journalBad); err != nil {
		j.log.Error("patch journal refused and cannot be set aside", "journal", p, "why", why, "err", err)
		return
	}
	j.log.Error("patch journal refused and set aside; the files it names may keep hidden .tmp-/.orig- files of an interrupted patch: check them by hand",
		"journal", p+journalBad, "why", why)
}

// replayer does the file work of one recovery.
type replayer struct {
	rec       *journalRecord
	dirs      map[string]*safefs.Dir // nil: the directory does not exist
	problems  []string               // what could not be done
	conflicts []string               // files changed by someone else
}

func (r *replayer) close() {
	for _, d := range r.dirs {
		if d != nil {
			d.Close()
		}
	}
}

func (r *replayer) sync() {
	for _, d := range r.dirs {
		if d != nil {
			d.Sync()
		}
	}
}

func (r *replayer) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// dir opens dir without following links; nil when it does not exist.
func (r *replayer) dir(dir string) (*safefs.Dir, bool) {
	if d, ok := r.dirs[dir]; ok {
		return d, true
	}
	d, err := safefs.OpenDir(dir, false)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		d = nil
	case err != nil:
		r.problem("%s", safefs.Problem(dir, err))
		return nil, false
	}
	r.dirs[dir] = d
	return d, true
}

// rollBack puts entry i's file back as it was before the commit.
func (r *replayer) rollBack(i int) {
	e := &r.rec.Entries[i]
	d, ok := r.dir(e.Dir)
	if !ok {
		return
	}
	if d == nil {
		// Nothing was made in it, or someone removed it since.
		if e.Action != actCreate {
			r.conflicts = append(r.conflicts, e.Dir+" (the directory is gone)")
		}
		r.removeMade(e)
		return
	}
	target, err := hashAt(d, e.Name)
	if err != nil {
		r.problem("%s", safefs.Problem(e.path(), err))
		return
	}
	switch {
	case e.Action == actCreate && !target.exists,
		e.Action != actCreate && target.sum == e.Old:
		// Not changed, or put back already.
	case e.Action == actCreate && target.sum == e.New:
		if err := d.Remove(e.Name, false); err != nil {
			r.problem("remove %s: %s", e.path(), safefs.Problem(e.path(), err))
		}
	case e.Action == actModify && target.sum == e.New, e.Action == actDelete && !target.exists:
		r.restore(d, e, i, target.exists)
	default:
		r.conflicts = append(r.conflicts, e.path())
	}
	r.removeHidden(d, r.rec.staged(i))
	r.removeHidden(d, r.rec.backup(i))
	r.removeMade(e)
}

// restore renames entry i's backup back to its name.
func (r *replayer) restore(d *safefs.Dir, e *journalEntry, i int, replace bool) {
	bak := r.rec.backup(i)
	b, err := hashAt(d, bak)
	if err != nil || b.sum != e.Old {
		r.problem("%s cannot be put back: its old content (%s) is missing or changed", e.path(), filepath.Join(e.Dir, bak))
		return
	}
	if replace {
		err = d.Rename(bak, e.Name)
	} else {
		err = d.RenameNew(bak, e.Name)
	}
	if err != nil {
		r.problem("put back %s: %s", e.path(), safefs.Problem(e.path(), err))
	}
}

// finish removes entry i's hidden files: the commit was complete.
func (r *replayer) finish(i int) {
	e := &r.rec.Entries[i]
	d, ok := r.dir(e.Dir)
	if !ok || d == nil {
		return
	}
	r.removeHidden(d, r.rec.staged(i))
	r.removeHidden(d, r.rec.backup(i))
}

// removeHidden removes a hidden file the commit made, if it is there.
// The name is the commit's own; anything but a regular file under it is
// left alone.
func (r *replayer) removeHidden(d *safefs.Dir, name string) {
	meta, err := d.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return
	case err != nil:
		r.problem("%s", safefs.Problem(filepath.Join(d.Path, name), err))
		return
	case !meta.Mode.IsRegular():
		r.problem("%s is not a regular file; left alone", filepath.Join(d.Path, name))
		return
	}
	if err := d.Remove(name, false); err != nil && !errors.Is(err, fs.ErrNotExist) {
		r.problem("remove %s: %s", filepath.Join(d.Path, name), safefs.Problem(filepath.Join(d.Path, name), err))
	}
}

// removeMade removes the directories a create made, innermost first,
// while they are empty.
func (r *replayer) removeMade(e *journalEntry) {
	for k := len(e.Made) - 1; k >= 0; k-- {
		m := e.Made[k]
		parent, err := safefs.OpenDir(filepath.Dir(m), false)
		if err != nil {
			continue
		}
		err = parent.Remove(filepath.Base(m), true)
		parent.Sync()
		parent.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return // not empty: it holds someone's files
		}
		if d := r.dirs[m]; d != nil {
			d.Close()
		}
		delete(r.dirs, m)
	}
}

// fileState is what a name holds.
type fileState struct {
	exists bool
	sum    string // the SHA-256 of a regular file's content; "" for anything else
}

// hashAt describes name in d, reached without following a link.
func hashAt(d *safefs.Dir, name string) (fileState, error) {
	meta, err := d.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fileState{}, nil
	case err != nil:
		return fileState{}, err
	case !meta.Mode.IsRegular():
		return fileState{exists: true}, nil
	}
	f, err := d.OpenRead(name)
	if err != nil {
		return fileState{}, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !safefs.OpenedRegular(fi) {
		return fileState{exists: true}, err
	}
	sum, err := hashReader(context.Background(), f)
	if err != nil {
		return fileState{}, err
	}
	return fileState{exists: true, sum: sum}, nil
}
