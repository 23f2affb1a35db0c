package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// skillSync brings the host's managed skills to its desired state: it
// reads the signed record when poked, on every (re)connect and on a
// jittered timer, installs, rolls back and removes skills in the skills
// folder, and reports what it did on the host's status subject. One
// goroutine (run) does all of it, one skill at a time.
type skillSync struct {
	host     string
	keys     func() []string       // the gateway signing keys trusted now
	pol      func() *policy.Policy // the host policy in force
	store    *skillStore
	stateDir string
	log      *slog.Logger
	// changed is called after the served skills changed (the catalog
	// rescans and the host is announced).
	changed func()

	kick chan struct{}
	// tampered hears of fleet skills found changed on disk (by the skill
	// tool or the catalog); run reports them.
	tampered chan tamperNote
	// every is the mean time between periodic reads; retry the mean
	// wait after a read that failed.
	every, retry time.Duration
	timeout      time.Duration // per NATS request

	// Owned by run.
	lastRev uint64
	skills  map[string]protocol.SkillState
	// failed remembers the bundle that failed for good per skill at
	// lastRev: it is not fetched again until the record changes.
	failed map[string]string
	// lastReadErr is why the last read failed ("" if it did not).
	lastReadErr string
}

// tamperNote is a fleet skill found changed on disk.
type tamperNote struct {
	name, bundle string
	err          error
}

// newSkillSync returns the sync of the fleet's skills in root; installed
// records the bundle it installs for each (the catalog serves only
// those). legacy,
// when not "" nor root, is the host's skills folder, where an older agent
// kept the fleet's skills: they move to root (see migrate).
func newSkillSync(host string, keys func() []string, pol func() *policy.Policy, root, legacy, stateDir string, installed *installedRecord, log *slog.Logger, changed func()) *skillSync {
	store := &skillStore{root: root, log: log, installed: installed}
	if legacy != "" && legacy != root {
		store.legacy = &skillStore{root: legacy, log: log}
	}
	return &skillSync{
		host: host, keys: keys, pol: pol, stateDir: stateDir, log: log, changed: changed,
		store:    store,
		kick:     make(chan struct{}, 1),
		tampered: make(chan tamperNote, 16),
		every:    5 * time.Minute, retry: 15 * time.Second, timeout: 5 * time.Second,
		skills: make(map[string]protocol.SkillState), failed: make(map[string]string),
	}
}

// poke asks run to read the desired state now. It never blocks, so NATS
// callbacks may call it.
func (s *skillSync) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// noteTampered tells run that skill name's served bundle was found
// changed on disk. It never blocks: a note that finds the queue full is
// dropped, and the next reconcile, which hashes every file, finds the
// change again.
func (s *skillSync) noteTampered(name, bundle string, err error) {
	select {
	case s.tampered <- tamperNote{name, bundle, err}:
	default:
	}
}

// jitter returns a random wait around mean (from half to one and a half
// of it), so a fleet does not read all at once.
func jitter(mean time.Duration) time.Duration {
	return mean/2 + rand.N(mean+1)
}

// run syncs until ctx ends, on conn's current connection (nil while
// there is none). It first cleans what an interrupted install left.
func (s *skillSync) run(ctx context.Context, conn func() *nats.Conn) {
	s.store.recover()
	if rev, err := loadRevision(s.stateDir); err != nil {
		s.log.Error("skills: "+err.Error(), "err", err)
	} else {
		s.lastRev = rev
	}
	for _, name := range s.store.managedNames() {
		if id := s.store.active(name); id != "" {
			s.skills[name] = protocol.SkillState{BundleID: id, Active: id, State: protocol.SkillInstalled, At: time.Now().UTC()}
		}
	}
	timer := time.NewTimer(jitter(s.every))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case n := <-s.tampered:
			// Reported now; repaired at the next reconcile, which comes
			// within the retry interval.
			if s.markTampered(n) {
				if nc := conn(); nc != nil {
					s.publish(nc)
				}
				s.changed() // the catalog lists it with the problem
				timer.Reset(jitter(s.retry))
			}
			continue
		case <-s.kick:
		case <-timer.C:
		}
		nc := conn()
		if nc == nil {
			timer.Reset(jitter(s.retry))
			continue
		}
		next := s.every
		err := s.syncOnce(ctx, nc)
		if ctx.Err() != nil {
			return
		}
		if err != nil || s.anyTampered() {
			next = s.retry // a tampered skill is repaired at the next reconcile
		}
		s.logReadError(err, jitter(next))
		timer.Reset(jitter(next))
	}
}

// logReadError logs why the desired state could not be read: as a
// warning when the reason differs from the last read's, so that a host
// that cannot read it for hours does not fill its log.
func (s *skillSync) logReadError(err error, in time.Duration) {
	reason := ""
	if err != nil {
		reason = err.Error()
	}
	last := s.lastReadErr
	s.lastReadErr = reason
	switch {
	case err == nil && last != "":
		s.log.Info("skills: the desired skills are read again")
	case err == nil:
	case reason != last:
		s.log.Warn("skills: cannot read this host's desired skills; trying again", "err", err, "in", in.Round(time.Second))
	default:
		s.log.Debug("skills: cannot read this host's desired skills; trying again", "err", err, "in", in.Round(time.Second))
	}
}

// syncOnce reads the desired state and acts on it, then publishes the
// host's status. It returns an error only when the record could not be
// read at all.
func (s *skillSync) syncOnce(ctx context.Context, nc *nats.Conn) error {
	defer s.publish(nc)
	rctx, cancel := context.WithTimeout(ctx, s.timeout)
	msg, err := nc.RequestWithContext(rctx, protocol.SkillsDesiredSubject(s.host), nil)
	cancel()
	if errors.Is(err, nats.ErrNoResponders) {
		// No bucket yet (no skill was ever rolled out) or JetStream is
		// starting: nothing desired; the next poke or timer reads again.
		s.log.Debug("skills: JetStream has no desired-skills bucket to read yet")
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the desired state: %w", err)
	}
	d, err := decodeDesiredReply(s.host, msg.Header, msg.Data)
	if errors.Is(err, errNoDesired) {
		return nil // nothing desired: managed skills stay as they are
	}
	if err != nil {
		return err
	}
	if err := verifyDesired(d, s.keys(), s.host, s.lastRev); err != nil {
		s.log.Warn("skills: refusing the desired state", "err", err)
		for name, ds := range d.State.Skills {
			s.set(name, ds, protocol.SkillFailed, err.Error())
		}
		return nil
	}
	if d.State.Revision > s.lastRev {
		if err := saveRevision(s.stateDir, d.State.Revision); err != nil {
			s.log.Error("skills: cannot keep the desired state's revision", "err", err)
		}
		s.lastRev = d.State.Revision
		clear(s.failed)
	}
	src := &natsBundles{nc: nc, host: s.host, timeout: s.timeout}
	for _, name := range slices.Sorted(maps.Keys(d.State.Skills)) {
		if ctx.Err() != nil {
			return nil
		}
		s.apply(ctx, nc, src, name, d.State.Skills[name])
	}
	s.migrate(d.State.Skills)
	// The status reports the skills desired and those the fleet's links
	// serve; a skill dropped from the record and not served is gone.
	for name := range s.skills {
		if _, desired := d.State.Skills[name]; !desired && s.store.active(name) == "" {
			delete(s.skills, name)
		}
	}
	return nil
}

// apply brings skill name to ds.
func (s *skillSync) apply(ctx context.Context, nc *nats.Conn, src bundleSource, name string, ds protocol.DesiredSkill) {
	if ds.Remove {
		s.removeSkill(name, ds)
		return
	}
	if err := s.pol().CheckSkill(name); err != nil {
		var d *policy.Denial
		reason := err.Error()
		if errors.As(err, &d) {
			reason = "the host policy refuses it: " + d.Reason
		}
		s.set(name, ds, protocol.SkillRefused, reason)
		return
	}
	if why := rolloutUnsupported(); why != "" {
		s.set(name, ds, protocol.SkillRefused, why)
		return
	}
	if err := s.store.tamper(name); err != nil {
		if prev := s.skills[name]; prev.State != protocol.SkillTampered || prev.BundleID != ds.BundleID {
			// Reported at this check, repaired at the next one, so that
			// the status shows it for a while.
			s.log.Warn("skills: a skill the fleet installed was changed on disk; it is refused until it is installed again",
				"skill", name, "bundle", ds.BundleID, "err", err)
			s.set(name, ds, protocol.SkillTampered, tamperedReason(err))
			s.changed()
			return
		}
		s.log.Warn("skills: installing again a skill whose files were changed on disk", "skill", name, "bundle", ds.BundleID)
	} else if s.store.active(name) == ds.BundleID {
		s.set(name, ds, protocol.SkillInstalled, "")
		return
	}
	if s.failed[name] == ds.BundleID {
		return // failed for good at this revision; the state says why
	}
	s.set(name, ds, protocol.SkillInstalling, "")
	s.publish(nc)
	adopted, err := s.install(ctx, src, name, ds.BundleID)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		var p *permanentError
		if errors.As(err, &p) {
			s.failed[name] = ds.BundleID
		}
		s.log.Warn("skills: install failed; the previous version stays", "skill", name, "bundle", ds.BundleID, "err", err)
		s.set(name, ds, protocol.SkillFailed, err.Error())
		return
	}
	reason := ""
	if adopted != "" {
		reason = "the hand-made folder that was the skill's was moved to " + adopted
	}
	s.log.Info("skills: installed", "skill", name, "bundle", ds.BundleID, "rollout", ds.Rollout)
	s.set(name, ds, protocol.SkillInstalled, reason)
	s.changed()
}

// install makes bundle id the served version of name: from its version
// folder when one is on disk and intact (a rollback fetches nothing),
// else fetched, verified and staged.
func (s *skillSync) install(ctx context.Context, src bundleSource, name, id string) (adopted string, err error) {
	v := shortID(id)
	onDisk := false
	if m, err := s.store.readManifest(name, v); err == nil {
		// The folder name is 48 bits of the bundle ID: a manifest of
		// another bundle there (made to collide, or a rare accident) is
		// replaced by a fetched copy of this one.
		if m.BundleID() != id {
			s.log.Warn("skills: a kept version's manifest is of another bundle with the same folder name; fetching this bundle",
				"skill", name, "version", v, "bundle", id, "on_disk", m.BundleID())
		} else if err := verifyVersion(filepath.Join(s.store.versionsDir(name), v), m); err != nil {
			s.log.Warn("skills: a kept version changed on disk; fetching it again", "skill", name, "version", v, "err", err)
		} else {
			onDisk = true
		}
	}
	if !onDisk {
		sm, err := src.manifest(ctx, id)
		if err != nil {
			return "", err
		}
		if err := checkManifest(sm, s.keys(), name, id); err != nil {
			return "", err
		}
		// A damaged copy, if any, goes; if it is the one served, the
		// skill is served by no version until the new copy is in place
		// (it was refused anyway).
		if filepath.Base(s.store.servedVersion(name)) == v {
			if err := s.store.unserve(name); err != nil {
				return "", err
			}
			s.changed()
		}
		if aside := s.store.setAside(name, v); aside != "" {
			defer os.RemoveAll(aside)
		}
		if err := s.store.stage(ctx, src, &sm.Manifest); err != nil {
			return "", err
		}
	}
	adopted, err = s.store.serve(name, id)
	if err != nil {
		return adopted, err
	}
	s.store.prune(name)
	return adopted, nil
}

// migrate removes the copies of the fleet's skills an older agent kept in
// the host's skills folder (where the tools could change them; they are
// never served from there) once the skill is installed in the fleet's
// folder, or no longer desired. Until then their files, when they still
// match their digests, are copied instead of fetched.
func (s *skillSync) migrate(desired map[string]protocol.DesiredSkill) {
	old := s.store.legacy
	if old == nil {
		return
	}
	names := old.managedNames()
	for _, name := range names {
		ds, want := desired[name]
		if want && !ds.Remove && s.store.active(name) != ds.BundleID {
			continue
		}
		if err := old.remove(name); err != nil {
			s.log.Warn("skills: cannot remove the copy of a fleet skill an older agent kept in the host's skills folder", "skill", name, "err", err)
			continue
		}
		s.log.Info("skills: removed the copy of a fleet skill an older agent kept in the host's skills folder; it is served from the fleet's folder",
			"skill", name, "old", filepath.Join(old.root, fleetDir, name), "new", filepath.Join(s.store.root, name))
	}
	if len(names) > 0 {
		_ = os.Remove(filepath.Join(old.root, fleetDir)) // kept while it holds hand-made folders a rollout took over
	}
}

// removeSkill removes the fleet's copy of name.
func (s *skillSync) removeSkill(name string, ds protocol.DesiredSkill) {
	had := s.store.servedVersion(name) != ""
	if err := s.store.remove(name); err != nil {
		s.log.Warn("skills: cannot remove", "skill", name, "err", err)
		s.set(name, ds, protocol.SkillFailed, err.Error())
		return
	}
	s.set(name, ds, protocol.SkillRemoved, "")
	if had {
		s.log.Info("skills: removed", "skill", name, "rollout", ds.Rollout)
		s.changed()
	}
}

// set records skill name's state; Active is what is served now.
func (s *skillSync) set(name string, ds protocol.DesiredSkill, state, reason string) {
	s.skills[name] = protocol.SkillState{
		BundleID: ds.BundleID, Active: s.store.active(name), Rollout: ds.Rollout,
		State: state, Reason: protocol.Clip(reason, 1000), At: time.Now().UTC(),
	}
}

// markTampered records that skill n.name serves bundle n.bundle changed
// on disk, and reports whether that is news (the state was not tampered
// already). Notes about a bundle no longer served are dropped.
func (s *skillSync) markTampered(n tamperNote) bool {
	prev, known := s.skills[n.name]
	if !known {
		return false
	}
	// The note names the bundle the agent recorded installing, in full.
	var id string
	for _, c := range []string{prev.BundleID, prev.Active} {
		if c != "" && c == n.bundle {
			id = c
			break
		}
	}
	// A note about a bundle no longer served, or from before a repair
	// (or about a change undone since), is dropped: what counts is what
	// is on disk now.
	if id == "" || s.store.tamper(n.name) == nil && s.store.active(n.name) == id {
		return false
	}
	news := prev.State != protocol.SkillTampered
	if news {
		s.log.Warn("skills: a skill the fleet installed was changed on disk; it is refused until it is installed again",
			"skill", n.name, "bundle", id, "err", n.err)
		prev.At = time.Now().UTC()
	}
	prev.State, prev.Reason = protocol.SkillTampered, tamperedReason(n.err)
	s.skills[n.name] = prev
	return news
}

// anyTampered reports whether a skill awaits its repair.
func (s *skillSync) anyTampered() bool {
	for _, st := range s.skills {
		if st.State == protocol.SkillTampered {
			return true
		}
	}
	return false
}

// tamperedReason is the status's reason for a tampered skill.
func tamperedReason(err error) string {
	return protocol.Clip("the installed files differ from the signed manifest: "+err.Error()+
		"; the skill is refused until the next check of the desired skills installs it again", 1000)
}

// publish sends the host's full status.
func (s *skillSync) publish(nc *nats.Conn) {
	st := protocol.SkillStatus{Host: s.host, Revision: s.lastRev, Skills: maps.Clone(s.skills), At: time.Now().UTC()}
	data, err := json.Marshal(st)
	if err == nil {
		err = nc.Publish(protocol.SkillsStatusSubject(s.host), data)
	}
	if err != nil {
		s.log.Warn("skills: cannot publish the host's status", "err", err)
	}
}
