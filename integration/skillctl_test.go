//go:build linux

package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// skillHost is a real in-process agent of the rollout test.
type skillHost struct {
	name      string
	skillsDir string
	policy    string // the host policy file, read when there is one at start
	start     func() // starts the agent (once)
}

// TestSkillRolloutWithFleetctl is skill rollout as an operator runs it:
// fleetctl (the real binary) pushes a skill folder to a gateway process
// through its fleet API, rolls it out to twelve real agents that enrolled
// over HTTPS, follows it, and rolls it back. One host is offline when the
// rollout starts and installs when it comes back; one host's policy
// denies the skill (refused); one cannot install it (its fleet skills
// folder's .fleet is a file), so the rollout, allowed no errors, pauses. Each
// host's files are checked byte for byte on disk, and the rollback puts
// the previous version back where there was one and removes the skill
// elsewhere.
func TestSkillRolloutWithFleetctl(t *testing.T) {
	token, line, err := access.NewAPIToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "api-tokens.yaml")
	writeFile(t, tokens, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n")
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	gw := launchGatewayProcess(t, token, "--api_tokens", tokens, "--api_listen", apiAddr)
	apiURL := "https://" + apiAddr
	pin := gatewayCAPin(t, gw)
	ctl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, fleetctlBinary(t), append([]string{"--gateway", apiURL, "--ca_pin", pin}, args...)...)
		cmd.Env = append(os.Environ(), "FLEET_API_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	mustCtl := func(args ...string) string {
		t.Helper()
		out, err := ctl(args...)
		if err != nil {
			t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	status := func(id string) protocol.RolloutInfo {
		t.Helper()
		var info protocol.RolloutInfo
		if out := mustCtl("skills", "status", id, "--json"); json.Unmarshal([]byte(out), &info) != nil {
			t.Fatalf("skills status --json printed %s", out)
		}
		return info
	}

	// Twelve hosts enrol with a join token fleetctl made.
	out := mustCtl("token", "create", "--labels", "role=skilltest", "--uses", "12", "--name_pattern", "sk-*", "--ttl", "10m")
	join := regexp.MustCompile(`fmcp1\.[a-z2-7]{10}\.[A-Za-z0-9_-]{43}`).FindString(out)
	if join == "" {
		t.Fatalf("token create printed no token:\n%s", out)
	}
	hosts := make([]*skillHost, 12)
	for i := range hosts {
		hosts[i] = enrolSkillHost(t, apiURL, pin, join, fmt.Sprintf("sk-%02d", i))
	}
	denied, broken, away := hosts[10], hosts[11], hosts[9]
	writeFile(t, denied.policy, "skills: {deny: [deploy]}\n")
	if err := os.MkdirAll(broken.skillsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(broken.skillsDir, ".fleet"), "not a folder\n")
	for _, h := range hosts {
		if h != away {
			h.start()
		}
	}
	waitFor(t, 30*time.Second, "eleven hosts online", func() bool {
		out, err := ctl("agent", "list")
		return err == nil && strings.Count(out, " online ") == 11
	})

	// Version 1 goes to the first six hosts.
	v1 := map[string]string{
		"SKILL.md":       "---\nname: deploy\ndescription: Deploys the app.\n---\nRun scripts/run.sh.\n",
		"scripts/run.sh": "#!/bin/sh\necho deploying v1\n",
		"reference.md":   "version one\n",
	}
	dir := filepath.Join(t.TempDir(), "deploy")
	writeSkillFolder(t, dir, v1)
	out = mustCtl("skills", "push", dir)
	bundle1 := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(out)
	if bundle1 == "" || !strings.Contains(out, "a new version") {
		t.Fatalf("skills push printed:\n%s", out)
	}
	// skill_push of the same folder (read through a host's agent) is the
	// same version.
	same := structured(t, call(t, gw.Client(), "skill_push", map[string]any{"host": "sk-00", "path": dir}))
	if same["bundle_id"] != bundle1 || same["created"] != false {
		t.Fatalf("skill_push of the folder fleetctl pushed = %v; want %s, not created", same, bundle1)
	}
	for _, h := range hosts[:6] {
		mustCtl("agent", "label", h.name, "role=skilltest", "wave=first")
	}
	out = mustCtl("skills", "rollout", "deploy", "--selector", "wave=first", "--canary", "1", "--batch", "50%")
	first := regexp.MustCompile(`Rollout (r-[a-z2-7]+) started`).FindStringSubmatch(out)
	if first == nil {
		t.Fatalf("skills rollout printed:\n%s", out)
	}
	waitFor(t, time.Minute, "the first rollout is done", func() bool { return status(first[1]).State == protocol.RolloutDone })
	for _, h := range hosts[:6] {
		checkSkillFiles(t, h, bundle1, v1)
	}

	// Version 2 (one file changed, one added, one gone) to all twelve,
	// allowed no errors.
	v2 := map[string]string{
		"SKILL.md":       v1["SKILL.md"],
		"scripts/run.sh": "#!/bin/sh\necho deploying v2\n",
		"checklist.md":   "- check the health endpoint\n",
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	writeSkillFolder(t, dir, v2)
	bundle2 := regexp.MustCompile(`sha256:[0-9a-f]{64}`).FindString(mustCtl("skills", "push", dir))
	if bundle2 == "" || bundle2 == bundle1 {
		t.Fatalf("the second push is %q (the first %s)", bundle2, bundle1)
	}
	out = mustCtl("skills", "rollout", "deploy@"+strings.TrimPrefix(bundle2, "sha256:")[:10], "--selector", "role=skilltest",
		"--canary", "1", "--batch", "4", "--max_errors", "0", "--batch_timeout", "2m")
	second := regexp.MustCompile(`Rollout (r-[a-z2-7]+) started: deploy (\S+) to 12 hosts`).FindStringSubmatch(out)
	if second == nil || second[2] != bundle2 {
		t.Fatalf("skills rollout printed:\n%s", out)
	}
	id := second[1]
	// It pauses as soon as one host fails; the others of that batch may
	// report after that.
	waitFor(t, 90*time.Second, "the rollout paused on the host that fails, every host of its batch reported", func() bool {
		in := status(id)
		if in.State != protocol.RolloutPaused {
			return false
		}
		for _, h := range in.HostStates {
			if h.Host == denied.name && h.State != protocol.SkillRefused {
				return false
			}
		}
		return true
	})
	info := status(id)
	states := map[string]protocol.RolloutHost{}
	for _, h := range info.HostStates {
		states[h.Host] = h
	}
	for _, h := range hosts[:9] {
		if st := states[h.name]; st.State != protocol.SkillInstalled || st.Active != bundle2 {
			t.Errorf("%s: %+v; want installed %s", h.name, st, bundle2)
		}
		checkSkillFiles(t, h, bundle2, v2)
	}
	if st := states[away.name]; st.State != protocol.RolloutHostOffline {
		t.Errorf("%s (offline): %+v", away.name, st)
	}
	if st := states[denied.name]; st.State != protocol.SkillRefused || !strings.Contains(st.Reason, "skills.deny") && !strings.Contains(st.Reason, "refused on this host") {
		t.Errorf("%s (policy denies deploy): %+v", denied.name, st)
	}
	if st := states[broken.name]; st.State != protocol.SkillFailed || st.Reason == "" {
		t.Errorf("%s (cannot install): %+v", broken.name, st)
	}
	checkNoSkill(t, denied)
	// The MCP Skills extension serves the version rolled out last, its
	// files' digests those of the files on the hosts.
	skills := skillsClient(t, gw.MCPURL, "", token)
	checkServedSkill(t, skills, hosts[0])
	// The table says the same, aligned.
	table := mustCtl("skills", "status", id)
	for _, want := range []string{
		`State: +paused, batch \d+ of 4`,
		`(?m)^sk-00 +installed +sha256:` + strings.TrimPrefix(bundle2, "sha256:")[:12] + ` +-$`,
		`(?m)^sk-09 +offline +- +-$`,
		`(?m)^sk-10 +refused +- +.*skill deploy is refused on this host`,
		`(?m)^sk-11 +failed +- +\S`,
	} {
		if !regexp.MustCompile(want).MatchString(table) {
			t.Errorf("skills status does not match %s:\n%s", want, table)
		}
	}

	// The offline host comes back and installs version 2.
	away.start()
	waitFor(t, time.Minute, away.name+" installs when it comes back", func() bool {
		for _, h := range status(id).HostStates {
			if h.Host == away.name {
				return h.State == protocol.SkillInstalled
			}
		}
		return false
	})
	checkSkillFiles(t, away, bundle2, v2)

	// Rolled back: version 1 where it was, no skill elsewhere.
	out = mustCtl("skills", "rollback", id)
	if !strings.Contains(out, "Rollout "+id+" rolled back: now rolled_back.") {
		t.Errorf("skills rollback printed:\n%s", out)
	}
	waitFor(t, time.Minute, "every host is back where it was", func() bool {
		for _, h := range hosts[:6] {
			if !hasSkill(h, bundle1) {
				return false
			}
		}
		for _, h := range hosts[6:] {
			if _, err := os.Lstat(filepath.Join(h.skillsDir, "deploy")); err == nil {
				return false
			}
		}
		return true
	})
	for _, h := range hosts[:6] {
		checkSkillFiles(t, h, bundle1, v1)
	}
	for _, h := range hosts[6:] {
		checkNoSkill(t, h)
	}
	// Rolled back, the extension serves version 1 again.
	checkServedSkill(t, skills, hosts[0])
	// A rolled-back rollout cannot be resumed: the gateway's refusal,
	// as fleetctl prints it.
	if out, err := ctl("skills", "resume", id); err == nil || !strings.Contains(out, "fleetctl: ") || !strings.Contains(out, "rolled_back") {
		t.Errorf("resuming a rolled-back rollout: %v\n%s", err, out)
	}
	out = mustCtl("skills", "rollouts")
	if !regexp.MustCompile(`(?m)^`+id+` +deploy +sha256:[0-9a-f]{12} +rolled_back `).MatchString(out) ||
		!regexp.MustCompile(`(?m)^`+first[1]+` +deploy +sha256:[0-9a-f]{12} +done `).MatchString(out) {
		t.Errorf("skills rollouts:\n%s", out)
	}
	out = mustCtl("skills", "versions", "deploy")
	if strings.Index(out, bundle2) > strings.Index(out, bundle1) || strings.Count(out, "sha256:") != 2 {
		t.Errorf("skills versions (newest first):\n%s", out)
	}
}

// enrolSkillHost enrols host over the fleet API with the join token and
// returns it with the starter of its in-process agent, which trusts the
// signing keys the enrolment gave.
func enrolSkillHost(t *testing.T, apiURL, pin, token, host string) *skillHost {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	cl := enrolclient.New(apiURL, pin, 1)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := cl.Enrol(ctx, kp, token, host)
	if err != nil {
		t.Fatalf("enrol %s: %v", host, err)
	}
	if len(resp.SigningKeys) != 1 {
		t.Fatalf("enrolment of %s gave the signing keys %v", host, resp.SigningKeys)
	}
	dir := t.TempDir()
	h := &skillHost{name: host, skillsDir: filepath.Join(dir, ".state", "skills"), policy: filepath.Join(dir, "policy.yaml")}
	started := false
	h.start = func() {
		t.Helper()
		if started {
			t.Fatalf("%s started twice", host)
		}
		started = true
		cfg := agent.Config{Servers: resp.NATSURLs, Name: host,
			Credentials: agent.Credentials{JWT: func() (string, error) { return resp.JWT, nil }, Seed: seed, CA: []byte(resp.NATSCA)},
			GatewayKeys: resp.SigningKeys, Cwd: dir, StateDir: filepath.Join(dir, ".state"), FleetSkillsDir: h.skillsDir,
			Heartbeat: 500 * time.Millisecond, Keepalive: 500 * time.Millisecond, ReconnectMin: 50 * time.Millisecond,
			ReconnectMax: 500 * time.Millisecond, DrainTimeout: 5 * time.Second,
			Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
		if _, err := os.Stat(h.policy); err == nil {
			cfg.PolicyFile = h.policy
		}
		a, err := agent.New(cfg)
		if err != nil {
			t.Fatalf("agent %s: %v", host, err)
		}
		actx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = a.Run(actx) }()
		t.Cleanup(func() { stop(); <-done })
	}
	return h
}

// writeSkillFolder writes a skill folder; scripts are executable.
func writeSkillFolder(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, data := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "scripts/") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
}

// hasSkill says whether h serves bundle (its link names the version).
func hasSkill(h *skillHost, bundle string) bool {
	target, err := os.Readlink(filepath.Join(h.skillsDir, "deploy"))
	return err == nil && target == filepath.Join(".fleet", "deploy", strings.TrimPrefix(bundle, "sha256:")[:12])
}

// checkSkillFiles checks that h serves bundle and that the served folder
// holds exactly files, byte for byte, scripts executable.
func checkSkillFiles(t *testing.T, h *skillHost, bundle string, files map[string]string) {
	t.Helper()
	if !hasSkill(h, bundle) {
		target, err := os.Readlink(filepath.Join(h.skillsDir, "deploy"))
		t.Errorf("%s: the skill's link is %q (%v); want it at version %s", h.name, target, err, bundle)
		return
	}
	root := filepath.Join(h.skillsDir, "deploy") + "/"
	got := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, root)
		got[rel] = string(data)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o644)
		if strings.HasPrefix(rel, "scripts/") {
			want = 0o755
		}
		if fi.Mode().Perm() != want {
			return fmt.Errorf("%s has mode %v, want %v", rel, fi.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", h.name, err)
	}
	if len(got) != len(files) {
		t.Errorf("%s holds %d files, want %d: %v", h.name, len(got), len(files), got)
	}
	for p, want := range files {
		if got[p] != want {
			t.Errorf("%s: %s is %q, want %q", h.name, p, got[p], want)
		}
	}
}

// checkServedSkill checks that the gateway's skills/list shows deploy
// with the files h serves, each with the sha256 digest of its bytes on
// h's disk.
func checkServedSkill(t *testing.T, cs *mcp.ClientSession, h *skillHost) {
	t.Helper()
	onDisk := map[string]string{}
	root := filepath.Join(h.skillsDir, "deploy") + "/"
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		sum := sha256.Sum256(data)
		onDisk["skill://deploy/"+strings.TrimPrefix(p, root)] = "sha256:" + hex.EncodeToString(sum[:])
		return err
	})
	if err != nil || len(onDisk) == 0 {
		t.Fatalf("%s's skill files: %v (%d)", h.name, err, len(onDisk))
	}
	list, _ := listAllSkills(t, cs)
	served := map[string]string{}
	for _, s := range list {
		if s.URI == "skill://deploy/SKILL.md" {
			for _, f := range s.Resources {
				served[f.URI] = f.Digest
			}
		}
	}
	if !maps.Equal(served, onDisk) {
		t.Errorf("skills/list serves deploy as %v; %s holds %v", served, h.name, onDisk)
	}
}

// checkNoSkill checks that h serves no deploy skill.
func checkNoSkill(t *testing.T, h *skillHost) {
	t.Helper()
	if _, err := os.Lstat(filepath.Join(h.skillsDir, "deploy")); !os.IsNotExist(err) {
		t.Errorf("%s has a deploy skill (%v)", h.name, err)
	}
}

// TestSkillRolloutToEnvAgents: the agents an Env starts trust the
// gateway's signing keys, so a rollout started with the Gateway's
// methods installs on them.
func TestSkillRolloutToEnvAgents(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	skill := "---\nname: deploy\ndescription: Deploys the app.\n---\nRun it.\n"
	pushed, err := env.Gateway.PushSkill(ctx, nil, "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: []byte(skill)}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := env.Gateway.StartRollout(ctx, nil, protocol.RolloutRequest{Skill: "deploy", Selector: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	var info protocol.RolloutInfo
	waitFor(t, 30*time.Second, "the rollout to alpha ends", func() bool {
		info, err = env.Gateway.RolloutStatus(ctx, r.ID, true)
		return err == nil && info.State != protocol.RolloutRunning
	})
	if info.State != protocol.RolloutDone {
		t.Fatalf("the rollout to alpha: %s (%s), hosts %+v", info.State, info.Reason, info.HostStates)
	}
	h := &skillHost{name: "alpha", skillsDir: filepath.Join(env.AgentDir("alpha"), ".state", "skills")}
	checkSkillFiles(t, h, pushed.BundleID, map[string]string{"SKILL.md": skill})
}
