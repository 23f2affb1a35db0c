package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
	"github.com/fleetmcp/fleetmcp/protocol/skillmd"
)

// Limits of the Agent Skills format, and of what the agent reads.
const (
	skillFile = "SKILL.md"
	// maxSkillFileSize bounds a SKILL.md: larger ones are listed with a
	// problem rather than read.
	maxSkillFileSize = 1 << 20
)

// skillMeta is a SKILL.md's frontmatter.
type skillMeta = skillmd.Meta

// parseSkill parses the contents of a SKILL.md found in a folder called
// dir. It returns what it could read of the frontmatter and, for an
// invalid skill, an error saying why (the gateway checks bundles with the
// same parser).
func parseSkill(dir string, data []byte) (skillMeta, error) {
	return skillmd.Parse(dir, data)
}

// catalog is a host's skill catalog: the folders <root>/<name>/SKILL.md
// the host policy lets callers see. Reads use the last snapshot; watch
// rebuilds it when the folders change. It is safe for concurrent use.
//
// Skills are files like any other: a SKILL.md is read as the read tool
// reads files, through the guard, so a link out of the allowed paths, to
// the agent's own files or to a FIFO shows a problem in the catalog, never
// what the file holds.
type catalog struct {
	root  string // absolute
	host  string
	guard *guard // reads the files; its policy decides which skills show
	log   *slog.Logger
	snap  atomic.Pointer[skillSnapshot]
	// scanMu makes rescans one at a time, so that the last one stored
	// is the last one made (a reload rescans with the new policy).
	scanMu sync.Mutex

	// pollEvery is how often the folders are looked at when the system
	// cannot report changes, and how often a missing root is looked for.
	pollEvery time.Duration
	// debounce is how long watch waits after a change before it rebuilds,
	// so that a burst of changes costs one rebuild.
	debounce time.Duration
	// pollOnly makes watch poll even where the system reports changes.
	pollOnly bool
}

// skillSnapshot is the catalog at one moment.
type skillSnapshot struct {
	skills []protocol.Skill // sorted by name
}

// newCatalog returns the catalog of root, already scanned, whose files
// are read through g.
func newCatalog(root, host string, g *guard, log *slog.Logger) *catalog {
	c := &catalog{root: root, host: host, guard: g, log: log, pollEvery: 2 * time.Second, debounce: 100 * time.Millisecond}
	c.rescan()
	return c
}

// list returns the catalog's skills, sorted by name. The caller must not
// modify them.
func (c *catalog) list() []protocol.Skill {
	if c == nil {
		return nil
	}
	return c.snap.Load().skills
}

// lookup returns the skill called name.
func (c *catalog) lookup(name string) (protocol.Skill, bool) {
	skills := c.list()
	i, ok := slices.BinarySearchFunc(skills, name, func(s protocol.Skill, n string) int { return strings.Compare(s.Name, n) })
	if !ok {
		return protocol.Skill{}, false
	}
	return skills[i], true
}

// rescan rebuilds the snapshot and reports whether it changed.
func (c *catalog) rescan() bool {
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	skills := c.scan()
	if old := c.snap.Load(); old != nil && slices.Equal(old.skills, skills) {
		return false
	}
	c.snap.Store(&skillSnapshot{skills: skills})
	return true
}

// scan reads the skill folders under the root. A missing root is an
// empty catalog; folders without a SKILL.md and skills the policy denies
// are left out.
func (c *catalog) scan() []protocol.Skill {
	entries, err := os.ReadDir(c.root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("skills: cannot list the skills folder", "dir", c.root, "err", err)
		}
		return nil
	}
	var skills []protocol.Skill
	left := 0
	for _, e := range entries {
		name := e.Name()
		if name == fleetDir || !c.allows(name) {
			continue // .fleet holds the versions the fleet installed
		}
		dir := filepath.Join(c.root, name)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		if len(skills) == protocol.MaxSkills {
			left++
			continue
		}
		if len(name) > protocol.MaxSkillNameLen || len(dir)+len(skillFile)+1 > protocol.MaxPathLen {
			c.log.Warn("skills: leaving out a folder whose name or path is too long to announce", "folder", protocol.Excerpt(name))
			continue
		}
		s, ok := c.load(name, c.folder(name))
		if ok {
			skills = append(skills, s)
		}
	}
	if left > 0 {
		c.log.Warn("skills: the fleet protocol announces at most this many skills; the folders after them, by name, are left out",
			"max", protocol.MaxSkills, "left_out", left, "dir", c.root)
	}
	slices.SortFunc(skills, func(a, b protocol.Skill) int { return strings.Compare(a.Name, b.Name) })
	return skills
}

// allows reports whether the host policy shows the skill called name.
func (c *catalog) allows(name string) bool {
	return c.guard.pol.Load().AllowSkill(name)
}

// folder returns the folder the skill called name is read from: for a
// skill the fleet installed, the version its link serves (resolved once,
// so that one answer never mixes two versions); else <root>/<name>.
// Only a link of exactly the fleet's form is resolved here; any other
// link is followed, and checked, as the read tool follows links.
func (c *catalog) folder(name string) string {
	if v := managedFolder(c.root, name); v != "" {
		return v
	}
	return filepath.Join(c.root, name)
}

// load reads the SKILL.md of the skill called name from dir. It reports
// false when there is none. The skill's path is <root>/<name>/SKILL.md,
// through the fleet's link for a skill the fleet installed.
func (c *catalog) load(name, dir string) (protocol.Skill, bool) {
	path := filepath.Join(c.root, name, skillFile)
	s := protocol.Skill{Name: name, Path: path}
	data, err := c.guard.readSkillFile(filepath.Join(dir, skillFile))
	if errors.Is(err, os.ErrNotExist) {
		return s, false
	}
	if err != nil {
		s.Problem = protocol.Clip(skillProblem(path, err), protocol.MaxSkillProblemLen)
		return s, true
	}
	m, err := parseSkill(name, data)
	// A valid description fits; an invalid one is cut to what can be
	// announced, and its problem says why it is invalid.
	s.Description = protocol.Clip(strings.TrimSpace(m.Description), protocol.MaxSkillDescriptionLen)
	if err != nil {
		s.Problem = protocol.Clip(err.Error(), protocol.MaxSkillProblemLen)
	}
	return s, true
}

// skillProblem says why the SKILL.md at path cannot be read, for the
// catalog, which every caller who sees the host sees: a refusal names the
// rule, not where a link leads.
func skillProblem(path string, err error) string {
	var d *policy.Denial
	var o *ownError
	switch {
	case errors.As(err, &d):
		return fmt.Sprintf("%s is refused by the host policy (%s), as the read tool refuses it", skillFile, d.Rule)
	case errors.As(err, &o):
		return skillFile + " leads to the agent's own files, which no tool reads"
	case errors.As(err, new(problem)):
		return err.Error()
	}
	return fsProblem(path, err)
}

// readSkillFile reads the SKILL.md at path, an absolute clean path, as the
// read tool reads a file: path, and the file its links lead to, must pass
// the host policy for reading and not be the agent's own; the file is
// opened without following links (a link swapped in after the check makes
// the read fail), without waiting on a FIFO, and must be a regular file of
// at most maxSkillFileSize bytes.
func (g *guard) readSkillFile(path string) ([]byte, error) {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, err // a folder without a SKILL.md
	}
	target, err := g.checkPath(path, policy.Read)
	if err != nil {
		return nil, err
	}
	f, _, err := g.openRegular(path, target, "skills are read from regular files")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSkillFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", skillFile, err)
	}
	if len(data) > maxSkillFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", skillFile, maxSkillFileSize)
	}
	return data, nil
}
