//go:build unix

package agent

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestSkillRolloutLifecycle: a rollout installs a skill (a versioned
// folder behind the fleet's link, files with their modes, served by the
// catalog and the skill tool through the link, .fleet hidden); a second
// one upgrades it; going back to the first fetches nothing (it is still
// on disk); only 3 versions stay; remove deletes the link and versions.
func TestSkillRolloutLifecycle(t *testing.T) {
	g := startSkillGateway(t)
	r := g.runSkillAgent(t, "web-1", Config{}, nil)
	v1, v2 := g.version("deploy", "v1"), g.version("deploy", "v2")

	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	s := g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	if s.Active != v1.BundleID || s.Rollout != "r-test" || s.Reason != "" {
		t.Errorf("installed state %+v", s)
	}
	if want := filepath.Join(fleetDir, "deploy", shortID(v1.BundleID)); r.linkTarget("deploy") != want {
		t.Errorf("link = %q, want %q", r.linkTarget("deploy"), want)
	}
	text, ok := r.skill(t, "deploy")
	if !ok {
		t.Fatalf("skill tool: %s", text)
	}
	mustContain(t, "skill tool", text, "v1\n", "only-v1.md", "ref.md", "scripts/run.sh")
	fi, err := os.Stat(filepath.Join(r.root, "deploy", "scripts", "run.sh"))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("run.sh: %v %v, want mode 0755", fi, err)
	}
	skills := r.a.skills.list()
	if len(skills) != 1 || skills[0].Name != "deploy" || skills[0].Problem != "" ||
		skills[0].Path != filepath.Join(r.root, "deploy", skillFile) {
		t.Errorf("catalog = %+v, want deploy alone, served through its link (and .fleet hidden)", skills)
	}
	if text, ok := r.skill(t, fleetDir); ok {
		t.Errorf("the skill tool serves .fleet: %s", text)
	}

	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v2.BundleID, rev)
	if text, _ := r.skill(t, "deploy"); !strings.Contains(text, "only-v2.md") || strings.Contains(text, "only-v1.md") {
		t.Errorf("after the upgrade the skill tool says:\n%s", text)
	}

	before := g.fetches.Load()
	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	if n := g.fetches.Load() - before; n != 0 {
		t.Errorf("the rollback to a version still on disk fetched %d times", n)
	}
	if text, _ := r.skill(t, "deploy"); !strings.Contains(text, "only-v1.md") {
		t.Errorf("after the rollback the skill tool says:\n%s", text)
	}

	for _, v := range []string{"v3", "v4"} {
		sm := g.version("deploy", v)
		rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(sm.BundleID)})
		g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, sm.BundleID, rev)
	}
	// Kept: v4 (served), v3, and v1, served more recently than v2.
	want := []string{shortID(v1.BundleID), shortID(g.manifestOf("deploy", "v3")), shortID(g.manifestOf("deploy", "v4"))}
	slices.Sort(want)
	if dirs := r.versionDirs("deploy"); !slices.Equal(dirs, want) {
		t.Errorf("versions kept: %v, want %v (v1 %s, v2 %s)", dirs, want, shortID(v1.BundleID), shortID(v2.BundleID))
	}

	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": {Remove: true, Rollout: "r-rm"}})
	g.waitSkill(t, "web-1", "deploy", func(st protocol.SkillStatus, s protocol.SkillState) bool {
		return st.Revision >= rev && s.State == protocol.SkillRemoved
	})
	if _, err := os.Lstat(filepath.Join(r.root, "deploy")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link is still there: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(r.root, fleetDir, "deploy")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the versions are still there: %v", err)
	}
	if skills := r.a.skills.list(); len(skills) != 0 {
		t.Errorf("catalog after remove: %+v", skills)
	}
}

var versionLine = regexp.MustCompile(`(?m)^(v[0-9])$`)

// TestSkillUpgradeReaderSeesOneVersion: readers using the skill tool
// (SKILL.md and the list of files), then reading another file of the
// folder it names, while rollouts swap two versions back and forth,
// always see one version, never a mix.
func TestSkillUpgradeReaderSeesOneVersion(t *testing.T) {
	g := startSkillGateway(t)
	r := g.runSkillAgent(t, "web-1", Config{}, nil)
	v1, v2 := g.version("deploy", "v1"), g.version("deploy", "v2")
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)

	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				text, ok := r.skill(t, "deploy")
				if !ok {
					errs <- "skill tool failed: " + text
					return
				}
				m := versionLine.FindStringSubmatch(text)
				folder := regexp.MustCompile(`\[skill deploy: folder (.*)\]`).FindStringSubmatch(text)
				if m == nil || folder == nil {
					errs <- "no version or folder in: " + text
					return
				}
				v := m[1]
				other := map[string]string{"v1": "v2", "v2": "v1"}[v]
				if !strings.Contains(text, "only-"+v+".md") || strings.Contains(text, "only-"+other+".md") {
					errs <- "SKILL.md of " + v + " with the files of another version: " + text
					return
				}
				res := r.call(t, "read", map[string]any{"path": filepath.Join(folder[1], "ref.md")})
				if res.IsError || res.Error != nil || len(res.Content) == 0 || !strings.Contains(res.Content[0].Text, v) {
					errs <- "SKILL.md of " + v + " but ref.md: " + skillResultText(res)
					return
				}
				reads.Add(1)
			}
		})
	}
	for i := range 6 {
		id := []string{v2.BundleID, v1.BundleID}[i%2]
		rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(id)})
		g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, id, rev)
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if reads.Load() == 0 {
		t.Error("no read completed")
	}
	t.Logf("%d consistent reads across 6 swaps", reads.Load())
}

func skillResultText(r *protocol.Result) string {
	if r.Error != nil {
		return r.Error.Message
	}
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// TestSkillRolloutRefusedByPolicy: a skill the host policy refuses is
// refused with the rule, and nothing is fetched.
func TestSkillRolloutRefusedByPolicy(t *testing.T) {
	g := startSkillGateway(t)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("skills: {deny: [\"deploy\"]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := g.runSkillAgent(t, "web-1", Config{PolicyFile: pol}, nil)
	v1 := g.version("deploy", "v1")
	before := g.fetches.Load()
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	s := g.waitState(t, "web-1", "deploy", protocol.SkillRefused, v1.BundleID, rev)
	mustContain(t, "reason", s.Reason, "host policy", "skills.deny")
	if n := g.fetches.Load() - before; n != 0 {
		t.Errorf("a refused skill was fetched (%d requests)", n)
	}
	if _, err := os.Lstat(filepath.Join(r.root, "deploy")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused skill is on disk: %v", err)
	}
}

// TestSkillRolloutFailures: what is wrong with a rollout fails it with
// the reason, and the version installed before stays served.
func TestSkillRolloutFailures(t *testing.T) {
	_, otherKey, _ := ed25519.GenerateKey(nil)
	for _, tc := range []struct {
		name string
		// spoil makes the rollout of v2 bad, and rolls it out.
		spoil func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) (rev uint64)
		want  string
	}{
		{"tampered manifest", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			g.mu.Lock()
			sm := g.manifests[v2.BundleID]
			sm.Manifest.Files = slices.Clone(sm.Manifest.Files)
			sm.Manifest.Files[0].Size++ // the ID now differs from what was signed
			g.manifests[v2.BundleID] = sm
			g.mu.Unlock()
			return g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
		}, "signature does not verify"},
		{"wrong bundle", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			other := g.version("deploy", "v3")
			g.mu.Lock()
			g.manifests[v2.BundleID] = other // signed, valid, but not the one asked for
			g.mu.Unlock()
			return g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
		}, "when " + v2Placeholder + " was asked for"},
		{"bad digest", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			g.mu.Lock()
			for _, f := range v2.Manifest.Files {
				if f.Path == "ref.md" {
					g.blobs[f.SHA256] = []byte("v9\n") // same size, other bytes
				}
			}
			g.mu.Unlock()
			return g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
		}, "ref.md: the fetched file has SHA-256"},
		{"wrong size", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			g.mu.Lock()
			for _, f := range v2.Manifest.Files {
				if f.Path == "ref.md" {
					g.blobs[f.SHA256] = []byte("v2") // shorter
				}
			}
			g.mu.Unlock()
			return g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
		}, "not the size the manifest says"},
		{"untrusted key", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			g.rev["web-1"]++
			d := protocol.DesiredState{Host: "web-1", Revision: g.rev["web-1"], Skills: map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)}, At: time.Now()}
			g.write(t, "web-1", d, otherKey)
			return 0
		}, "not a gateway key this agent trusts"},
		{"another host's state", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			g.rev["web-1"]++
			d := protocol.DesiredState{Host: "web-2", Revision: g.rev["web-1"], Skills: map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)}, At: time.Now()}
			g.write(t, "web-1", d, g.priv)
			return 0
		}, `for host "web-2", not this one`},
		{"older revision", func(t *testing.T, g *skillGateway, v2 *protocol.SignedManifest) uint64 {
			d := protocol.DesiredState{Host: "web-1", Revision: g.rev["web-1"] - 1, Skills: map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)}, At: time.Now()}
			g.write(t, "web-1", d, g.priv)
			return 0
		}, "older than revision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startSkillGateway(t)
			r := g.runSkillAgent(t, "web-1", Config{}, nil)
			v1, v2 := g.version("deploy", "v1"), g.version("deploy", "v2")
			rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
			g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
			rev = tc.spoil(t, g, &v2)
			s := g.waitState(t, "web-1", "deploy", protocol.SkillFailed, v2.BundleID, rev)
			mustContain(t, "reason", s.Reason, strings.ReplaceAll(tc.want, v2Placeholder, v2.BundleID))
			if s.Active != v1.BundleID {
				t.Errorf("active after the failure = %s, want v1 %s", s.Active, v1.BundleID)
			}
			if text, ok := r.skill(t, "deploy"); !ok || !strings.Contains(text, "only-v1.md") {
				t.Errorf("after the failure the skill tool says:\n%s", text)
			}
			if dirs := r.versionDirs("deploy"); len(dirs) != 1 {
				t.Errorf("version folders after the failure: %v", dirs)
			}
			if left := leftovers(t, r.root); len(left) > 0 {
				t.Errorf("a failed install left %v", left)
			}
		})
	}
}

const v2Placeholder = "<v2>"

// leftovers lists staging folders and temporary links under root.
func leftovers(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	_ = filepath.WalkDir(filepath.Join(root, fleetDir), func(p string, d os.DirEntry, err error) error {
		if err == nil && (strings.HasPrefix(d.Name(), stagingPrefix) || strings.HasPrefix(d.Name(), linkPrefix)) {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestSkillRolloutNoTrustedKey: an agent that learnt no gateway key
// refuses every rollout and says how to mend it.
func TestSkillRolloutNoTrustedKey(t *testing.T) {
	g := startSkillGateway(t)
	// The state is desired before the agent starts: it reads it when it
	// connects. A poke it cannot check (it trusts no key) is not heard,
	// so a state desired after that first read would wait for its timer.
	v1 := g.version("deploy", "v1")
	g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	r := g.runSkillAgent(t, "web-1", Config{GatewayKeys: []string{}}, nil)
	s := g.waitState(t, "web-1", "deploy", protocol.SkillFailed, v1.BundleID, 0)
	mustContain(t, "reason", s.Reason, "no gateway signing key", "re-enrol")
	if r.linkTarget("deploy") != "" {
		t.Error("installed without a trusted key")
	}
}

// TestSkillRolloutShadowsHostSkill: a host skill of the name of a skill
// the fleet installs stays where it is, untouched, and hidden while the
// fleet's is installed: whoever may write in the host's skills folder
// cannot stand in for the fleet's skill. Once the fleet's is removed, the
// host's is served again.
func TestSkillRolloutShadowsHostSkill(t *testing.T) {
	g := startSkillGateway(t)
	cwd := t.TempDir()
	hand := filepath.Join(cwd, ".agents", "skills", "deploy")
	if err := os.MkdirAll(hand, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hand, skillFile), []byte(skillMD("deploy", "hand")), 0o644); err != nil {
		t.Fatal(err)
	}
	r := g.runSkillAgent(t, "web-1", Config{Cwd: cwd}, nil)
	if text, _ := r.skill(t, "deploy"); !strings.Contains(text, "hand") {
		t.Fatalf("skill tool before the rollout:\n%s", text)
	}
	v1 := g.version("deploy", "v1")
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	s := g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	if s.Reason != "" {
		t.Errorf("reason %q, want none", s.Reason)
	}
	if text, _ := r.skill(t, "deploy"); !strings.Contains(text, "only-v1.md") || strings.Contains(text, "hand") {
		t.Errorf("skill tool while the fleet's is installed:\n%s", text)
	}
	if skills := r.a.skills.list(); len(skills) != 1 || skills[0].Path != filepath.Join(r.root, "deploy", skillFile) {
		t.Errorf("catalog = %+v, want the fleet's deploy alone", skills)
	}
	if data, err := os.ReadFile(filepath.Join(hand, skillFile)); err != nil || !strings.Contains(string(data), "hand") {
		t.Errorf("the host's SKILL.md: %q %v", data, err)
	}
	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": {Remove: true}})
	g.waitSkill(t, "web-1", "deploy", func(st protocol.SkillStatus, s protocol.SkillState) bool {
		return st.Revision >= rev && s.State == protocol.SkillRemoved
	})
	waitUntil(t, "the host's skill is served again", func() bool {
		text, ok := r.skill(t, "deploy")
		return ok && strings.Contains(text, "hand")
	})
}

// TestSkillRolloutCrashRecovery: an agent killed mid-install leaves a
// staging folder, or a complete version whose link was not swapped yet,
// or a version without its manifest; the served link still points at a
// complete version, and after a restart the leftovers are gone and the
// install is finished.
func TestSkillRolloutCrashRecovery(t *testing.T) {
	g := startSkillGateway(t)
	cwd, state := t.TempDir(), t.TempDir()
	r := g.runSkillAgent(t, "web-1", Config{Cwd: cwd, StateDir: state}, nil)
	v1, v2 := g.version("deploy", "v1"), g.version("deploy", "v2")
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	r.stop(t)

	// The crash: v2 staged and renamed into place, the link not swapped;
	// another install's staging folder and temporary link; a version
	// folder whose manifest was never written.
	store := &skillStore{root: r.root, log: quietLogger()}
	if err := store.stage(t.Context(), &mapBundles{g}, &v2.Manifest); err != nil {
		t.Fatal(err)
	}
	dir := store.versionsDir("deploy")
	junk := []string{
		filepath.Join(dir, stagingPrefix+"0123456789ab-1", "SKILL.md"),
		filepath.Join(dir, "abcdefabcdef", "SKILL.md"),
	}
	for _, p := range junk {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("nowhere", filepath.Join(dir, linkPrefix+"x")); err != nil {
		t.Fatal(err)
	}
	if got := r.linkTarget("deploy"); got != filepath.Join(fleetDir, "deploy", shortID(v1.BundleID)) {
		t.Fatalf("the served link moved before the swap: %q", got)
	}
	g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})

	before := g.fetches.Load()
	r2 := g.runSkillAgent(t, "web-1", Config{Cwd: cwd, StateDir: state}, nil)
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v2.BundleID, 0)
	if n := g.fetches.Load() - before; n != 0 {
		t.Errorf("finishing an install whose version was complete on disk fetched %d times", n)
	}
	if text, _ := r2.skill(t, "deploy"); !strings.Contains(text, "only-v2.md") {
		t.Errorf("skill tool after restart:\n%s", text)
	}
	if left := leftovers(t, r2.root); len(left) > 0 {
		t.Errorf("leftovers after restart: %v", left)
	}
	if _, err := os.Stat(filepath.Dir(junk[1])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a version without its manifest was kept: %v", err)
	}
}

// mapBundles serves the test gateway's bundles without NATS, to stage a
// version as an agent would have before it crashed.
type mapBundles struct{ g *skillGateway }

func (m *mapBundles) manifest(_ context.Context, id string) (*protocol.SignedManifest, error) {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	sm := m.g.manifests[id]
	return &sm, nil
}

func (m *mapBundles) blob(_ context.Context, sha string, off, n int64) ([]byte, error) {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return m.g.blobs[sha][off : off+n], nil
}

// TestSkillPokeReadsAtOnce: a poke makes the agent read its desired state
// within a second, however long its timer.
func TestSkillPokeReadsAtOnce(t *testing.T) {
	g := startSkillGateway(t)
	g.runSkillAgent(t, "web-1", Config{}, func(a *Agent) { a.skillSync.every = time.Hour })
	v1 := g.version("deploy", "v1")
	// The agent reads on connect; wait for that read's status.
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	v2 := g.version("deploy", "v2")
	start := time.Now()
	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
	g.waitSkill(t, "web-1", "deploy", func(st protocol.SkillStatus, s protocol.SkillState) bool {
		return st.Revision >= rev
	})
	took := time.Since(start)
	t.Logf("poke to read: %s", took)
	if took > time.Second {
		t.Errorf("the poked agent read its desired state after %s, want within a second", took)
	}
}

// TestSkillDesiredPermissions: an agent may ask for its own desired
// state and not another host's, and may publish no JetStream API request
// at all: JetStream answers on whatever reply subject a request names, so
// a direct get of its own key with another host's key as the reply
// subject would write that key.
func TestSkillDesiredPermissions(t *testing.T) {
	g := startSkillGateway(t)
	g.desire(t, "web-2", map[string]protocol.DesiredSkill{"deploy": install(g.version("deploy", "v1").BundleID)})
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	token := g.fleet.agentJWT(t, kp, "web-1", time.Now().Add(time.Hour))
	violations := make(chan error, 4)
	nc, err := nats.Connect(g.fleet.ns.ClientURL(), nats.UserJWTAndSeed(token, string(seed)),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix("web-1")),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msg, err := nc.Request(protocol.SkillsDesiredSubject("web-1"), nil, 5*time.Second)
	if err != nil {
		t.Fatalf("own desired state: %v", err)
	}
	if _, err := decodeDesiredReply("web-1", msg.Header, msg.Data); !errors.Is(err, errNoDesired) {
		t.Errorf("own desired state (no record): %v, want no desired state", err)
	}
	before, err := g.kv.Get(context.Background(), "web-2")
	if err != nil {
		t.Fatal(err)
	}
	forged := "$JS.API.DIRECT.GET.KV_" + protocol.SkillsDesiredBucket + ".$KV." + protocol.SkillsDesiredBucket + ".web-1"
	if err := nc.PublishRequest(forged, "$KV."+protocol.SkillsDesiredBucket+".web-2", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-violations:
		if !errors.Is(v, nats.ErrPermissionViolation) || !strings.Contains(v.Error(), "$JS.API") {
			t.Errorf("violation %v", v)
		}
	case <-time.After(5 * time.Second):
		t.Error("the server did not refuse the agent's JetStream API request")
	}
	if after, err := g.kv.Get(context.Background(), "web-2"); err != nil || after.Revision() != before.Revision() {
		t.Errorf("web-2's desired state changed after web-1's forged request: %v", err)
	}
	_, err = nc.Request(protocol.SkillsDesiredSubject("web-2"), nil, time.Second)
	if err == nil {
		t.Fatal("the agent of web-1 read web-2's desired state")
	}
	select {
	case v := <-violations:
		if !errors.Is(v, nats.ErrPermissionViolation) || !strings.Contains(v.Error(), "web-2") {
			t.Errorf("violation %v", v)
		}
	case <-time.After(5 * time.Second):
		t.Error("the server did not report a permissions violation for another host's key")
	}
}

// TestSkillRolloutPlantedLink: a link planted where the agent keeps the
// versions (by anyone who may write in the skills folder) does not lead
// it to write, or delete, elsewhere: the rollout fails and says why.
func TestSkillRolloutPlantedLink(t *testing.T) {
	g := startSkillGateway(t)
	cwd, state := t.TempDir(), t.TempDir()
	var elsewhere []string
	// One in the fleet's folder (where only the agent and root write),
	// one where an older agent kept the fleet's skills.
	for _, root := range []string{filepath.Join(state, "skills"), filepath.Join(cwd, ".agents", "skills")} {
		dir := t.TempDir()
		elsewhere = append(elsewhere, dir)
		if err := os.MkdirAll(filepath.Join(root, fleetDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(dir, filepath.Join(root, fleetDir, "deploy")); err != nil {
			t.Fatal(err)
		}
	}
	g.runSkillAgent(t, "web-1", Config{Cwd: cwd, StateDir: state}, nil)
	v1 := g.version("deploy", "v1")
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	s := g.waitState(t, "web-1", "deploy", protocol.SkillFailed, v1.BundleID, rev)
	mustContain(t, "reason", s.Reason, "is not a folder", "remove it")
	rev = g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": {Remove: true}})
	g.waitSkill(t, "web-1", "deploy", func(st protocol.SkillStatus, s protocol.SkillState) bool { return st.Revision >= rev })
	for _, dir := range elsewhere {
		entries, _ := os.ReadDir(dir)
		if len(entries) != 1 || entries[0].Name() != "keep" {
			t.Errorf("the agent wrote or deleted through the planted link to %s: %v", dir, entries)
		}
	}
}

// put writes host's desired state without poking it.
func (g *skillGateway) put(t *testing.T, host string, skills map[string]protocol.DesiredSkill) uint64 {
	t.Helper()
	g.mu.Lock()
	g.rev[host]++
	rev := g.rev[host]
	g.mu.Unlock()
	d := protocol.DesiredState{Host: host, Revision: rev, Skills: skills, At: time.Now()}
	data, _ := json.Marshal(protocol.SignedDesiredState{State: d, Signature: protocol.SignBytes(g.priv, protocol.PurposeDesired, d.CanonicalBytes())})
	if _, err := g.kv.Put(t.Context(), host, data); err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestSkillReadOnReconnectAndTimer: a record written while no poke
// reached the agent is read when its connection comes back, and, failing
// that, by its timer.
func TestSkillReadOnReconnectAndTimer(t *testing.T) {
	t.Run("reconnect", func(t *testing.T) {
		g := startSkillGateway(t)
		g.runSkillAgent(t, "web-1", Config{ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond},
			func(a *Agent) { a.skillSync.every = time.Hour })
		v1 := g.version("deploy", "v1")
		rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
		g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
		v2 := g.version("deploy", "v2")
		rev = g.put(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
		connz, err := g.fleet.ns.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range connz.Conns {
			if c.Name == "fleet-agent web-1" {
				if err := g.fleet.ns.DisconnectClientByID(c.Cid); err != nil {
					t.Fatal(err)
				}
			}
		}
		g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v2.BundleID, rev)
	})
	t.Run("timer", func(t *testing.T) {
		g := startSkillGateway(t)
		g.runSkillAgent(t, "web-1", Config{}, func(a *Agent) { a.skillSync.every = 200 * time.Millisecond })
		v1 := g.version("deploy", "v1")
		rev := g.put(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
		g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	})
}

// TestSkillRevisionSurvivesRestart: the revision acted on is kept in the
// state directory, so an older record handed to a restarted agent is
// refused too.
func TestSkillRevisionSurvivesRestart(t *testing.T) {
	g := startSkillGateway(t)
	cwd, state := t.TempDir(), t.TempDir()
	r := g.runSkillAgent(t, "web-1", Config{Cwd: cwd, StateDir: state}, nil)
	v1, v2 := g.version("deploy", "v1"), g.version("deploy", "v2")
	g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)})
	rev := g.desire(t, "web-1", map[string]protocol.DesiredSkill{"deploy": install(v1.BundleID)})
	g.waitState(t, "web-1", "deploy", protocol.SkillInstalled, v1.BundleID, rev)
	r.stop(t)
	old := protocol.DesiredState{Host: "web-1", Revision: rev - 1, Skills: map[string]protocol.DesiredSkill{"deploy": install(v2.BundleID)}, At: time.Now()}
	g.write(t, "web-1", old, g.priv)
	g.runSkillAgent(t, "web-1", Config{Cwd: cwd, StateDir: state}, nil)
	s := g.waitState(t, "web-1", "deploy", protocol.SkillFailed, v2.BundleID, rev)
	mustContain(t, "reason", s.Reason, "older than revision")
	if s.Active != v1.BundleID {
		t.Errorf("active %s, want v1", s.Active)
	}
}

// TestConfigGatewayKeys: a trusted key that is not one is refused at
// start, saying what to do.
func TestConfigGatewayKeys(t *testing.T) {
	_, err := New(Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "web-1", StateDir: t.TempDir(), Cwd: t.TempDir(),
		GatewayKeys: []string{"ed25519:nope"}, Logger: quietLogger()})
	if err == nil || !strings.Contains(err.Error(), "gateway signing keys") || !strings.Contains(err.Error(), "fleet-agent join") {
		t.Errorf("New with a bad gateway key: %v", err)
	}
}

// TestSkillNoBucketYet: before any rollout there is no desired-skills
// bucket: the agent still reports its status on connect, and does not
// warn about it.
func TestSkillNoBucketYet(t *testing.T) {
	f := startOperatorNATSWith(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate(), true)
	status, err := f.watcher(t).SubscribeSync(protocol.SkillsStatusSubjectAll)
	if err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	g := &skillGateway{fleet: f}
	g.runSkillAgent(t, "web-1", Config{GatewayKeys: []string{}}, func(a *Agent) {
		a.skillSync.log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))
		a.skillSync.retry = 10 * time.Millisecond
	})
	m, err := status.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no status on connect: %v", err)
	}
	var st protocol.SkillStatus
	if err := json.Unmarshal(m.Data, &st); err != nil || st.Host != "web-1" || m.Subject != protocol.SkillsStatusSubject("web-1") {
		t.Errorf("status %s on %s: %v", m.Data, m.Subject, err)
	}
	if out := log.String(); strings.Contains(out, "level=WARN") {
		t.Errorf("the agent warned about a missing bucket:\n%s", out)
	}
}
