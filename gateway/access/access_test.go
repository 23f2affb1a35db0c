package access

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

var update = flag.Bool("update", false, "rewrite the want sections of testdata/access/*.txtar")

// txtarFile is one section of a txtar archive.
type txtarFile struct {
	name string
	data []byte
}

// parseTxtar splits a txtar archive ("-- name --" lines start sections)
// into its comment and files.
func parseTxtar(data []byte) (comment []byte, files []txtarFile) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	cur := &comment
	for _, l := range lines {
		s := strings.TrimSpace(string(l))
		if strings.HasPrefix(s, "-- ") && strings.HasSuffix(s, " --") && len(s) > 6 {
			files = append(files, txtarFile{name: s[3 : len(s)-3]})
			cur = &files[len(files)-1].data
			continue
		}
		*cur = append(*cur, l...)
	}
	return comment, files
}

func formatTxtar(comment []byte, files []txtarFile) []byte {
	var b bytes.Buffer
	b.Write(comment)
	for _, f := range files {
		fmt.Fprintf(&b, "-- %s --\n", f.name)
		b.Write(f.data)
	}
	return b.Bytes()
}

// TestAccessFiles parses every file of each testdata/access/*.txtar and
// compares the rules' summary, or the error, with the want section.
func TestAccessFiles(t *testing.T) {
	paths, err := filepath.Glob("testdata/access/*.txtar")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no test cases: %v", err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			comment, files := parseTxtar(data)
			var got bytes.Buffer
			inputs := 0
			for _, f := range files {
				if f.name != "want" {
					inputs++
				}
			}
			for _, f := range files {
				if f.name == "want" {
					continue
				}
				if inputs > 1 {
					fmt.Fprintf(&got, "## %s\n", f.name)
				}
				got.WriteString(describeRules(f.name, f.data))
			}
			out := files[:0:0]
			for _, f := range files {
				if f.name != "want" {
					out = append(out, f)
				}
			}
			out = append(out, txtarFile{name: "want", data: got.Bytes()})
			if *update {
				if err := os.WriteFile(path, formatTxtar(comment, out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			var want []byte
			for _, f := range files {
				if f.name == "want" {
					want = f.data
				}
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("%s:\n--- got\n%s--- want\n%s(run go test ./gateway/access -run TestAccessFiles -update to accept)", path, got.Bytes(), want)
			}
		})
	}
}

func describeRules(name string, data []byte) string {
	a, err := ParseRules(name, data)
	if err != nil {
		return "error: " + err.Error() + "\n"
	}
	return strings.Join(a.Summary(), "\n") + "\n"
}

// FuzzParseAccess: the parser never panics, and whatever it accepts can
// be evaluated for any caller without panicking.
func FuzzParseAccess(f *testing.F) {
	paths, _ := filepath.Glob("testdata/access/*.txtar")
	for _, p := range paths {
		data, _ := os.ReadFile(p)
		_, files := parseTxtar(data)
		for _, file := range files {
			if file.name != "want" {
				f.Add(file.data)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseRules("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if len(a.Summary()) == 0 {
			t.Fatal("accepted a file without rules")
		}
		id := &Identity{Kind: KindOIDC, Subject: "ci-1", Email: "a@example.com",
			claims: map[string]any{"groups": []any{"ops"}, "project_id": "p-1", "tenant": "acme"}}
		g := a.For(id)
		for _, tool := range append(hostToolNames(), protocol.ToolHosts, protocol.ToolAudit) {
			g.ToolVisible(tool)
			g.Tool(tool, "web-1", map[string]string{"env": "prod", "role": "web"})
		}
		g.Admin()
		// Allow rules are the identity provider's callers': an API token
		// gets nothing from them, whatever they match.
		tok := a.For(&Identity{Kind: KindAPIToken, Subject: "ci-1"})
		for _, tool := range hostToolNames() {
			if d := tok.Tool(tool, "web-1", nil); d.Allowed {
				t.Fatalf("an API token without a grant of its own is allowed %s by %s", tool, d.Rule)
			}
		}
	})
}

const grantsRules = `
rules:
  - name: ops
    match: {groups: ops}
    hosts: ["*"]
    tools: ["*"]
    admin: true
  - name: devs
    match: {email: "*@example.com"}
    hosts: [env=staging]
    tools: [read, bash]
  - name: dashboards
    match: {client_id: dashboard}
    hosts: ["web-*"]
    tools: [read]
  - name: no-prod-bash
    deny: true
    match: {sub: "*"}
    hosts: [env=prod]
    tools: [bash]
  - name: contractors-no-admin
    deny: true
    match: {roles: contractor}
    admin: true
  - name: interns-no-bash
    deny: true
    match: {groups: interns}
    hosts: ["*"]
    tools: [bash]
`

// grantsFixture returns the rules above, the callers of the grants tests
// and the labels of their hosts.
func grantsFixture(t *testing.T) (*Rules, map[string]*Identity, map[string]map[string]string) {
	t.Helper()
	rules, err := ParseRules("rules.yaml", []byte(grantsRules))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := ParseAPITokens("tokens.yaml", []byte(`tokens:
  - {name: ops, sha256: "`+strings.Repeat("ab", 32)+`", hosts: [env=staging], tools: [read, bash]}`))
	if err != nil {
		t.Fatal(err)
	}
	oidc := func(sub string, claims map[string]any) *Identity {
		id := &Identity{Kind: KindOIDC, Subject: sub, claims: claims}
		id.Email = claimString(claims, "email")
		id.ClientID = claimString(claims, "client_id")
		return id
	}
	ids := map[string]*Identity{
		"ops":        oidc("u-ops", map[string]any{"groups": []any{"ops", "sre"}}),
		"dev":        oidc("u-dev", map[string]any{"email": "Dev@Example.COM"}),
		"dashboard":  oidc("svc-1", map[string]any{"client_id": "dashboard"}),
		"contractor": oidc("u-c", map[string]any{"groups": []any{"ops"}, "roles": "contractor"}),
		"intern":     oidc("u-i", map[string]any{"email": "i@example.com", "groups": []any{"interns"}}),
		"stranger":   oidc("u-x", map[string]any{"email": "x@example.org", "groups": []any{"opsx"}}),
		"token":      {Kind: KindAPIToken, Subject: "ops", token: tokenNamed(tokens, "ops")},
		"local":      LocalIdentity(),
		"nobody":     nil,
	}
	hosts := map[string]map[string]string{
		"web-1": {"env": "staging"}, "web-2": {"env": "prod"}, "db-1": {"env": "prod"}, "lab": nil,
	}
	return rules, ids, hosts
}

func TestGrantsDecide(t *testing.T) {
	rules, ids, hosts := grantsFixture(t)
	tests := []struct {
		who, tool, host string
		allowed         bool
		rule            string
	}{
		{"ops", "bash", "web-1", true, "ops"},
		{"ops", "bash", "web-2", false, "no-prod-bash"},
		{"ops", "write", "db-1", true, "ops"},
		{"ops", "read", "lab", true, "ops"},
		{"dev", "bash", "web-1", true, "devs"},
		{"dev", "write", "web-1", false, ""},
		{"dev", "read", "db-1", false, ""},
		{"dashboard", "read", "web-2", true, "dashboards"},
		{"dashboard", "bash", "web-1", false, ""},
		{"dashboard", "read", "db-1", false, ""},
		{"intern", "read", "web-1", true, "devs"},
		{"intern", "bash", "web-1", false, "interns-no-bash"},
		{"stranger", "read", "web-1", false, ""},
		// A token gets its own grants only, and deny rules still apply;
		// the ops rule does not match a token named ops.
		{"token", "bash", "web-1", true, "token ops"},
		{"token", "read", "db-1", false, ""},
		{"local", "bash", "web-2", true, "authentication off"},
		{"nobody", "read", "web-1", false, ""},
	}
	for _, tc := range tests {
		d := rules.For(ids[tc.who]).Tool(tc.tool, tc.host, hosts[tc.host])
		if d.Allowed != tc.allowed || d.Rule != tc.rule {
			t.Errorf("%s: %s on %s = %+v, want allowed=%v by rule %q", tc.who, tc.tool, tc.host, d, tc.allowed, tc.rule)
		}
	}
}

// Each caller sees exactly the tools and hosts it may use.
func TestGrantsVisible(t *testing.T) {
	rules, ids, hosts := grantsFixture(t)

	visible := []struct {
		who   string
		tools string // tools/list for the caller
		hosts string // hosts it sees
		admin bool
	}{
		{"ops", "hosts read write edit bash audit", "db-1 lab web-1 web-2", true},
		{"dev", "hosts read bash", "web-1", false},
		{"dashboard", "hosts read", "web-1 web-2", false},
		{"contractor", "hosts read write edit bash", "db-1 lab web-1 web-2", false},
		{"intern", "hosts read", "web-1", false},
		{"stranger", "", "", false},
		{"token", "hosts read bash", "web-1", false},
		{"local", "hosts read write edit bash audit", "db-1 lab web-1 web-2", true},
		{"nobody", "", "", false},
	}
	for _, tc := range visible {
		g := rules.For(ids[tc.who])
		var tools, seen []string
		for _, tool := range []string{protocol.ToolHosts, "read", "write", "edit", "bash", protocol.ToolAudit} {
			if g.ToolVisible(tool) {
				tools = append(tools, tool)
			}
		}
		for _, h := range []string{"db-1", "lab", "web-1", "web-2"} {
			if g.HostVisible(h, hosts[h]) {
				seen = append(seen, h)
			}
		}
		if got := strings.Join(tools, " "); got != tc.tools {
			t.Errorf("%s sees tools %q, want %q", tc.who, got, tc.tools)
		}
		if got := strings.Join(seen, " "); got != tc.hosts {
			t.Errorf("%s sees hosts %q, want %q", tc.who, got, tc.hosts)
		}
		if got := g.Admin(); got.Allowed != tc.admin {
			t.Errorf("%s: Admin() = %+v, want %v", tc.who, got, tc.admin)
		}
	}
	if d := rules.For(ids["contractor"]).Admin(); d.Rule != "contractors-no-admin" {
		t.Errorf("contractor admin refused by %q, want contractors-no-admin", d.Rule)
	}
}

func tokenNamed(t *APITokens, name string) *apiToken {
	for _, tok := range t.byHash {
		if tok.name == name {
			return tok
		}
	}
	return nil
}

// The task tools follow the bash grant, per host: visible, allowed and
// refused exactly where bash is, by the same rule.
func TestGrantsTaskToolsFollowBash(t *testing.T) {
	rules, ids, hosts := grantsFixture(t)
	for who, id := range ids {
		g := rules.For(id)
		for _, tool := range taskToolNames() {
			if g.ToolVisible(tool) != g.ToolVisible("bash") {
				t.Errorf("%s: %s visible %v, bash visible %v", who, tool, g.ToolVisible(tool), g.ToolVisible("bash"))
			}
			for host, labels := range hosts {
				if got, want := g.Tool(tool, host, labels), g.Tool("bash", host, labels); got != want {
					t.Errorf("%s: %s on %s = %+v, bash = %+v", who, tool, host, got, want)
				}
			}
		}
	}
}

// Fan-out tools follow the grants of the tool they run on each host.
func TestFanoutToolVisible(t *testing.T) {
	rules, ids, _ := grantsFixture(t)
	for _, tc := range []struct {
		who  string
		want string
	}{{"ops", "fleet_bash fleet_read"}, {"dashboard", "fleet_read"}, {"intern", "fleet_read"}, {"stranger", ""}, {"local", "fleet_bash fleet_read"}} {
		var got []string
		for _, tool := range []string{protocol.ToolFleetBash, protocol.ToolFleetRead} {
			if rules.For(ids[tc.who]).ToolVisible(tool) {
				got = append(got, tool)
			}
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s sees %q, want %q", tc.who, got, tc.want)
		}
	}
}
