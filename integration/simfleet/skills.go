package simfleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Simulated agents with Config.Skills take part in skill rollout as
// real agents do: they read their desired state with a JetStream direct
// get (on connect and when poked), check its signature, fetch each new
// bundle's manifest and files from the gateways in MaxBlobChunk parts,
// checking signature and digests, and publish their status. They keep
// nothing on disk: a bundle is "installed" once all its files arrived
// intact. At most Config.SkillConcurrency agents sync at once.

// skillState is one simulated agent's skills.
type skillState struct {
	mu       sync.Mutex
	busy     bool // a sync runs
	again    bool // poked while it ran
	revision uint64
	active   map[string]string // skill -> bundle
	states   map[string]protocol.SkillState
}

// Installed returns how many hosts have bundle of skill active.
func (f *Fleet) Installed(skill, bundle string) int {
	n := 0
	for _, a := range f.agents {
		a.sk.mu.Lock()
		if a.sk.active[skill] == bundle {
			n++
		}
		a.sk.mu.Unlock()
	}
	return n
}

// skillsPoke starts a sync of the agent's skills, or asks the running
// one to go again.
func (a *simAgent) skillsPoke() {
	if !a.f.cfg.Skills || a.f.ctx.Err() != nil {
		return
	}
	a.sk.mu.Lock()
	if a.sk.busy {
		a.sk.again = true
		a.sk.mu.Unlock()
		return
	}
	a.sk.busy = true
	a.sk.mu.Unlock()
	a.f.wg.Go(func() {
		for {
			select {
			case a.f.skillSem <- struct{}{}:
			case <-a.f.ctx.Done():
				return
			}
			if err := a.syncSkills(); err != nil && a.f.ctx.Err() == nil {
				a.f.cfg.Logger.Warn("skills sync failed", "host", a.host, "err", err)
			}
			<-a.f.skillSem
			a.sk.mu.Lock()
			if !a.sk.again {
				a.sk.busy = false
				a.sk.mu.Unlock()
				return
			}
			a.sk.again = false
			a.sk.mu.Unlock()
		}
	})
}

// syncSkills reads the desired state and acts on every skill in it.
func (a *simAgent) syncSkills() error {
	nc := a.conn()
	if nc == nil {
		return errors.New("not connected")
	}
	m, err := request(nc, protocol.SkillsDesiredSubject(a.host), nil)
	if err != nil {
		return fmt.Errorf("desired state: %w", err)
	}
	if m.Header.Get("Status") == "404" {
		return a.publishStatus(nc)
	}
	var d protocol.SignedDesiredState
	if err := json.Unmarshal(m.Data, &d); err != nil {
		return fmt.Errorf("desired state: %w", err)
	}
	if err := protocol.VerifyBytes(a.f.cfg.SigningKeys, protocol.PurposeDesired, d.State.CanonicalBytes(), d.Signature); err != nil {
		return err
	}
	a.sk.mu.Lock()
	stale := d.State.Host != a.host || d.State.Revision < a.sk.revision
	if !stale {
		a.sk.revision = d.State.Revision
	}
	a.sk.mu.Unlock()
	if stale {
		return fmt.Errorf("desired state for %s at revision %d refused", d.State.Host, d.State.Revision)
	}
	for _, name := range slices.Sorted(maps.Keys(d.State.Skills)) {
		a.applySkill(nc, name, d.State.Skills[name])
	}
	return a.publishStatus(nc)
}

// applySkill brings one skill to what is desired and records the state.
func (a *simAgent) applySkill(nc *nats.Conn, name string, want protocol.DesiredSkill) {
	a.sk.mu.Lock()
	active := a.sk.active[name]
	a.sk.mu.Unlock()
	st := protocol.SkillState{BundleID: want.BundleID, Rollout: want.Rollout, Active: active, At: time.Now().UTC()}
	switch {
	case want.Remove:
		st.State, st.Active = protocol.SkillRemoved, ""
		active = ""
	case active == want.BundleID:
		st.State = protocol.SkillInstalled
	default:
		if err := a.fetchBundle(nc, want.BundleID); err != nil {
			st.State, st.Reason = protocol.SkillFailed, err.Error()
		} else {
			st.State, st.Active, active = protocol.SkillInstalled, want.BundleID, want.BundleID
		}
	}
	a.sk.mu.Lock()
	if active == "" {
		delete(a.sk.active, name)
	} else {
		a.sk.active[name] = active
	}
	a.sk.states[name] = st
	a.sk.mu.Unlock()
}

func (a *simAgent) publishStatus(nc *nats.Conn) error {
	a.sk.mu.Lock()
	st := protocol.SkillStatus{Host: a.host, Revision: a.sk.revision, Skills: maps.Clone(a.sk.states), At: time.Now().UTC()}
	a.sk.mu.Unlock()
	return nc.Publish(protocol.SkillsStatusSubject(a.host), mustJSON(st))
}

// fetchBundle gets and checks a bundle's manifest and every file.
func (a *simAgent) fetchBundle(nc *nats.Conn, bundle string) error {
	m, err := request(nc, protocol.SkillsManifestSubject(a.host), mustJSON(protocol.SkillManifestRequest{BundleID: bundle}))
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if m.Header.Get(protocol.SkillsErrorHeader) != "" {
		return fmt.Errorf("manifest: %s", m.Data)
	}
	var sm protocol.SignedManifest
	if err := json.Unmarshal(m.Data, &sm); err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if err := protocol.VerifyBytes(a.f.cfg.SigningKeys, protocol.PurposeManifest, sm.Manifest.CanonicalBytes(), sm.Signature); err != nil {
		return err
	}
	if sm.Manifest.BundleID() != bundle {
		return fmt.Errorf("the manifest served for %s is another bundle's", bundle)
	}
	if err := sm.Manifest.Validate(); err != nil {
		return err
	}
	for _, f := range sm.Manifest.Files {
		h := sha256.New()
		var got int64
		for got < f.Size {
			req := protocol.SkillBlobRequest{SHA256: f.SHA256, Offset: got, Length: min(protocol.MaxBlobChunk, f.Size-got)}
			m, err := request(nc, protocol.SkillsBlobSubject(a.host), mustJSON(req))
			if err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
			if m.Header.Get(protocol.SkillsErrorHeader) != "" || len(m.Data) == 0 {
				return fmt.Errorf("%s: %s", f.Path, m.Data)
			}
			h.Write(m.Data)
			got += int64(len(m.Data))
		}
		if got != f.Size || hex.EncodeToString(h.Sum(nil)) != f.SHA256 {
			return fmt.Errorf("%s: size or digest does not match the manifest", f.Path)
		}
	}
	return nil
}

// request asks the gateways, again after a timeout (a gateway that died
// keeps its queue subscription until the server notices).
func request(nc *nats.Conn, subject string, data []byte) (*nats.Msg, error) {
	var err error
	for range 3 {
		var m *nats.Msg
		if m, err = nc.Request(subject, data, 5*time.Second); !errors.Is(err, nats.ErrTimeout) {
			return m, err
		}
	}
	return nil, err
}
