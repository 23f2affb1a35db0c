package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// testHosts are two hosts with different skills, one of them invalid.
func testHosts() []HostInfo {
	return []HostInfo{
		{Announce: protocol.Announce{Host: "alpha", OS: "linux", Arch: "amd64", Cwd: "/srv/a", Labels: map[string]string{"env": "prod"},
			Skills: []protocol.Skill{
				{Name: "deploy", Description: "Deploy the app", Path: "/srv/a/.agents/skills/deploy/SKILL.md"},
				{Name: "shared", Description: "Shared helper", Path: "/srv/a/.agents/skills/shared/SKILL.md"},
			}}, Online: true},
		{Announce: protocol.Announce{Host: "beta", OS: "darwin", Arch: "arm64", Cwd: "/Users/b",
			Skills: []protocol.Skill{
				{Name: "shared", Description: "Shared helper (beta)", Path: "/Users/b/.agents/skills/shared/SKILL.md"},
				{Name: "broken", Path: "/Users/b/.agents/skills/broken/SKILL.md", Problem: "SKILL.md has no frontmatter"},
			}}},
	}
}

func TestBuildCatalog(t *testing.T) {
	c := buildCatalog(testHosts())
	if len(c.Skills) != 2 {
		t.Fatalf("skills %v, want deploy and shared", c.Skills)
	}
	d := c.Skills["deploy"]
	if d.Description != "Deploy the app" || strings.Join(d.Hosts, ",") != "alpha" || d.Paths["alpha"] != "/srv/a/.agents/skills/deploy/SKILL.md" {
		t.Errorf("deploy = %+v", d)
	}
	s := c.Skills["shared"]
	if s.Description != "Shared helper" || strings.Join(s.Hosts, ",") != "alpha,beta" || s.Paths["beta"] != "/Users/b/.agents/skills/shared/SKILL.md" {
		t.Errorf("shared = %+v", s)
	}
	if len(c.Invalid) != 1 || c.Invalid[0] != (invalidSkill{Name: "broken", Host: "beta", Path: "/Users/b/.agents/skills/broken/SKILL.md", Problem: "SKILL.md has no frontmatter"}) {
		t.Errorf("invalid = %+v", c.Invalid)
	}
	if _, ok := c.Skills["broken"]; ok {
		t.Error("an invalid skill is listed as valid")
	}
	sorted := c.sorted()
	if len(sorted) != 2 || sorted[0].Name != "deploy" || sorted[1].Name != "shared" {
		t.Errorf("sorted = %+v", sorted)
	}
	data, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"shared":{"description":"Shared helper","hosts":["alpha","beta"]`; !strings.Contains(string(data), want) {
		t.Errorf("JSON %s lacks %s", data, want)
	}
	empty, _ := json.Marshal(buildCatalog(nil))
	if string(empty) != `{"skills":{},"invalid":[]}` {
		t.Errorf("empty catalog JSON = %s", empty)
	}
}

func testPromptData() promptData {
	return newPromptData(time.Date(2025, 3, 4, 23, 0, 0, 0, time.UTC), testHosts())
}

func TestPromptDefault(t *testing.T) {
	var logs bytes.Buffer
	out, err := renderPrompt(slog.New(slog.NewTextHandler(&logs, nil)), "", testPromptData())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"2025-03-04", "2 hosts, 1 online, 1 offline",
		"`alpha` — linux/amd64, online, labels env=prod, cwd `/srv/a`",
		"`beta` — darwin/arm64, offline, cwd `/Users/b`",
		"`deploy` — Deploy the app (hosts: alpha)", "`shared` — Shared helper (hosts: alpha, beta)",
		"`broken` on `beta`: SKILL.md has no frontmatter",
		"`skill`", "`bash`", "`host`",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("default prompt lacks %q:\n%s", want, out)
		}
	}
	if logs.Len() != 0 {
		t.Errorf("unexpected log: %s", logs.String())
	}
	empty, err := renderPrompt(slog.New(slog.DiscardHandler), "", newPromptData(time.Now(), nil))
	if err != nil || !strings.Contains(empty, "No hosts are available") || !strings.Contains(empty, "No skills are installed") {
		t.Errorf("empty fleet prompt (%v):\n%s", err, empty)
	}
}

func TestPromptOverrideAndFallback(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prompt.md.tmpl")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	write(`{{.Date}} {{.Fleet.Hosts}}/{{.Fleet.Online}}{{range .Hosts}} {{.Name}}{{end}}{{range .Skills}} {{.Name}}@{{join .Hosts "+"}}{{end}}`)
	out, err := renderPrompt(log, file, testPromptData())
	if err != nil || out != "2025-03-04 2/1 alpha beta deploy@alpha shared@alpha+beta" {
		t.Fatalf("override = %q, %v", out, err)
	}
	if logs.Len() != 0 {
		t.Errorf("unexpected log: %s", logs.String())
	}
	// Read on every render: a change shows at once.
	write("changed {{.Fleet.Skills}}")
	if out, _ := renderPrompt(log, file, testPromptData()); out != "changed 2" {
		t.Errorf("after change = %q", out)
	}
	for name, mutate := range map[string]func(){
		"unparseable":  func() { write("{{.Date") },
		"unexecutable": func() { write("{{.NoSuchField}}") },
		"missing":      func() { os.Remove(file) },
	} {
		t.Run(name, func(t *testing.T) {
			logs.Reset()
			mutate()
			out, err := renderPrompt(log, file, testPromptData())
			if err != nil || !strings.Contains(out, "# fleetmcp") || !strings.Contains(out, "`alpha`") {
				t.Errorf("fallback = %q, %v", out, err)
			}
			if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "system prompt template unusable") || !strings.Contains(l, file) {
				t.Errorf("warning log = %q", l)
			}
		})
	}
}

func TestParseHostURI(t *testing.T) {
	for _, tc := range []struct{ uri, host, rest, err string }{
		{"resource://hosts/alpha", "alpha", "", ""},
		{"resource://hosts/alpha/cwd", "alpha", "cwd", ""},
		{"resource://hosts/alpha/skills", "alpha", "skills", ""},
		{"resource://hosts/", "", "", "the host is empty"},
		{"resource://hosts//cwd", "", "", "the host is empty"},
		{"resource://hosts/a*b", "", "", `invalid host "a*b"`},
		{"resource://hosts/alpha/etc", "", "", `unknown host resource "etc"`},
		{"resource://other/alpha", "", "", "not a host resource"},
	} {
		host, rest, err := parseHostURI(tc.uri)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err %v, want %q", tc.uri, err, tc.err)
			}
			continue
		}
		if err != nil || host != tc.host || rest != tc.rest {
			t.Errorf("%s = %q, %q, %v", tc.uri, host, rest, err)
		}
	}
}

func TestSkillToolInAccessRules(t *testing.T) {
	rules, err := access.ParseRules("a.yaml", []byte("rules:\n  - match: {sub: \"*\"}\n    hosts: [\"*\"]\n    tools: [read, skill]\n"))
	if err != nil {
		t.Fatalf("skill in an access rule: %v", err)
	}
	g := rules.For(&access.Identity{Kind: access.KindOIDC, Subject: "u"})
	if !g.ToolVisible("skill") || !g.Tool("skill", "alpha", nil).Allowed || g.Tool("bash", "alpha", nil).Allowed {
		t.Error("a rule granting skill does not grant exactly read and skill")
	}
}
