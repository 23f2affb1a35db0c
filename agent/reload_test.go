//go:build unix

package agent

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/policy"
)

// Reload puts a changed policy file in force for the tools, the guard
// and the skill catalog; a broken file, and one that changes the git
// rules the agent set its git guard up with, are refused with one log
// line naming the file, and the policy in force stays.
func TestReloadPolicy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tools: {deny: [write]}\nbash: {allow: [\"echo *\"]}\n")
	var logs bytes.Buffer
	cfg := Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "rl-1", StateDir: t.TempDir(), Cwd: t.TempDir(), PolicyFile: file,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	skills := filepath.Join(cfg.Cwd, ".agents", "skills", "deploy")
	if err := os.MkdirAll(skills, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(skills, "SKILL.md"), []byte("---\nname: deploy\ndescription: Deploys.\n---\nBody\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	secret := filepath.Join(cfg.Cwd, "secret.txt")
	if _, err := a.guard.checkPath(secret, policy.Read); err != nil {
		t.Fatalf("before the reload: %v", err)
	}
	if len(a.skills.list()) != 1 {
		t.Fatalf("skills before the reload: %v", a.skills.list())
	}
	first := a.served().pol.Digest()

	write("tools: {deny: [patch]}\nbash: {allow: [\"echo *\", \"ls *\"]}\npaths: {deny: [\"**/secret.txt\"]}\nskills: {deny: [deploy]}\n")
	if err := a.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	hp := a.served()
	if hp.pol.Digest() == first || hp.tools["write"] == nil || hp.tools["patch"] != nil || !hp.refused["patch"] {
		t.Errorf("after the reload: digest %s (was %s), tools %v", hp.pol.Digest(), first, hp.toolList())
	}
	if _, err := a.guard.checkPath(secret, policy.Read); !isDenied(err) {
		t.Errorf("the guard does not apply the new path rules: %v", err)
	}
	if len(a.skills.list()) != 0 {
		t.Errorf("a skill the new policy denies is still listed: %v", a.skills.list())
	}
	second := hp.pol.Digest()

	for _, bad := range []struct{ text, want string }{
		{"tools: {deny: [patch]}\npathz: {}\n", "pathz"},
		{"tools: {deny: [patch]}\n", "git rules"}, // command rules off: the git guard was set up for them
		{"bash: {allow: [\"echo *\"], git: {allow_config: [\"alias.*\"]}}\n", "git rules"},
	} {
		logs.Reset()
		write(bad.text)
		err := a.Reload()
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("reload of %q: err = %v, want one about %s", bad.text, err, bad.want)
		}
		lines := slices.DeleteFunc(strings.Split(strings.TrimSpace(logs.String()), "\n"), func(l string) bool { return !strings.Contains(l, "level=ERROR") })
		if len(lines) != 1 || !strings.Contains(lines[0], "reload refused") || !strings.Contains(lines[0], file) {
			t.Errorf("reload of %q logged %q; want one error line naming %s", bad.text, lines, file)
		}
		if got := a.served().pol.Digest(); got != second {
			t.Errorf("a refused reload changed the policy: digest %s, want %s", got, second)
		}
	}
}
