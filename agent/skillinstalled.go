package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The manifest kept beside a version folder is in the fleet's skills
// folder, and only has to hash to that folder's name, 48 bits of the
// bundle ID. Whoever can write in the skills folder (root, or commands
// on a host that cannot confine them) could rewrite a script with a
// manifest to match and find one whose digest starts with those 48 bits,
// or simply point the skill's link at a version folder of their own, or
// at an older version kept on disk. So the agent keeps its own record of
// the full bundle ID it installed for each skill, in the state directory
// outside the skills folder, where confined commands can neither read
// nor write: a version is served only while its manifest's full SHA-256
// equals that record. The record changes only when the agent swaps a
// version in after checking it against the signed desired state, so it
// survives restarts and needs no gateway to check what is served, and it
// keeps naming the previous version while a new one is being installed
// (or fails to be), so that one keeps being served.

// skillsInstalledFile, in the state directory, is the record.
const skillsInstalledFile = "skills-installed.json"

// maxInstalledBytes bounds the record file.
const maxInstalledBytes = 1 << 20

// installedSkill is what the agent installed for one skill: Bundle ("" if
// none yet), and Next while a swap to another version is under way (a
// crash in the middle leaves the link at either).
type installedSkill struct {
	Bundle string `json:"bundle"`
	Next   string `json:"next,omitempty"`
}

// accepts reports whether id is a bundle the record lets the skill serve.
func (r installedSkill) accepts(id string) bool {
	return id != "" && (id == r.Bundle || id == r.Next)
}

// installedRecord is the record, in memory and in its file. It is safe
// for concurrent use: the rollout writes it, the catalog and the skill
// tool read it.
type installedRecord struct {
	path string // "" keeps it in memory only
	log  *slog.Logger
	mu   sync.Mutex
	by   map[string]installedSkill
}

// installedFile is the record file's form.
type installedFile struct {
	Skills map[string]installedSkill `json:"skills"`
}

// loadInstalled reads the record in stateDir. A record that is missing
// or damaged is empty: nothing is served until the signed desired state
// names what is on disk and the agent installs it again (from disk,
// when its files match).
func loadInstalled(stateDir string, log *slog.Logger) *installedRecord {
	r := &installedRecord{log: log, by: make(map[string]installedSkill)}
	if stateDir == "" {
		return r
	}
	r.path = filepath.Join(stateDir, skillsInstalledFile)
	data, err := readBounded(r.path, maxInstalledBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return r
	}
	if err == nil {
		r.by, err = parseInstalled(data)
	}
	if err != nil {
		log.Error("skills: the record of the installed fleet skills cannot be used; none is served until the desired skills are read and checked again",
			"file", r.path, "err", err)
		r.by = make(map[string]installedSkill)
	}
	return r
}

// parseInstalled parses the record file: valid skill names, each with a
// well-formed bundle ID (and Next one when set).
func parseInstalled(data []byte) (map[string]installedSkill, error) {
	var f installedFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a record of installed skills: %w", err)
	}
	if len(f.Skills) > protocol.MaxSkills {
		return nil, fmt.Errorf("it names %d skills; a host serves at most %d", len(f.Skills), protocol.MaxSkills)
	}
	out := make(map[string]installedSkill, len(f.Skills))
	for name, s := range f.Skills {
		if err := protocol.ValidateSkillName(name); err != nil {
			return nil, fmt.Errorf("it names a skill badly: %w", err)
		}
		if s.Bundle == "" && !validBundleID(s.Next) || s.Bundle != "" && !validBundleID(s.Bundle) || s.Next != "" && !validBundleID(s.Next) {
			return nil, fmt.Errorf("skill %s: %s is not a bundle ID (sha256: and 64 lowercase hex digits)", name, protocol.Excerpt(s.Bundle+" "+s.Next))
		}
		out[name] = s
	}
	return out, nil
}

// get returns what the record says of name (zero: nothing installed).
func (r *installedRecord) get(name string) installedSkill {
	if r == nil {
		return installedSkill{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.by[name]
}

// begin records that name is being swapped to bundle next.
func (r *installedRecord) begin(name, next string) error {
	return r.update(name, func(s installedSkill) installedSkill { return installedSkill{Bundle: s.Bundle, Next: next} })
}

// commit records that name serves bundle id.
func (r *installedRecord) commit(name, id string) error {
	return r.update(name, func(installedSkill) installedSkill { return installedSkill{Bundle: id} })
}

// abort records that the swap of name did not happen.
func (r *installedRecord) abort(name string) error {
	return r.update(name, func(s installedSkill) installedSkill { return installedSkill{Bundle: s.Bundle} })
}

// forget records that the fleet no longer serves name.
func (r *installedRecord) forget(name string) error {
	return r.update(name, func(installedSkill) installedSkill { return installedSkill{} })
}

// update changes name's entry with f and writes the record. Memory
// changes even when the write fails (this process serves what it
// installed); after a restart the skill is then installed again.
func (r *installedRecord) update(name string, f func(installedSkill) installedSkill) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := f(r.by[name])
	if s == r.by[name] {
		return nil
	}
	if s == (installedSkill{}) {
		delete(r.by, name)
	} else {
		r.by[name] = s
	}
	if r.path == "" {
		return nil
	}
	data, err := json.Marshal(installedFile{Skills: r.by})
	if err == nil {
		err = safefs.WriteStateFile(r.path, data)
	}
	if err != nil {
		return fmt.Errorf("keep the record of the installed fleet skills: %w", err)
	}
	return nil
}
