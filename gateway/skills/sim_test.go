package skills

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// fakeFleet is the fleet a test sets: enrolled hosts, which are online,
// which revoked.
type fakeFleet struct {
	mu      sync.Mutex
	hosts   map[string]map[string]string
	offline map[string]bool
	revoked map[string]bool
}

func newFakeFleet(hosts ...string) *fakeFleet {
	f := &fakeFleet{hosts: map[string]map[string]string{}, offline: map[string]bool{}, revoked: map[string]bool{}}
	for _, h := range hosts {
		f.hosts[h] = map[string]string{"role": "web"}
	}
	return f
}

func (f *fakeFleet) setOnline(host string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offline[host] = !on
}

func (f *fakeFleet) Members() []Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Member
	for h, l := range f.hosts {
		if !f.revoked[h] {
			out = append(out, Member{Host: h, Labels: maps.Clone(l), Online: !f.offline[h]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Host < out[j].Host })
	return out
}

func (f *fakeFleet) Online(host string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.offline[host]
}

func (f *fakeFleet) AgentOK(host string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.hosts[host] == nil:
		return fmt.Errorf("host %q is not enrolled", host)
	case f.revoked[host]:
		return fmt.Errorf("host %s was revoked", host)
	}
	return nil
}

// testSkills opens a skill store on its own connection to ns; it is
// closed when the test ends unless the test closes it first.
func testSkills(t *testing.T, ns *server.Server, fleet Fleet, key Signer, id string) *Store {
	t.Helper()
	nc := connectNATS(t, ns, "gateway "+id)
	s, err := Open(nc, key, fleet, Options{Replicas: 1, LeaderTTL: 2 * time.Second, Tick: 20 * time.Millisecond,
		CacheBytes: 8 << 20, ID: id,
		// The simulated agents of these tests take pokes as they come;
		// the agents' check of their signatures is tested with the
		// agent.
		Poke: func(host string) { _ = nc.Publish(protocol.SkillsPokeSubject(host), nil) },
	}, slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("gateway", id))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	t.Cleanup(func() { once.Do(s.Close) })
	return s
}

func testSigningKey(t *testing.T) *testKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	return memorySigningKey(priv, nil)
}

// testWriter writes a log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Behaviours of a simulated agent.
const (
	simInstall = "install"
	simFail    = "fail"
	simRefuse  = "refuse"
	simHang    = "hang" // reports installing, then nothing
)

// simAgent does what a real agent does about skills: it reads its
// desired state with a direct get (on start and when poked), verifies
// it, fetches manifests and files from the gateways, and publishes its
// status to the status subject. What it does with a bundle is set by
// its behaviour; a held agent waits for release before it installs.
type simAgent struct {
	t       *testing.T
	host    string
	nc      *nats.Conn
	trusted []string

	mu       sync.Mutex
	behave   string
	hold     chan struct{}
	deaf     atomic.Bool       // pokes are dropped
	active   map[string]string // skill -> bundle
	states   map[string]protocol.SkillState
	revision uint64
	fetched  int // files fetched

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

func startSimAgent(t *testing.T, ns *server.Server, host string, trusted []string, behave string) *simAgent {
	t.Helper()
	a := &simAgent{t: t, host: host, trusted: trusted, behave: behave, active: map[string]string{}, states: map[string]protocol.SkillState{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	a.nc = connectNATS(t, ns, "agent "+host)
	if _, err := a.nc.Subscribe(protocol.SkillsPokeSubject(host), func(*nats.Msg) {
		if !a.deaf.Load() {
			a.poke()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	go a.loop()
	a.poke()
	t.Cleanup(a.close)
	return a
}

func (a *simAgent) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *simAgent) close() {
	select {
	case <-a.stop:
		return
	default:
	}
	close(a.stop)
	<-a.done
	a.nc.Close()
}

func (a *simAgent) setHold(h chan struct{}) {
	a.mu.Lock()
	a.hold = h
	a.mu.Unlock()
}

func (a *simAgent) loop() {
	defer close(a.done)
	for {
		select {
		case <-a.stop:
			return
		case <-a.wake:
			if err := a.sync(); err != nil && !errors.Is(err, errSimStopped) {
				a.t.Logf("simulated agent %s: %v", a.host, err)
			}
		}
	}
}

var errSimStopped = errors.New("stopped")

// sync reads the desired state and acts on it.
func (a *simAgent) sync() error {
	m, err := request(a.nc, protocol.SkillsDesiredSubject(a.host), nil)
	if err != nil {
		return fmt.Errorf("read the desired state: %w", err)
	}
	var d protocol.SignedDesiredState
	if m.Header.Get("Status") == "404" {
		return nil
	}
	if err := json.Unmarshal(m.Data, &d); err != nil {
		return fmt.Errorf("desired state: %w", err)
	}
	if err := protocol.VerifyBytes(a.trusted, protocol.PurposeDesired, d.State.CanonicalBytes(), d.Signature); err != nil {
		return err
	}
	if d.State.Host != a.host || d.State.Revision < a.revision {
		return fmt.Errorf("desired state of %s revision %d refused", d.State.Host, d.State.Revision)
	}
	a.revision = d.State.Revision
	names := slices.Sorted(maps.Keys(d.State.Skills))
	for _, name := range names {
		if err := a.apply(name, d.State.Skills[name]); err != nil {
			return err
		}
	}
	return nil
}

func (a *simAgent) apply(name string, want protocol.DesiredSkill) error {
	a.mu.Lock()
	behave, hold, active := a.behave, a.hold, a.active[name]
	a.mu.Unlock()
	st := protocol.SkillState{BundleID: want.BundleID, Rollout: want.Rollout, Active: active, At: time.Now().UTC()}
	switch {
	case want.Remove:
		delete(a.active, name)
		st.State, st.Active = protocol.SkillRemoved, ""
	case active == want.BundleID:
		st.State = protocol.SkillInstalled
	case behave == simRefuse:
		st.State, st.Reason = protocol.SkillRefused, "the host policy does not allow skill "+name
	case behave == simHang:
		st.State = protocol.SkillInstalling
	default:
		if hold != nil {
			select {
			case <-hold:
			case <-a.stop:
				return errSimStopped
			}
		}
		if err := a.fetch(want.BundleID); err != nil {
			st.State, st.Reason = protocol.SkillFailed, err.Error()
		} else if behave == simFail {
			st.State, st.Reason = protocol.SkillFailed, "simulated failure"
		} else {
			a.mu.Lock()
			a.active[name] = want.BundleID
			a.mu.Unlock()
			st.State, st.Active = protocol.SkillInstalled, want.BundleID
		}
	}
	a.mu.Lock()
	a.states[name] = st
	status := protocol.SkillStatus{Host: a.host, Revision: a.revision, Skills: maps.Clone(a.states), At: time.Now().UTC()}
	a.mu.Unlock()
	data, _ := json.Marshal(&status)
	return a.nc.Publish(protocol.SkillsStatusSubject(a.host), data)
}

// fetch gets and checks a bundle's manifest and files.
func (a *simAgent) fetch(bundle string) error {
	req, _ := json.Marshal(protocol.SkillManifestRequest{BundleID: bundle})
	m, err := request(a.nc, protocol.SkillsManifestSubject(a.host), req)
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if m.Header.Get(protocol.SkillsErrorHeader) != "" {
		return fmt.Errorf("manifest: %s", m.Data)
	}
	var sm protocol.SignedManifest
	if err := json.Unmarshal(m.Data, &sm); err != nil {
		return err
	}
	if err := protocol.VerifyBytes(a.trusted, protocol.PurposeManifest, sm.Manifest.CanonicalBytes(), sm.Signature); err != nil {
		return err
	}
	if sm.Manifest.BundleID() != bundle {
		return fmt.Errorf("manifest of %s is another bundle", bundle)
	}
	for _, f := range sm.Manifest.Files {
		data, err := fetchBlob(a.nc, a.host, f.SHA256, f.Size)
		if err != nil {
			return err
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f.SHA256 {
			return fmt.Errorf("%s: digest mismatch", f.Path)
		}
		a.mu.Lock()
		a.fetched++
		a.mu.Unlock()
	}
	return nil
}

// request asks the gateways, again after a timeout: a gateway that died
// keeps its queue subscription until the server notices.
func request(nc *nats.Conn, subject string, data []byte) (*nats.Msg, error) {
	var err error
	for range 3 {
		var m *nats.Msg
		if m, err = agentRequest(nc, subject, data, 2*time.Second); !errors.Is(err, nats.ErrTimeout) {
			return m, err
		}
	}
	return nil, err
}

// fetchBlob reads a file in MaxBlobChunk parts.
func fetchBlob(nc *nats.Conn, host, digest string, size int64) ([]byte, error) {
	var out []byte
	for off := int64(0); off < size || size == 0 && off == 0; {
		req, _ := json.Marshal(protocol.SkillBlobRequest{SHA256: digest, Offset: off, Length: protocol.MaxBlobChunk})
		m, err := request(nc, protocol.SkillsBlobSubject(host), req)
		if err != nil {
			return nil, fmt.Errorf("blob %s: %w", digest, err)
		}
		if m.Header.Get(protocol.SkillsErrorHeader) != "" {
			return nil, fmt.Errorf("blob %s: %s", digest, m.Data)
		}
		out = append(out, m.Data...)
		off += int64(len(m.Data))
		if len(m.Data) == 0 {
			break
		}
	}
	return out, nil
}

// rolloutInfo returns a rollout's state from s.
func rolloutInfo(t *testing.T, s *Store, id string) protocol.RolloutInfo {
	t.Helper()
	r, err := s.rolloutByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return s.info(r, true)
}
