package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// readResource reads uri and returns its one content.
func readResource(t testing.TB, cs *mcp.ClientSession, uri string) *mcp.ResourceContents {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatalf("read %s: %v", uri, err)
	}
	if len(res.Contents) != 1 {
		t.Fatalf("read %s: %d contents, want 1", uri, len(res.Contents))
	}
	return res.Contents[0]
}

// readJSON reads uri and decodes its JSON text into v.
func readJSON(t testing.TB, cs *mcp.ClientSession, uri string, v any) {
	t.Helper()
	c := readResource(t, cs, uri)
	if c.MIMEType != "application/json" {
		t.Errorf("%s: MIME type %q", uri, c.MIMEType)
	}
	if err := json.Unmarshal([]byte(c.Text), v); err != nil {
		t.Fatalf("%s: %v\n%s", uri, err, c.Text)
	}
}

// readErr reads uri, expecting an error that contains want.
func readErr(t testing.TB, cs *mcp.ClientSession, uri, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err == nil {
		t.Fatalf("read %s: want an error containing %q, got %+v", uri, want, res)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("read %s: error %q does not contain %q", uri, err, want)
	}
	return err.Error()
}

type hostFacts struct {
	Name         string            `json:"name"`
	OS           string            `json:"os"`
	Arch         string            `json:"arch"`
	Shell        string            `json:"shell"`
	Cwd          string            `json:"cwd"`
	Labels       map[string]string `json:"labels"`
	Online       bool              `json:"online"`
	LastSeen     time.Time         `json:"last_seen"`
	AgentVersion string            `json:"agent_version"`
	Tools        []string          `json:"tools"`
	PolicyDigest string            `json:"policy_digest"`
}

func resourceHostNames(t testing.TB, cs *mcp.ClientSession) []string {
	t.Helper()
	var doc struct{ Hosts []hostFacts }
	readJSON(t, cs, "resource://hosts", &doc)
	var names []string
	for _, h := range doc.Hosts {
		names = append(names, h.Name)
	}
	return names
}

// TestResourceHosts: the resources and templates are listed, the hosts
// and one host's facts and working directory read, and a bad host URI gets
// an error that says what is wrong, in both protocol eras.
func TestResourceHosts(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			ctx := context.Background()
			resources, err := cs.ListResources(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var uris []string
			for _, r := range resources.Resources {
				uris = append(uris, r.URI)
			}
			slices.Sort(uris)
			if want := []string{"resource://hosts", "resource://skills", "resource://system-prompt"}; !slices.Equal(uris, want) {
				t.Errorf("resources = %v, want %v", uris, want)
			}
			templates, err := cs.ListResourceTemplates(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			var tmpls []string
			for _, r := range templates.ResourceTemplates {
				tmpls = append(tmpls, r.URITemplate)
			}
			slices.Sort(tmpls)
			if want := []string{"resource://hosts/{host}", "resource://hosts/{host}/cwd", "resource://hosts/{host}/skills", "skill://{skill}/{+path}"}; !slices.Equal(tmpls, want) {
				t.Errorf("templates = %v, want %v", tmpls, want)
			}

			if got := resourceHostNames(t, cs); !slices.Equal(got, []string{"alpha", "beta"}) {
				t.Errorf("resource://hosts names = %v", got)
			}
			var h hostFacts
			readJSON(t, cs, "resource://hosts/alpha", &h)
			if h.Name != "alpha" || h.OS != runtime.GOOS || h.Arch != runtime.GOARCH || !h.Online || h.Cwd != env.AgentDir("alpha") ||
				h.Labels["env"] != "test" || !slices.Contains(h.Tools, "bash") || h.AgentVersion == "" || h.LastSeen.IsZero() {
				t.Errorf("resource://hosts/alpha = %+v", h)
			}
			cwd := readResource(t, cs, "resource://hosts/beta/cwd")
			if cwd.Text != env.AgentDir("beta") || cwd.MIMEType != "text/plain" {
				t.Errorf("resource://hosts/beta/cwd = %q (%s), want %q", cwd.Text, cwd.MIMEType, env.AgentDir("beta"))
			}

			readErr(t, cs, "resource://hosts/", "the host is empty")
			readErr(t, cs, "resource://hosts//cwd", "the host is empty")
			readErr(t, cs, "resource://hosts/a*b", `invalid host "a*b"`)
			readErr(t, cs, "resource://hosts/alpha/nope", `unknown host resource "nope"`)
			readErr(t, cs, "resource://hosts/delta", `unknown host "delta"`)
			readErr(t, cs, "resource://hosts/delta/cwd", `unknown host "delta"`)
		})
	}
}

// TestResourceAccess: a caller sees only the hosts its grants reach, and
// a host it may not see answers exactly like one that does not exist.
func TestResourceAccess(t *testing.T) {
	f := newAuthFleet(t)
	ci := f.ClientAs("2025-11-25", f.ciToken) // may read alpha only
	if got := resourceHostNames(t, ci); !slices.Equal(got, []string{"alpha"}) {
		t.Errorf("ci's resource://hosts = %v, want [alpha]", got)
	}
	hidden := readErr(t, ci, "resource://hosts/gamma/cwd", "unknown host")
	missing := readErr(t, ci, "resource://hosts/delta/cwd", "unknown host")
	if strings.ReplaceAll(hidden, "gamma", "delta") != missing {
		t.Errorf("a hidden host and a missing one answer differently:\n%q\n%q", hidden, missing)
	}
	prompt := readResource(t, ci, "resource://system-prompt").Text
	if !strings.Contains(prompt, "`alpha`") || strings.Contains(prompt, "`beta`") || strings.Contains(prompt, "`gamma`") {
		t.Errorf("ci's system prompt shows hosts it may not see:\n%s", prompt)
	}
	ops := f.ClientAs("2025-11-25", f.user("ops"))
	if got := resourceHostNames(t, ops); !slices.Equal(got, []string{"alpha", "beta", "gamma"}) {
		t.Errorf("ops's resource://hosts = %v", got)
	}
	if got := readResource(t, ops, "resource://hosts/gamma/cwd").Text; got != f.AgentDir("gamma") {
		t.Errorf("ops's gamma cwd = %q", got)
	}
}

// TestSystemPromptResource: the prompt reflects the fleet at each read.
func TestSystemPromptResource(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("2025-11-25", nil)
	c := readResource(t, cs, "resource://system-prompt")
	if c.MIMEType != "text/markdown" || !strings.Contains(c.Text, "`alpha` — "+runtime.GOOS) ||
		!strings.Contains(c.Text, "1 hosts, 1 online") || !strings.Contains(c.Text, time.Now().UTC().Format(time.DateOnly)) {
		t.Errorf("system prompt (%s):\n%s", c.MIMEType, c.Text)
	}
	if strings.Contains(c.Text, "`newcomer`") {
		t.Fatal("newcomer listed before it joined")
	}
	env.StartAgent("newcomer", nil)
	env.WaitHost("newcomer", true)
	if got := readResource(t, cs, "resource://system-prompt").Text; !strings.Contains(got, "`newcomer` — ") || !strings.Contains(got, "2 hosts, 2 online") {
		t.Errorf("system prompt after newcomer joined:\n%s", got)
	}
}

// TestSystemPromptOverride: an override template is read on every read;
// one that cannot be parsed or read falls back to the bundled template
// with a warning.
func TestSystemPromptOverride(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prompt.md.tmpl")
	writeFile(t, file, "Fleet of {{.Fleet.Hosts}}:{{range .Hosts}} {{.Name}}/{{.OS}}{{end}}")
	var logs syncBuffer
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) {
		c.SystemPromptFile = file
		c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}})
	cs := env.Client("", nil)
	if got, want := readResource(t, cs, "resource://system-prompt").Text, "Fleet of 1: alpha/"+runtime.GOOS; got != want {
		t.Errorf("override = %q, want %q", got, want)
	}
	writeFile(t, file, "{{.Date}} edited")
	if got := readResource(t, cs, "resource://system-prompt").Text; got != time.Now().UTC().Format(time.DateOnly)+" edited" {
		t.Errorf("edited override = %q", got)
	}
	for _, tc := range []struct {
		name   string
		mutate func()
	}{
		{"invalid", func() { writeFile(t, file, "{{range .Hosts}") }},
		{"unreadable", func() { os.Remove(file) }},
	} {
		tc.mutate()
		got := readResource(t, cs, "resource://system-prompt").Text
		if !strings.Contains(got, "# fleetmcp") || !strings.Contains(got, "`alpha` — ") {
			t.Errorf("%s override: no fallback to the bundled template:\n%s", tc.name, got)
		}
		if l := logs.String(); strings.Count(l, "system prompt template unusable") == 0 || !strings.Contains(l, file) {
			t.Errorf("%s override: no warning logged: %q", tc.name, l)
		}
	}
	if n := strings.Count(logs.String(), "system prompt template unusable"); n != 2 {
		t.Errorf("%d fallback warnings, want 2:\n%s", n, logs.String())
	}
}

type skillsDoc struct {
	Skills map[string]struct {
		Description string            `json:"description"`
		Hosts       []string          `json:"hosts"`
		Paths       map[string]string `json:"paths"`
	} `json:"skills"`
	Invalid []struct {
		Name, Host, Path, Problem string
	} `json:"invalid"`
}

func writeSkill(t *testing.T, cwd, name, body string) string {
	t.Helper()
	path := filepath.Join(cwd, ".agents", "skills", name, "SKILL.md")
	writeFile(t, path, body)
	return path
}

func skillMD(name, desc string) string {
	return "---\nname: " + name + "\ndescription: " + desc + "\n---\n\n# " + name + "\n\nStep one: say " + name + "-instructions.\n"
}

// TestSkillsCatalog: skills written on hosts appear in resource://skills
// within seconds, load through the skill tool with their bundled files,
// invalid ones are reported with their problem, and one the host policy
// denies is nowhere to be seen.
func TestSkillsCatalog(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	guardedCwd := policyHost(t, env, "guarded", "skills: {deny: [secret-skill]}\n")
	cs := env.Client("2025-11-25", nil)

	demo := writeSkill(t, env.AgentDir("alpha"), "demo", skillMD("demo", "Demonstrates skills"))
	writeFile(t, filepath.Join(filepath.Dir(demo), "scripts", "run.sh"), "echo run\n")
	writeSkill(t, env.AgentDir("alpha"), "broken", "no frontmatter here\n")
	writeSkill(t, env.AgentDir("beta"), "other", skillMD("other", "Another skill"))
	writeSkill(t, guardedCwd, "secret-skill", skillMD("secret-skill", "Must stay hidden"))
	writeSkill(t, guardedCwd, "open-skill", skillMD("open-skill", "Shown"))

	var doc skillsDoc
	ready := func() bool {
		doc = skillsDoc{}
		readJSON(t, cs, "resource://skills", &doc)
		return len(doc.Skills) >= 3 && len(doc.Invalid) >= 1
	}
	waitFor(t, 3*time.Second, "skills in resource://skills", ready)
	d := doc.Skills["demo"]
	if d.Description != "Demonstrates skills" || !slices.Equal(d.Hosts, []string{"alpha"}) || d.Paths["alpha"] != demo {
		t.Errorf("demo = %+v", d)
	}
	if o := doc.Skills["other"]; !slices.Equal(o.Hosts, []string{"beta"}) {
		t.Errorf("other = %+v", o)
	}
	if o := doc.Skills["open-skill"]; !slices.Equal(o.Hosts, []string{"guarded"}) {
		t.Errorf("open-skill = %+v", o)
	}
	if _, ok := doc.Skills["secret-skill"]; ok || len(doc.Skills) != 3 {
		t.Errorf("skills = %+v: want demo, other, open-skill and no secret-skill", doc.Skills)
	}
	if len(doc.Invalid) != 1 || doc.Invalid[0].Name != "broken" || doc.Invalid[0].Host != "alpha" || doc.Invalid[0].Problem == "" {
		t.Errorf("invalid = %+v", doc.Invalid)
	}

	var alpha struct {
		Host   string
		Skills []struct{ Name, Path, Problem string }
	}
	readJSON(t, cs, "resource://hosts/alpha/skills", &alpha)
	if alpha.Host != "alpha" || len(alpha.Skills) != 2 {
		t.Errorf("resource://hosts/alpha/skills = %+v", alpha)
	}
	var guarded struct{ Skills []struct{ Name string } }
	readJSON(t, cs, "resource://hosts/guarded/skills", &guarded)
	if len(guarded.Skills) != 1 || guarded.Skills[0].Name != "open-skill" {
		t.Errorf("resource://hosts/guarded/skills = %+v", guarded)
	}

	got := mustOK(t, call(t, cs, "skill", map[string]any{"host": "alpha", "name": "demo"}))
	if !strings.Contains(got, "demo-instructions") || !strings.Contains(got, "run.sh") {
		t.Errorf("skill demo:\n%s", got)
	}
	mustErr(t, call(t, cs, "skill", map[string]any{"host": "guarded", "name": "secret-skill"}), "secret-skill")
	mustErr(t, call(t, cs, "skill", map[string]any{"host": "beta", "name": "demo"}), "demo")
	mustErr(t, call(t, cs, "skill", map[string]any{"host": "nowhere", "name": "demo"}), `unknown host "nowhere"`)

	prompt := readResource(t, cs, "resource://system-prompt").Text
	for _, want := range []string{"`demo` — Demonstrates skills (hosts: alpha)", "`other` — Another skill (hosts: beta)", "`broken` on `alpha`"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("system prompt lacks %q:\n%s", want, prompt)
		}
	}
	if strings.Contains(prompt, "secret-skill") {
		t.Errorf("system prompt shows a denied skill:\n%s", prompt)
	}
}
