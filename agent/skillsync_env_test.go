//go:build unix

package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// skillGateway plays the gateway's part of a skill rollout, as the
// contract says it: an embedded NATS server in operator mode whose agents
// have the fleet's real permissions, JetStream with the desired-state
// bucket, manifests and files served on the agents' subjects, and the
// status subject listened to.
type skillGateway struct {
	fleet *opFleet
	nc    *nats.Conn
	kv    jetstream.KeyValue
	priv  ed25519.PrivateKey
	key   string // priv's public key, as agents trust it

	mu        sync.Mutex
	manifests map[string]protocol.SignedManifest // by bundle ID
	blobs     map[string][]byte                  // by digest
	rev       map[string]uint64                  // last revision written, by host
	statuses  []protocol.SkillStatus
	fetches   atomic.Int64 // manifest and blob requests served
	statusCh  chan struct{}
}

func startSkillGateway(t *testing.T) *skillGateway {
	t.Helper()
	f := startOperatorNATSWith(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate(), true)
	g := &skillGateway{fleet: f, nc: f.watcher(t), manifests: map[string]protocol.SignedManifest{},
		blobs: map[string][]byte{}, rev: map[string]uint64{}, statusCh: make(chan struct{}, 1)}
	_, g.priv, _ = ed25519.GenerateKey(nil)
	g.key = protocol.FormatSigningKey(g.priv.Public().(ed25519.PublicKey))
	js, err := jetstream.New(g.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if g.kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: protocol.SkillsDesiredBucket, History: 1}); err != nil {
		t.Fatal(err)
	}
	for subject, h := range map[string]nats.MsgHandler{
		protocol.SkillsDesiredSubjectAll:  g.serveDesired,
		protocol.SkillsManifestSubjectAll: g.serveManifest,
		protocol.SkillsBlobSubjectAll:     g.serveBlob,
	} {
		if _, err := g.nc.QueueSubscribe(subject, "gateways", h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.nc.Subscribe(protocol.SkillsStatusSubjectAll, g.onStatus); err != nil {
		t.Fatal(err)
	}
	if err := g.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return g
}

// file is one file of a test bundle.
type file struct {
	path, data string
	mode       uint32
}

// skillMD is a valid SKILL.md for name whose body says version.
func skillMD(name, version string) string {
	return "---\nname: " + name + "\ndescription: test skill " + name + "\n---\n" + version + "\n"
}

// push stores a bundle of skill name and returns its signed manifest.
func (g *skillGateway) push(name string, files ...file) protocol.SignedManifest {
	m := protocol.Manifest{Name: name}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range files {
		sum := sha256.Sum256([]byte(f.data))
		digest := hex.EncodeToString(sum[:])
		m.Files = append(m.Files, protocol.BundleFile{Path: f.path, Size: int64(len(f.data)), Mode: max(f.mode, 0o644), SHA256: digest})
		g.blobs[digest] = []byte(f.data)
	}
	protocol.SortFiles(m.Files)
	sm := protocol.SignedManifest{Manifest: m, BundleID: m.BundleID(),
		Signature: protocol.SignBytes(g.priv, protocol.PurposeManifest, m.CanonicalBytes())}
	g.manifests[sm.BundleID] = sm
	return sm
}

// version pushes a bundle of name with a SKILL.md and ref.md saying
// version, and a file only this version has.
func (g *skillGateway) version(name, version string) protocol.SignedManifest {
	return g.push(name, file{path: skillFile, data: skillMD(name, version)},
		file{path: "ref.md", data: version + "\n"},
		file{path: "only-" + version + ".md", data: version},
		file{path: "scripts/run.sh", data: "#!/bin/sh\necho " + version + "\n", mode: 0o755})
}

// manifestOf returns the bundle ID of the version pushed by version.
func (g *skillGateway) manifestOf(name, version string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id, sm := range g.manifests {
		for _, f := range sm.Manifest.Files {
			if sm.Manifest.Name == name && f.Path == "only-"+version+".md" {
				return id
			}
		}
	}
	return ""
}

// desire writes host's desired state (the next revision) and pokes it.
func (g *skillGateway) desire(t *testing.T, host string, skills map[string]protocol.DesiredSkill) uint64 {
	t.Helper()
	g.mu.Lock()
	g.rev[host]++
	rev := g.rev[host]
	g.mu.Unlock()
	g.write(t, host, protocol.DesiredState{Host: host, Revision: rev, Skills: skills, At: time.Now()}, g.priv)
	return rev
}

// write stores d, signed with priv, under host's key and pokes host.
func (g *skillGateway) write(t *testing.T, host string, d protocol.DesiredState, priv ed25519.PrivateKey) {
	t.Helper()
	data, _ := json.Marshal(protocol.SignedDesiredState{State: d, Signature: protocol.SignBytes(priv, protocol.PurposeDesired, d.CanonicalBytes())})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := g.kv.Put(ctx, host, data); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	c := protocol.Claims{Kind: protocol.MsgPoke, Host: host, Instance: instanceOf(host), MsgID: protocol.NewMsgID(), BodySHA256: sha256.Sum256(nil),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
	poke := &nats.Msg{Subject: protocol.SkillsPokeSubject(host), Header: nats.Header{protocol.HeaderAuth: {protocol.NewEnvelopeSigner(g.priv).Sign(&c)}}}
	if err := g.nc.PublishMsg(poke); err != nil {
		t.Fatal(err)
	}
}

func install(id string) protocol.DesiredSkill {
	return protocol.DesiredSkill{BundleID: id, Rollout: "r-test"}
}

// fail answers a request with an APIError.
func fail(m *nats.Msg, msg string) {
	data, _ := json.Marshal(protocol.APIError{Code: "not_found", Message: msg})
	_ = m.RespondMsg(&nats.Msg{Data: data, Header: nats.Header{protocol.SkillsErrorHeader: []string{"1"}}})
}

// serveDesired answers a host's read of its desired state as the
// gateways do: the record as the bucket keeps it, or Status 404.
func (g *skillGateway) serveDesired(m *nats.Msg) {
	host := strings.Split(m.Subject, ".")[3]
	out := nats.NewMsg(m.Reply)
	e, err := g.kv.Get(context.Background(), host)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		out.Header.Set("Status", "404")
	case err != nil:
		fail(m, err.Error())
		return
	default:
		out.Header.Set("Nats-Subject", "$KV."+protocol.SkillsDesiredBucket+"."+host)
		out.Data = e.Value()
	}
	_ = m.RespondMsg(out)
}

func (g *skillGateway) serveManifest(m *nats.Msg) {
	g.fetches.Add(1)
	var req protocol.SkillManifestRequest
	_ = json.Unmarshal(m.Data, &req)
	g.mu.Lock()
	sm, ok := g.manifests[req.BundleID]
	g.mu.Unlock()
	if !ok {
		fail(m, "no bundle "+req.BundleID)
		return
	}
	data, _ := json.Marshal(sm)
	_ = m.Respond(data)
}

func (g *skillGateway) serveBlob(m *nats.Msg) {
	g.fetches.Add(1)
	var req protocol.SkillBlobRequest
	_ = json.Unmarshal(m.Data, &req)
	g.mu.Lock()
	b, ok := g.blobs[req.SHA256]
	g.mu.Unlock()
	switch {
	case !ok:
		fail(m, "no file "+req.SHA256)
	case req.Offset < 0 || req.Length <= 0 || req.Length > protocol.MaxBlobChunk || req.Offset > int64(len(b)):
		fail(m, "bad range")
	default:
		_ = m.Respond(b[req.Offset:min(int64(len(b)), req.Offset+req.Length)])
	}
}

func (g *skillGateway) onStatus(m *nats.Msg) {
	var st protocol.SkillStatus
	if json.Unmarshal(m.Data, &st) != nil || m.Subject != protocol.SkillsStatusSubject(st.Host) {
		return
	}
	g.mu.Lock()
	g.statuses = append(g.statuses, st)
	g.mu.Unlock()
	select {
	case g.statusCh <- struct{}{}:
	default:
	}
}

// waitSkill waits for a status of host in which ok holds for skill
// name, and returns that state.
func (g *skillGateway) waitSkill(t *testing.T, host, name string, ok func(protocol.SkillStatus, protocol.SkillState) bool) protocol.SkillState {
	t.Helper()
	return g.waitSkillSince(t, 0, host, name, ok)
}

// mark returns how many statuses have arrived, for waitSkillSince.
func (g *skillGateway) mark() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.statuses)
}

// waitSkillSince is waitSkill for the statuses that arrived after the
// first seen (a mark).
func (g *skillGateway) waitSkillSince(t *testing.T, seen int, host, name string, ok func(protocol.SkillStatus, protocol.SkillState) bool) protocol.SkillState {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		g.mu.Lock()
		all := g.statuses[seen:]
		seen = len(g.statuses)
		g.mu.Unlock()
		for _, st := range all {
			if s, found := st.Skills[name]; found && st.Host == host && ok(st, s) {
				return s
			}
		}
		select {
		case <-g.statusCh:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			g.mu.Lock()
			last := g.statuses
			g.mu.Unlock()
			t.Fatalf("no status of %s with the awaited state of skill %s within 20s; statuses: %+v", host, name, last)
		}
	}
}

// waitState waits for skill name of host in state for bundle id at
// revision rev or later.
func (g *skillGateway) waitState(t *testing.T, host, name, state, id string, rev uint64) protocol.SkillState {
	t.Helper()
	return g.waitSkill(t, host, name, func(st protocol.SkillStatus, s protocol.SkillState) bool {
		return st.Revision >= rev && s.State == state && s.BundleID == id
	})
}

// skillAgent is an agent of the fleet, run until stopped.
type skillAgent struct {
	a       *Agent
	root    string
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// runSkillAgent runs an agent called host with g's signing key trusted
// (unless cfg says otherwise) and the given state directory.
func (g *skillGateway) runSkillAgent(t *testing.T, host string, cfg Config, setup func(*Agent)) *skillAgent {
	t.Helper()
	cfg.Servers = []string{g.fleet.ns.ClientURL()}
	cfg.Name = host
	cfg.Credentials = g.fleet.credentials(t, host, time.Now().Add(time.Hour))
	if cfg.GatewayKeys == nil {
		cfg.GatewayKeys = []string{g.key}
	}
	if cfg.Cwd == "" {
		cfg.Cwd = t.TempDir()
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	cfg.Logger = quietLogger()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	trackInstance(t, a)
	if setup != nil {
		setup(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &skillAgent{a: a, root: a.cfg.FleetSkillsDir, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop stops the agent and waits for Run to return.
func (r *skillAgent) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	if r.stopped {
		return
	}
	select {
	case <-r.done:
		r.stopped = true
	case <-time.After(15 * time.Second):
		t.Fatal("the agent did not stop within 15s")
	}
}

// call runs one of the agent's tools.
func (r *skillAgent) call(t *testing.T, tool string, args map[string]any) *protocol.Result {
	t.Helper()
	data, _ := json.Marshal(args)
	f, ok := r.a.served().tools[tool]
	if !ok {
		t.Fatalf("the agent serves no %s tool", tool)
	}
	return f(context.Background(), &toolCall{ID: "c1", Args: data, Caller: "test", Output: func([]byte) {}})
}

// skillText returns what the agent's skill tool answers for name.
func (r *skillAgent) skill(t *testing.T, name string) (string, bool) {
	t.Helper()
	res := r.call(t, "skill", map[string]any{"name": name})
	if res.Error != nil || res.IsError || len(res.Content) != 1 {
		if len(res.Content) == 1 {
			return res.Content[0].Text, false
		}
		return "", false
	}
	return res.Content[0].Text, true
}

// linkTarget returns where <root>/<name> leads ("" if it is no link).
func (r *skillAgent) linkTarget(name string) string {
	target, _ := os.Readlink(filepath.Join(r.root, name))
	return target
}

// versionDirs lists the version folders of name on disk.
func (r *skillAgent) versionDirs(name string) []string {
	entries, _ := os.ReadDir(filepath.Join(r.root, fleetDir, name))
	var out []string
	for _, e := range entries {
		if e.IsDir() && len(e.Name()) == 12 {
			out = append(out, e.Name())
		}
	}
	return out
}

func mustContain(t *testing.T, what, s string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(s, w) {
			t.Errorf("%s: %q does not contain %q", what, s, w)
		}
	}
}
