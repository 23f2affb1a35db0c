//go:build unix

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbSkills returns a toolbox whose catalog is root under policy text
// (empty: unrestricted).
func tbSkills(t *testing.T, root, pol string) *toolbox {
	t.Helper()
	tb := tbNew(t)
	if pol != "" {
		g, err := newGuard(testPolicy(t, pol), ownFiles{StateDir: tb.cfg.StateDir})
		if err != nil {
			t.Fatal(err)
		}
		tb.guard = g
	}
	tb.skills = newCatalog(root, "h1", tb.guard, quietLogger())
	return tb
}

func TestSkillTool(t *testing.T) {
	root := t.TempDir()
	text := "---\nname: pdf\ndescription: Fill PDF forms.\n---\n# PDF\nRun scripts/fill.py.\n"
	writeSkill(t, root, "pdf", "", text)
	dir := filepath.Join(root, "pdf")
	for _, f := range []string{"scripts/fill.py", "reference.md", "a/b/c.txt", "a-b.txt"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("reference.md", filepath.Join(dir, "link.md")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("scripts", filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	writeSkill(t, root, "bare", "no files", "")
	tb := tbSkills(t, root, "")

	res, _ := tbCall(t, context.Background(), tb, "skill", map[string]any{"host": "h1", "name": "pdf"})
	got := tbText(t, res)
	want := text + "\n[skill pdf: folder " + dir + "]\n" +
		"Bundled files (paths relative to the folder; read them with the read tool):\n" +
		"a-b.txt\na/b/c.txt\nlink.md\nreference.md\nscripts/fill.py\n"
	if res.IsError || got != want {
		t.Errorf("skill pdf (error %v) =\n%s\nwant\n%s", res.IsError, got, want)
	}
	res, _ = tbCall(t, context.Background(), tb, "skill", map[string]any{"name": "bare"})
	if got := tbText(t, res); res.IsError || !strings.HasSuffix(got, "\nBundled files: none\n") {
		t.Errorf("skill bare =\n%s", got)
	}
}

func TestSkillToolErrors(t *testing.T) {
	root := t.TempDir()
	writeSkill(t, root, "good", "fine", "")
	writeSkill(t, root, "bad", "", "---\nname: other\ndescription: d\n---\n")
	writeSkill(t, root, "secret", "hidden", "")
	tb := tbSkills(t, root, "skills: {deny: [secret]}\n")
	tests := []struct {
		args any
		want string
	}{
		{map[string]any{"name": "nope"}, "no skill nope on host h1; skills here: bad, good"},
		{map[string]any{"name": "secret"}, "no skill secret on host h1; skills here: bad, good"},
		{map[string]any{}, "name is empty; give the name of a skill (skills here: bad, good)"},
		{map[string]any{"name": "bad"}, `skill bad on host h1 is invalid: name "other" differs from its folder name "bad"; they must be equal (` + filepath.Join(root, "bad", skillFile) + ")"},
	}
	for _, tt := range tests {
		res, _ := tbCall(t, context.Background(), tb, "skill", tt.args)
		if got := tbText(t, res); !res.IsError || got != tt.want {
			t.Errorf("skill %v = %q (error %v), want error %q", tt.args, got, res.IsError, tt.want)
		}
	}
	res, _ := tbCall(t, context.Background(), tb, "skill", map[string]any{"name": "good", "path": "x"})
	if res.Error == nil || res.Error.Code != protocol.CodeBadRequest || !strings.Contains(res.Error.Message, "unknown field") {
		t.Errorf("unknown argument: %+v", res)
	}
	empty := tbSkills(t, filepath.Join(root, "missing"), "")
	res, _ = tbCall(t, context.Background(), empty, "skill", map[string]any{"name": "good"})
	if got := tbText(t, res); got != "no skill good on host h1; skills here: (none)" {
		t.Errorf("empty catalog: %q", got)
	}
}

func TestSkillToolFileCap(t *testing.T) {
	root := t.TempDir()
	writeSkill(t, root, "many", "lots of files", "")
	for i := range maxSkillFiles + 3 {
		if err := os.WriteFile(filepath.Join(root, "many", fmt.Sprintf("f%04d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, _ := tbCall(t, context.Background(), tbSkills(t, root, ""), "skill", map[string]any{"name": "many"})
	got := tbText(t, res)
	_, list, _ := strings.Cut(got, "read tool):\n")
	lines := strings.Split(strings.TrimSuffix(list, "\n"), "\n")
	if len(lines) != maxSkillFiles+1 || !strings.HasPrefix(lines[maxSkillFiles], "[more files not listed") ||
		!slices.IsSorted(lines[:maxSkillFiles]) {
		t.Errorf("%d lines; last %q", len(lines), lines[len(lines)-1])
	}
}

// TestSkillToolPolicy: the skill tool is subject to the tools rules.
func TestSkillToolPolicy(t *testing.T) {
	a := newTestAgent(t, Config{})
	if _, ok := a.served().tools["skill"]; !ok {
		t.Fatal("the skill tool is not served")
	}
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("tools: {deny: [skill]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a = newTestAgent(t, Config{PolicyFile: file})
	if _, ok := a.served().tools["skill"]; ok || !a.served().refused["skill"] {
		t.Error("tools.deny [skill] does not refuse the skill tool")
	}
}

// TestSkillCatalogAnnounce: the announce carries the catalog, and a new
// skill is announced at once rather than at the next heartbeat.
func TestSkillCatalogAnnounce(t *testing.T) {
	const host = "skills-1"
	ns, _, pres := watchedNATS(t)
	cwd := t.TempDir()
	root := filepath.Join(cwd, ".agents", "skills")
	writeSkill(t, root, "one", "first", "")
	stop := runAgent(t, ns, Config{Name: host, Cwd: cwd, Heartbeat: time.Hour})
	defer stop()
	a := nextAnnounce(t, pres, host, false)
	want := []protocol.Skill{{Name: "one", Description: "first", Path: filepath.Join(root, "one", skillFile)}}
	if !slices.Equal(a.Skills, want) {
		t.Fatalf("announced skills %+v, want %+v", a.Skills, want)
	}
	writeSkill(t, root, "two", "second", "")
	deadline := time.Now().Add(2 * time.Second)
	for len(a.Skills) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no announce with the new skill within 2 s; last %+v", a.Skills)
		}
		a = nextAnnounce(t, pres, host, false)
	}
}
