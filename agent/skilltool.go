package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// maxSkillFiles bounds the bundled files the skill tool lists.
const maxSkillFiles = 500

// skill returns a skill's SKILL.md, whole, followed by its folder's
// absolute path and the paths of the files bundled with it.
func (t *toolbox) skill(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.SkillArgs
	if r := decodeArgs(tc, protocol.ToolSkill, &a); r != nil {
		return r
	}
	c := t.skills
	s, ok := c.lookup(a.Name)
	switch {
	case a.Name == "":
		return toolFailure(tc, "name is empty; give the name of a skill (skills here: %s)", c.names())
	case !ok:
		return toolFailure(tc, "no skill %s on host %s; skills here: %s", a.Name, c.hostName(), c.names())
	case c.isFleet(s.Name):
		return t.fleetSkill(tc, s)
	case s.Problem != "":
		return toolFailure(tc, "skill %s on host %s is invalid: %s (%s)", s.Name, c.hostName(), s.Problem, s.Path)
	}
	// One version answers: a skill the fleet installed is read from the
	// version its link serves now, even if a rollout swaps it meanwhile.
	dir := c.folder(s.Name)
	path := filepath.Join(dir, skillFile)
	data, err := t.guard.readSkillFile(path)
	if isDenied(err) {
		return deniedResult(tc, err)
	}
	if err != nil {
		return toolFailure(tc, "skill %s on host %s: %s", s.Name, c.hostName(), skillProblem(path, err))
	}
	files, more, err := t.skillFiles(ctx, dir)
	switch {
	case ctx.Err() != nil:
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "skill "+s.Name+": cancelled")
	case isDenied(err):
		return deniedResult(tc, err)
	case err != nil:
		return toolFailure(tc, "skill %s: list its files: %s", s.Name, safefs.Problem(dir, err))
	}
	return toolText(tc, skillText(s.Name, dir, data, files, more))
}

// fleetSkill answers for a skill the fleet installed: from the version its
// link serves now, once every file of that version matches the signed
// manifest, and with the SKILL.md whose bytes are served checked against
// its digest (so that a change made after the check is not served
// either). The bundled files are the manifest's.
func (t *toolbox) fleetSkill(tc *toolCall, s protocol.Skill) *protocol.Result {
	c := t.skills
	dir := c.folder(s.Name)
	var m *protocol.Manifest
	err := errNotRecorded
	if dir != "" {
		dir, m, err = c.checkFleet(s.Name, dir)
	}
	if errors.Is(err, errNotRecorded) {
		return toolFailure(tc, "skill %s on host %s is being installed or repaired by a fleet rollout; try again in a moment", s.Name, c.hostName())
	}
	if err != nil {
		return tamperedResult(tc, c.hostName(), err)
	}
	path := filepath.Join(dir, skillFile)
	data, err := t.guard.readSkillFile(path)
	if isDenied(err) {
		return deniedResult(tc, err)
	}
	if err != nil {
		return toolFailure(tc, "skill %s on host %s: %s", s.Name, c.hostName(), skillProblem(path, err))
	}
	var files []string
	for _, f := range m.Files {
		switch {
		case f.Path == skillFile:
			if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f.SHA256 {
				err := &tamperedError{name: s.Name, bundle: m.BundleID(), err: fmt.Errorf("%s changed while it was read", skillFile)}
				if c.onTampered != nil {
					c.onTampered(s.Name, m.BundleID(), err.err)
				}
				return tamperedResult(tc, c.hostName(), err)
			}
		case len(files) < maxSkillFiles:
			files = append(files, f.Path)
		}
	}
	if s.Problem != "" {
		return toolFailure(tc, "skill %s on host %s is invalid: %s (%s)", s.Name, c.hostName(), s.Problem, s.Path)
	}
	return toolText(tc, skillText(s.Name, dir, data, files, len(m.Files) > maxSkillFiles+1))
}

// tamperedResult refuses a fleet skill whose files differ from its
// signed manifest.
func tamperedResult(tc *toolCall, host string, err error) *protocol.Result {
	return toolFailure(tc, "refused on host %s: %v. It is not served until the agent installs it again from the fleet's store, "+
		"which it does at its next check of the desired skills; the rollout status shows it as tampered meanwhile", host, err)
}

// skillText lays out the skill tool's answer.
func skillText(name, dir string, data []byte, files []string, more bool) string {
	var b strings.Builder
	b.Write(data)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "\n[skill %s: folder %s]\n", name, dir)
	if len(files) == 0 {
		b.WriteString("Bundled files: none\n")
		return b.String()
	}
	b.WriteString("Bundled files (paths relative to the folder; read them with the read tool):\n")
	for _, f := range files {
		b.WriteString(f)
		b.WriteByte('\n')
	}
	if more {
		fmt.Fprintf(&b, "[more files not listed: the list stops at %d]\n", maxSkillFiles)
	}
	return b.String()
}

const (
	// maxSkillEntries bounds the entries the skill tool looks at to list
	// a skill's files.
	maxSkillEntries = 20 * maxSkillFiles
	// maxSkillDepth bounds how deep it looks.
	maxSkillDepth = 16
)

// skillFiles returns the slash-separated paths, relative to dir, of the
// files under dir other than its SKILL.md that the read tool would read,
// sorted: at most maxSkillFiles of them, and whether there are more.
// Regular files count, and links that lead to one; the host policy must
// let the tools read each (and where its links lead). Links to folders
// are not followed, and folders that cannot be read are skipped.
func (t *toolbox) skillFiles(ctx context.Context, dir string) (files []string, more bool, err error) {
	target, err := t.guard.checkPath(dir, policy.Read)
	if err != nil {
		return nil, false, err
	}
	root, err := safefs.OpenDir(target, false)
	if err != nil {
		return nil, false, err
	}
	defer root.Close()
	w := &skillWalk{ctx: ctx, g: t.guard, dir: dir, target: target}
	if err := w.visit(root, "", 0); err != nil {
		return nil, false, err
	}
	slices.Sort(w.files)
	return w.files, w.full, ctx.Err()
}

// skillWalk lists one skill's files.
type skillWalk struct {
	ctx         context.Context
	g           *guard
	dir, target string // the skill's folder, as given and resolved
	files       []string
	entries     int
	full        bool // the list stopped at a bound
}

// visit adds the files below d, the folder at rel, level levels down.
func (w *skillWalk) visit(d *safefs.Dir, rel string, level int) error {
	names, _, err := d.ReadNames(maxSkillEntries)
	if err != nil {
		if rel == "" {
			return err
		}
		return nil // an unreadable folder is skipped
	}
	slices.Sort(names)
	for _, name := range names {
		if w.full || w.ctx.Err() != nil {
			return nil
		}
		if w.entries++; w.entries > maxSkillEntries {
			w.full = true
			return nil
		}
		r := relJoin(rel, name)
		if r == skillFile {
			continue
		}
		meta, err := d.Lstat(name)
		if err != nil {
			continue
		}
		given, resolved := under(w.dir, r), under(w.target, r)
		switch {
		case meta.Mode.IsRegular():
			if w.g.checkResolved(given, resolved, policy.Read) == nil {
				w.add(r)
			}
		case meta.Mode.IsDir():
			if level+1 >= maxSkillDepth || w.g.checkResolved(given, resolved, policy.Read) != nil {
				continue
			}
			if sub, err := d.Sub(name); err == nil {
				err = w.visit(sub, r, level+1)
				sub.Close()
				if err != nil {
					return err
				}
			}
		case meta.Mode&fs.ModeSymlink != 0:
			if w.linkToFile(given, resolved) {
				w.add(r)
			}
		}
	}
	return nil
}

// linkToFile reports whether the link given (resolved in its folder)
// leads to a regular file the tools may read.
func (w *skillWalk) linkToFile(given, resolved string) bool {
	dest, err := safefs.RealPath(resolved)
	if err != nil || w.g.checkResolved(given, dest, policy.Read) != nil {
		return false
	}
	d, meta, err := entryMeta(dest)
	if err != nil {
		return false
	}
	d.Close()
	return meta.Mode.IsRegular()
}

func (w *skillWalk) add(rel string) {
	if len(w.files) == maxSkillFiles {
		w.full = true
		return
	}
	w.files = append(w.files, rel)
}

// names lists the catalog's skills for a message.
func (c *catalog) names() string {
	skills := c.list()
	if len(skills) == 0 {
		return "(none)"
	}
	names := make([]string, len(skills))
	for i, s := range skills {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

// hostName names the catalog's host for a message.
func (c *catalog) hostName() string {
	if c == nil || c.host == "" {
		return "(this host)"
	}
	return c.host
}
