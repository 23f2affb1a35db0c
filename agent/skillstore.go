package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The skills the fleet rolls out live in a folder of their own
// (Config.FleetSkillsDir, by default skills in the state directory), apart
// from the host's own skills: no tool writes there, and what is served
// from there is checked against the signed manifest first (skillverify.go).
// Its layout makes every change one atomic rename:
//
//	<root>/<name>                     → .fleet/<name>/<hex12> (a symbolic link)
//	<root>/.fleet/<name>/<hex12>/     one complete version of the skill
//	<root>/.fleet/<name>/<hex12>.json its manifest (the full bundle ID)
//	<root>/.fleet/<name>/.staging-*   a version being written (never served)
//	<root>/.fleet/<name>/adopted-<t>  the hand-made folder that was at <name>
//
// hex12 is the first 12 hex digits of the bundle ID; which full bundle ID
// each skill serves is the agent's own record, outside this folder
// (skillinstalled.go). A version is staged,
// synced to disk, and renamed into place whole; the link is then made
// under a temporary name and renamed over the served one, so a reader
// sees the old version or the new one, never a mix, and a crash leaves at
// most a staging folder, which the next start removes.

const (
	// fleetDir is the folder of managed versions in the skills root. It
	// is not a valid skill name, and the catalog hides it.
	fleetDir = ".fleet"
	// keepVersions is how many versions of a skill stay on disk (the
	// served one included), so that a rollback needs no fetch.
	keepVersions  = 3
	stagingPrefix = ".staging-"
	linkPrefix    = ".link-"
	adoptedPrefix = "adopted-"
)

// skillStore is the managed layout under one skills root.
type skillStore struct {
	root string // absolute
	log  *slog.Logger
	// installed is the agent's record of the bundle it installed for
	// each skill: only that bundle is served (nil: none is).
	installed *installedRecord
	// legacy, when set, is the layout an older agent kept in the host's
	// skills folder: its files that still match their digests are copied
	// instead of fetched when a skill moves here.
	legacy *skillStore
}

func (s *skillStore) versionsDir(name string) string { return filepath.Join(s.root, fleetDir, name) }

// ownDirs makes sure .fleet and .fleet/<name> are real folders (made
// when missing, with create): the agent writes and deletes in them, so a
// link planted there (by anyone who may write in the skills folder)
// must not lead it elsewhere.
func (s *skillStore) ownDirs(name string, create bool) error {
	for _, dir := range []string{filepath.Join(s.root, fleetDir), s.versionsDir(name)} {
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) && create {
			if err = os.MkdirAll(dir, 0o755); err == nil {
				fi, err = os.Lstat(dir)
			}
		}
		if err != nil {
			return fmt.Errorf("skill versions folder: %w", err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a folder (a link, or a file): the agent keeps the fleet's skill versions only in folders it made; remove it", dir)
		}
	}
	return nil
}

// shortID is the folder name of bundle id's version.
func shortID(id string) string { return strings.TrimPrefix(id, "sha256:")[:12] }

// managedVersion reads a link's target: a managed link of the skill
// called name is exactly ".fleet/<name>/<hex12>"; it returns hex12.
func managedVersion(name, target string) (string, bool) {
	rest, ok := strings.CutPrefix(filepath.ToSlash(target), fleetDir+"/"+name+"/")
	if !ok || len(rest) != 12 {
		return "", false
	}
	return rest, rest != "" && isLowerHex(rest)
}

// servedVersion returns the folder of the version <root>/<name> serves
// when it is a managed link to a version folder (a real folder, not a
// link); "" when it is not.
func (s *skillStore) servedVersion(name string) string { return managedFolder(s.root, name) }

// managedFolder is servedVersion for the skills root root.
func managedFolder(root, name string) string {
	target, err := os.Readlink(filepath.Join(root, name))
	if err != nil {
		return ""
	}
	v, ok := managedVersion(name, target)
	if !ok {
		return ""
	}
	store := &skillStore{root: root}
	dir := filepath.Join(store.versionsDir(name), v)
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || store.ownDirs(name, false) != nil {
		return ""
	}
	return dir
}

// unserve removes the fleet's link of name, so that no version of it is
// served (a damaged version is then replaced).
func (s *skillStore) unserve(name string) error {
	served := filepath.Join(s.root, name)
	target, err := os.Readlink(served)
	if err != nil {
		return nil
	}
	if _, managed := managedVersion(name, target); !managed {
		return nil
	}
	if err := os.Remove(served); err != nil {
		return fmt.Errorf("remove the link of %s: %w", name, err)
	}
	safefs.SyncDir(s.root)
	return nil
}

// active returns the bundle ID <root>/<name> serves, "" when it serves
// none the agent recorded installing: the link must lead to the version
// folder of a bundle the record names, whose manifest's full ID is that
// bundle's. It hashes no file (checkServed does).
func (s *skillStore) active(name string) string {
	dir := s.servedVersion(name)
	if dir == "" {
		return ""
	}
	id := s.recordedID(name, filepath.Base(dir))
	if id == "" {
		return ""
	}
	m, err := s.readManifest(name, filepath.Base(dir))
	if err != nil || m.BundleID() != id {
		return ""
	}
	return id
}

// recordedID returns the bundle the record lets name serve from version
// folder v, "" when there is none.
func (s *skillStore) recordedID(name, v string) string {
	rec := s.installed.get(name)
	for _, id := range []string{rec.Bundle, rec.Next} {
		if id != "" && shortID(id) == v {
			return id
		}
	}
	return ""
}

// errNotRecorded is a served version the agent has no record of
// installing (a record lost, or from an agent that kept none): it is not
// served until the desired state names it and it is installed again.
var errNotRecorded = errors.New("the agent has no record of installing it")

// checkServed checks version folder dir, which <root>/<name> serves,
// against what the agent installed: the record must name a bundle of
// that folder, the manifest kept beside it must be exactly that bundle's
// (its full SHA-256, not the folder name's 48 bits), and the folder must
// hold exactly the manifest's files (cache, when not nil, spares hashing
// files that matched before). A mismatch is a *tamperedError naming the
// bundle the agent installed; a version never recorded is
// errNotRecorded.
func (s *skillStore) checkServed(name, dir string, cache *verifyCache) (*protocol.Manifest, error) {
	rec := s.installed.get(name)
	if rec.Bundle == "" && rec.Next == "" {
		return nil, errNotRecorded
	}
	v := filepath.Base(dir)
	id := s.recordedID(name, v)
	if id == "" {
		return nil, &tamperedError{name: name, bundle: cmp.Or(rec.Bundle, rec.Next),
			err: fmt.Errorf("its link serves version folder %s, not the bundle the agent installed", v)}
	}
	m, err := s.readManifest(name, v)
	switch {
	case err != nil:
		err = fmt.Errorf("its manifest cannot be read: %w", err)
	case m.BundleID() != id:
		err = fmt.Errorf("its manifest is of bundle %s, not of bundle %s the agent installed", m.BundleID(), id)
	default:
		err = verifyFiles(dir, m, cache)
	}
	if err != nil {
		return nil, &tamperedError{name: name, bundle: id, err: err}
	}
	return m, nil
}

// tamper checks the version <root>/<name> serves against what the agent
// installed, hashing every file: nil when it matches, or when it serves
// no version or one the agent has no record of (installing the desired
// one makes the record).
func (s *skillStore) tamper(name string) error {
	dir := s.servedVersion(name)
	if dir == "" {
		return nil
	}
	_, err := s.checkServed(name, dir, nil)
	if errors.Is(err, errNotRecorded) {
		return nil
	}
	var te *tamperedError
	if errors.As(err, &te) {
		return te.err
	}
	return err
}

// readManifest reads the manifest kept beside version v of name.
func (s *skillStore) readManifest(name, v string) (*protocol.Manifest, error) {
	if err := s.ownDirs(name, false); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(s.versionsDir(name), v+".json"))
	if err != nil {
		return nil, err
	}
	var m protocol.Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s version %s: %w", name, v, err)
	}
	if m.Name != name || shortID(m.BundleID()) != v {
		return nil, fmt.Errorf("manifest of %s version %s is for another bundle", name, v)
	}
	return &m, nil
}

// versions returns the version folders of name on disk, the most
// recently served first.
func (s *skillStore) versions(name string) []string {
	if s.ownDirs(name, false) != nil {
		return nil
	}
	entries, err := os.ReadDir(s.versionsDir(name))
	if err != nil {
		return nil
	}
	type ver struct {
		v  string
		at time.Time
	}
	var vs []ver
	for _, e := range entries {
		if !e.IsDir() || len(e.Name()) != 12 || !isLowerHex(e.Name()) {
			continue
		}
		fi, err := os.Stat(filepath.Join(s.versionsDir(name), e.Name()+".json"))
		if err != nil {
			continue
		}
		vs = append(vs, ver{e.Name(), fi.ModTime()})
	}
	slices.SortFunc(vs, func(a, b ver) int { return b.at.Compare(a.at) })
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.v
	}
	return out
}

// claims reports whether name's folder in .fleet holds a version, or one
// being written or put aside: the fleet holds the name even while it
// serves no version of it.
func (s *skillStore) claims(name string) bool {
	if s.ownDirs(name, false) != nil {
		return false
	}
	entries, err := os.ReadDir(s.versionsDir(name))
	if err != nil {
		return false
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), adoptedPrefix) {
			return true
		}
	}
	return false
}

// managedNames lists the skills with a folder in .fleet.
func (s *skillStore) managedNames() []string {
	entries, err := os.ReadDir(filepath.Join(s.root, fleetDir))
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && protocol.ValidateSkillName(e.Name()) == nil {
			names = append(names, e.Name())
		}
	}
	return names
}

// recover cleans what an interrupted install left: staging folders and
// temporary links, manifests without their version and versions without
// their manifest (unless served). Served links always point at a
// complete version, so nothing else needs repair.
func (s *skillStore) recover() {
	for _, name := range s.managedNames() {
		if err := s.ownDirs(name, false); err != nil {
			s.log.Warn("skills: "+err.Error(), "skill", name)
			continue
		}
		dir := s.versionsDir(name)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		served := filepath.Base(s.servedVersion(name))
		for _, e := range entries {
			n := e.Name()
			var why string
			switch {
			case strings.HasPrefix(n, stagingPrefix):
				why = "an install that did not finish"
			case strings.HasPrefix(n, linkPrefix):
				why = "a link swap that did not finish"
			case strings.HasSuffix(n, ".json") && len(n) == 17:
				if _, err := os.Lstat(filepath.Join(dir, strings.TrimSuffix(n, ".json"))); errors.Is(err, fs.ErrNotExist) {
					why = "the manifest of a version that is not on disk"
				}
			case e.IsDir() && len(n) == 12 && isLowerHex(n) && n != served:
				if _, err := os.Lstat(filepath.Join(dir, n+".json")); errors.Is(err, fs.ErrNotExist) {
					why = "a version without its manifest"
				}
			}
			if why == "" {
				continue
			}
			if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
				s.log.Warn("skills: cannot remove what an interrupted install left", "path", filepath.Join(dir, n), "err", err)
				continue
			}
			s.log.Info("skills: removed "+why, "skill", name, "path", filepath.Join(dir, n))
		}
	}
}

// verifyVersion checks that version folder dir holds exactly m's files,
// each a regular file of its size, digest and executable bit, hashing
// every one.
func verifyVersion(dir string, m *protocol.Manifest) error { return verifyFiles(dir, m, nil) }

// swapLink makes <root>/<name> serve version v: a link made under a
// temporary name beside the versions and renamed over the served name,
// atomically. What is at <root>/<name> and is not the fleet's link (a
// hand-made folder, a file, another link) is moved aside first to
// .fleet/<name>/adopted-<unix time>; swapLink returns where, or "".
func (s *skillStore) swapLink(name, v string) (adopted string, err error) {
	if err := s.ownDirs(name, true); err != nil {
		return "", err
	}
	tmp := filepath.Join(s.versionsDir(name), linkPrefix+randomSuffix())
	if err := os.Symlink(filepath.Join(fleetDir, name, v), tmp); err != nil {
		return "", fmt.Errorf("make the link of %s: %w", name, err)
	}
	defer os.Remove(tmp) // gone after the rename; left only if it failed
	served := filepath.Join(s.root, name)
	if fi, err := os.Lstat(served); err == nil {
		target, _ := os.Readlink(served)
		if _, managed := managedVersion(name, target); fi.Mode()&fs.ModeSymlink == 0 || !managed {
			adopted = s.adoptPath(name)
			if err := os.Rename(served, adopted); err != nil {
				return "", fmt.Errorf("move the hand-made %s aside: %w", served, err)
			}
			s.log.Warn("skills: a fleet rollout took over a hand-made skill; the hand-made folder is kept",
				"skill", name, "moved_to", adopted)
		}
	}
	if err := os.Rename(tmp, served); err != nil {
		return adopted, fmt.Errorf("swap the link of %s: %w", name, err)
	}
	safefs.SyncDir(s.root)
	// The manifest's time is when the version was last served: prune
	// keeps the most recently served ones, which rollbacks go back to.
	now := time.Now()
	_ = os.Chtimes(filepath.Join(s.versionsDir(name), v+".json"), now, now)
	return adopted, nil
}

// serve makes <root>/<name> serve bundle id, whose version folder is in
// place and checked, and records it: while the link is swapped the
// record accepts either version, so that neither a reader meanwhile nor
// a crash finds the served one unrecorded.
func (s *skillStore) serve(name, id string) (adopted string, err error) {
	if err := s.installed.begin(name, id); err != nil {
		s.log.Warn("skills: "+err.Error(), "skill", name)
	}
	adopted, err = s.swapLink(name, shortID(id))
	if err != nil {
		if e := s.installed.abort(name); e != nil {
			s.log.Warn("skills: "+e.Error(), "skill", name)
		}
		return adopted, err
	}
	if err := s.installed.commit(name, id); err != nil {
		s.log.Warn("skills: "+err.Error()+"; after a restart the skill is installed again", "skill", name)
	}
	return adopted, nil
}

// adoptPath returns a free adopted-<unix time> path for name.
func (s *skillStore) adoptPath(name string) string {
	base := filepath.Join(s.versionsDir(name), adoptedPrefix+strconv.FormatInt(time.Now().Unix(), 10))
	p := base
	for i := 2; ; i++ {
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			return p
		}
		p = base + "-" + strconv.Itoa(i)
	}
}

// prune keeps the served version of name and the newest others, up to
// keepVersions in all.
func (s *skillStore) prune(name string) {
	served := filepath.Base(s.servedVersion(name))
	kept := 1
	for _, v := range s.versions(name) {
		if v == served {
			continue
		}
		if kept < keepVersions {
			kept++
			continue
		}
		s.removeVersion(name, v)
	}
}

// setAside moves version v of name (a damaged copy, if any) out of the
// way under a staging name, which keeps the name the fleet's meanwhile
// (claims), and returns where ("" when there was none); the caller
// removes it, or the next start does.
func (s *skillStore) setAside(name, v string) string {
	if s.ownDirs(name, false) != nil {
		return ""
	}
	dir := s.versionsDir(name)
	aside := filepath.Join(dir, stagingPrefix+"damaged-"+randomSuffix())
	if err := os.Rename(filepath.Join(dir, v), aside); err != nil {
		aside = ""
	}
	if err := os.Remove(filepath.Join(dir, v+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("skills: cannot remove a damaged manifest", "skill", name, "version", v, "err", err)
	}
	return aside
}

func (s *skillStore) removeVersion(name, v string) {
	if s.ownDirs(name, false) != nil {
		return
	}
	dir := s.versionsDir(name)
	// The manifest goes last: a version without one is removed at start.
	files := os.RemoveAll(filepath.Join(dir, v))
	manifest := os.Remove(filepath.Join(dir, v+".json"))
	if errors.Is(manifest, fs.ErrNotExist) {
		manifest = nil // a version never finished, or removed already
	}
	if err := errors.Join(files, manifest); err != nil {
		s.log.Warn("skills: cannot remove an old version", "skill", name, "version", v, "err", err)
	}
}

// remove deletes the fleet's link of name and its versions. A hand-made
// folder at <root>/<name> is not the fleet's and stays, as do the
// hand-made folders adopted earlier.
func (s *skillStore) remove(name string) error {
	served := filepath.Join(s.root, name)
	if target, err := os.Readlink(served); err == nil {
		if _, managed := managedVersion(name, target); managed {
			if err := os.Remove(served); err != nil {
				return fmt.Errorf("remove the link of %s: %w", name, err)
			}
			safefs.SyncDir(s.root)
		}
	}
	if err := s.installed.forget(name); err != nil {
		return err
	}
	if err := s.ownDirs(name, false); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	dir := s.versionsDir(name)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove the versions of %s: %w", name, err)
	}
	adopted := false
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), adoptedPrefix) {
			adopted = true
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove the versions of %s: %w", name, err)
		}
	}
	if !adopted {
		_ = os.Remove(dir)
	}
	return nil
}

// randomSuffix names a temporary file or folder.
func randomSuffix() string { return newInstanceID() }
