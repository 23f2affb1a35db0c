package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
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

// catalog is a host's skill catalog: the skills the fleet installed
// (<fleet>/<name>, served only while their files match their signed
// manifests) and the host's own skills (<root>/<name>/SKILL.md), those
// the host policy lets callers see. A fleet skill hides a host skill of
// the same name: whoever may write in the host's skills folder must not
// be able to stand in for a skill the fleet rolled out. Reads use the
// last snapshot; watch rebuilds it when the host's folders change, and
// the rollout when it changes the fleet's. It is safe for concurrent use.
//
// Skills are files like any other: a SKILL.md is read as the read tool
// reads files, through the guard, so a link out of the allowed paths, to
// the agent's own files or to a FIFO shows a problem in the catalog, never
// what the file holds.
type catalog struct {
	root  string // absolute: the host's own skills
	host  string
	guard *guard // reads the files; its policy decides which skills show
	log   *slog.Logger
	// fleet is the layout of the skills the fleet installed; nil: none.
	fleet *skillStore
	// verified remembers the fleet skills' files that matched.
	verified *verifyCache
	// onTampered, when set, hears of every fleet skill found changed on
	// disk (the rollout reports it and repairs it). Set before use.
	onTampered func(name, bundle string, err error)
	snap       atomic.Pointer[skillSnapshot]
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
	fleet  map[string]bool  // the names the fleet installed
}

// newCatalog returns the catalog of the host's skills in root, already
// scanned, whose files are read through g.
func newCatalog(root, host string, g *guard, log *slog.Logger) *catalog {
	return newFleetCatalog(root, "", nil, host, g, log)
}

// newFleetCatalog is newCatalog with the fleet's skills in fleetRoot
// ("": none), each served only as the bundle installed records.
func newFleetCatalog(root, fleetRoot string, installed *installedRecord, host string, g *guard, log *slog.Logger) *catalog {
	c := &catalog{root: root, host: host, guard: g, log: log, verified: newVerifyCache(), pollEvery: 2 * time.Second, debounce: 100 * time.Millisecond}
	if fleetRoot != "" {
		c.fleet = &skillStore{root: fleetRoot, log: log, installed: installed}
	}
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

// isFleet reports whether the skill called name is one the fleet
// installed.
func (c *catalog) isFleet(name string) bool {
	return c != nil && c.snap.Load().fleet[name]
}

// rescan rebuilds the snapshot and reports whether it changed.
func (c *catalog) rescan() bool {
	c.scanMu.Lock()
	defer c.scanMu.Unlock()
	fleet := c.scanFleet()
	skills := slices.Clone(fleet)
	names := make(map[string]bool, len(fleet))
	for _, s := range fleet {
		names[s.Name] = true
	}
	for _, s := range c.scan() {
		if names[s.Name] {
			c.log.Debug("skills: a host skill has the name of a skill the fleet installed; the fleet's is served", "skill", s.Name)
			continue
		}
		skills = append(skills, s)
	}
	slices.SortFunc(skills, func(a, b protocol.Skill) int { return strings.Compare(a.Name, b.Name) })
	if len(skills) > protocol.MaxSkills {
		c.log.Warn("skills: the fleet protocol announces at most this many skills; the ones after them, by name, are left out",
			"max", protocol.MaxSkills, "left_out", len(skills)-protocol.MaxSkills)
		skills = skills[:protocol.MaxSkills]
	}
	if old := c.snap.Load(); old != nil && slices.Equal(old.skills, skills) && maps.Equal(old.fleet, names) {
		return false
	}
	c.snap.Store(&skillSnapshot{skills: skills, fleet: names})
	return true
}

// scanFleet reads the skills the fleet serves: each a managed link to a
// version folder, checked against its manifest (a mismatch is a problem,
// and reported).
func (c *catalog) scanFleet() []protocol.Skill {
	if c.fleet == nil {
		return nil
	}
	// The names an older agent installed in the host's skills folder
	// stay the fleet's until the rollout has moved them.
	names := c.fleet.managedNames()
	legacy := &skillStore{root: c.root}
	for _, name := range legacy.managedNames() {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	var skills []protocol.Skill
	for _, name := range names {
		if !c.allows(name) || len(skills) == protocol.MaxSkills {
			continue
		}
		path := filepath.Join(c.fleet.root, name, skillFile)
		dir := c.fleet.servedVersion(name)
		if dir == "" {
			// Being installed or repaired: the name stays the fleet's, so
			// that no host skill stands in for it meanwhile.
			if (c.fleet.claims(name) || legacy.claims(name)) && len(path) <= protocol.MaxPathLen {
				skills = append(skills, protocol.Skill{Name: name, Path: path, Problem: notServedYet})
			}
			continue
		}
		if len(path) > protocol.MaxPathLen {
			c.log.Warn("skills: leaving out a fleet skill whose path is too long to announce", "skill", name)
			continue
		}
		s := protocol.Skill{Name: name, Path: path}
		dir, _, err := c.checkFleet(name, dir)
		if errors.Is(err, errNotRecorded) {
			s.Problem = notServedYet
			skills = append(skills, s)
			continue
		}
		if err != nil {
			s.Problem = protocol.Clip(err.Error(), protocol.MaxSkillProblemLen)
			skills = append(skills, s)
			continue
		}
		if ls, ok := c.load(name, dir, path); ok {
			skills = append(skills, ls)
		}
	}
	return skills
}

// notServedYet is the problem of a fleet skill with no version served.
const notServedYet = "this skill is being installed or repaired by a fleet rollout; it is served once its files are in place and checked against the signed manifest"

// checkFleet checks the served version dir of fleet skill name against
// the bundle the agent installed and its manifest, and returns the
// folder checked and its manifest. A mismatch is a *tamperedError, also
// told to onTampered; a version the agent has no record of is
// errNotRecorded.
func (c *catalog) checkFleet(name, dir string) (string, *protocol.Manifest, error) {
	m, err := c.fleet.checkServed(name, dir, c.verified)
	// A rollout may swap the link between its reading here and the
	// record's, and the record then names the new version only: the
	// version the link serves now is the one to check.
	for i := 0; err != nil && i < 2; i++ {
		now := c.fleet.servedVersion(name)
		if now == "" || now == dir {
			break
		}
		dir = now
		m, err = c.fleet.checkServed(name, dir, c.verified)
	}
	var te *tamperedError
	if errors.As(err, &te) && c.onTampered != nil {
		c.onTampered(name, te.bundle, te.err)
	}
	return dir, m, err
}

// scan reads the host's skill folders under the root. A missing root is
// an empty catalog; folders without a SKILL.md, skills the policy denies
// and the links an older agent made for the fleet's skills are left out.
func (c *catalog) scan() []protocol.Skill {
	entries, err := os.ReadDir(c.root)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			c.log.Warn("skills: cannot list the skills folder", "dir", c.root, "err", err)
		}
		return nil
	}
	var skills []protocol.Skill
	for _, e := range entries {
		name := e.Name()
		if name == fleetDir || !c.allows(name) {
			continue // .fleet holds the versions an older agent installed
		}
		dir := filepath.Join(c.root, name)
		if target, err := os.Readlink(dir); err == nil {
			if _, managed := managedVersion(name, target); managed {
				continue // an older agent's fleet skill: served from the fleet's folder once installed there
			}
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		if len(skills) == protocol.MaxSkills {
			break
		}
		if len(name) > protocol.MaxSkillNameLen || len(dir)+len(skillFile)+1 > protocol.MaxPathLen {
			c.log.Warn("skills: leaving out a folder whose name or path is too long to announce", "folder", protocol.Excerpt(name))
			continue
		}
		s, ok := c.load(name, dir, filepath.Join(dir, skillFile))
		if ok {
			skills = append(skills, s)
		}
	}
	return skills
}

// allows reports whether the host policy shows the skill called name.
func (c *catalog) allows(name string) bool {
	return c.guard.pol.Load().AllowSkill(name)
}

// folder returns the folder the skill called name is read from: for a
// skill the fleet installed, the version its link serves (resolved once,
// so that one answer never mixes two versions); else <root>/<name>.
func (c *catalog) folder(name string) string {
	if c.isFleet(name) {
		return c.fleet.servedVersion(name)
	}
	return filepath.Join(c.root, name)
}

// load reads the SKILL.md of the skill called name from dir. It reports
// false when there is none. path is the skill's path as announced.
func (c *catalog) load(name, dir, path string) (protocol.Skill, bool) {
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
	return safefs.Problem(path, err)
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
