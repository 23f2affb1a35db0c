package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// result is what one fleetctl run did.
type result struct {
	stdout, stderr string
	err            error
	code           int
}

// fleetctl runs the command line with env as its whole environment.
func fleetctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	// No test reads the user's own profile.
	noProfile := filepath.Join(t.TempDir(), "no-profile.json")
	err := run(ctx, args, &out, &errb, func(k string) string {
		if k == profile.EnvPath && env[k] == "" {
			return noProfile
		}
		return env[k]
	})
	code := exitCode(err, &errb)
	return result{stdout: out.String(), stderr: errb.String(), err: err, code: code}
}

// adminEnv reaches g as an admin, the CA pinned, through the environment.
func adminEnv(g *fakeGateway) map[string]string {
	return map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_API_TOKEN": adminToken, "FLEET_CA_PIN": g.ca.pin}
}

func mustRun(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	r := fleetctl(t, env, args...)
	if r.err != nil || r.code != 0 {
		t.Fatalf("fleetctl %s: exit %d, %v\nstderr: %s", strings.Join(args, " "), r.code, r.err, r.stderr)
	}
	return r
}

// checkRequest checks what fleetctl sent: method, path and the admin
// bearer token.
func checkRequest(t *testing.T, got request, method, path string) {
	t.Helper()
	if got.Method != method || got.Path != path {
		t.Errorf("fleetctl sent %s %s; want %s %s", got.Method, got.Path, method, path)
	}
	if got.Auth != "Bearer "+adminToken {
		t.Errorf("fleetctl sent Authorization %q; want the admin token as a bearer token", got.Auth)
	}
}

// body decodes a request body strictly into v, as the gateway does.
func body(t *testing.T, got request, v any) {
	t.Helper()
	if got.ContentType != "application/json" {
		t.Errorf("Content-Type %q; want application/json", got.ContentType)
	}
	dec := json.NewDecoder(bytes.NewReader(got.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("request body %s: %v", got.Body, err)
	}
}

func contains(t *testing.T, what, s string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(s, w) {
			t.Errorf("%s does not say %q:\n%s", what, w, s)
		}
	}
}

func TestTokenCreate(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "token", "create", "--labels", "env=prod,role=web", "--ttl", "2h", "--uses", "3", "--name_pattern", "web-*", "--replace", "web-9")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminTokensPath)
	var req protocol.TokenCreateRequest
	body(t, got, &req)
	if ttl, err := time.ParseDuration(req.TTL); err != nil || ttl != 2*time.Hour {
		t.Errorf("ttl %q; want 2h", req.TTL)
	}
	want := protocol.TokenCreateRequest{Labels: map[string]string{"env": "prod", "role": "web"}, TTL: req.TTL, Uses: 3, NamePattern: "web-*", Replace: "web-9"}
	if !equalJSON(req, want) {
		t.Errorf("request %+v; want %+v", req, want)
	}
	var resp protocol.TokenCreateResponse
	if err := json.Unmarshal(g.answered(), &resp); err != nil {
		t.Fatal(err)
	}
	contains(t, "token create", r.stdout, resp.Token, "shown this once", resp.Info.ID, "pattern web-* (replaces web-9)",
		"env=prod,role=web", resp.JoinCommand, resp.InstallCommand, g.ca.pin, formatTime(resp.Info.ExpiresAt))
	if !regexp.MustCompile(`\(in (1h59m5\ds|2h0m0s)\)`).MatchString(r.stdout) {
		t.Errorf("token create does not say how long the token lives:\n%s", r.stdout)
	}

	// A named token: --name goes as name, the defaults as themselves.
	g.requests = nil
	mustRun(t, adminEnv(g), "token", "create", "--name", "db-2")
	req = protocol.TokenCreateRequest{}
	body(t, g.last(), &req)
	if req.Name != "db-2" || req.NamePattern != "" || req.Uses != 1 || req.TTL != "1h0m0s" || len(req.Labels) != 0 {
		t.Errorf("token create --name db-2 sent %+v", req)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// TestTokenCreateRefusesBadFlags: flags fleetctl can check are checked
// before anything is sent.
func TestTokenCreateRefusesBadFlags(t *testing.T) {
	g := startFakeGateway(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--labels", "env"}, "no '='"},
		{[]string{"--labels", "env=a,env=b"}, "given twice"},
		{[]string{"--labels", "=x"}, "empty key"},
		{[]string{"--ttl", "-1h"}, "positive duration"},
		{[]string{"--uses", "0"}, "at least one host"},
		{[]string{"--name", "a", "--name_pattern", "b*"}, "both given"},
		{[]string{"--name", "web.1"}, "host name"},
		{[]string{"--replace", "a b"}, "host name"},
		{[]string{"extra"}, "takes"},
	} {
		r := fleetctl(t, adminEnv(g), append([]string{"token", "create"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("token create %v: exit %d, %q; want exit 2 saying %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests for command lines it refused", n)
	}
}

func TestTokenList(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "token", "list")
	checkRequest(t, g.last(), "GET", protocol.AdminTokensPath)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("token list printed %d lines; want a header and 2 tokens:\n%s", len(lines), r.stdout)
	}
	wantRows := [][]string{
		{"ID", "STATE", "USES", "HOSTS", "LABELS", "EXPIRES", "CREATED BY"},
		{"aaaaaaaaaa", "active", "2/5", "pattern web-*", "env=prod,role=web", "2026-12-02 09:00Z", "alice@example.com"},
		{"bbbbbbbbbb", "spent", "1/1", "db-1 (replaces db-1)", "-", "2026-11-30 11:00Z", "ci"},
	}
	checkTable(t, lines, wantRows)
}

// checkTable checks that every line holds its row's cells, each column
// starting at the same place on every line.
func checkTable(t *testing.T, lines []string, rows [][]string) {
	t.Helper()
	var starts []int
	for i, row := range rows {
		at, cols := 0, []int{}
		for _, cell := range row {
			j := strings.Index(lines[i][at:], cell)
			if j < 0 {
				t.Fatalf("line %d %q has no %q after column %d", i, lines[i], cell, at)
			}
			cols = append(cols, at+j)
			at += j + len(cell)
		}
		if starts == nil {
			starts = cols
		} else if !slices.Equal(starts, cols) {
			t.Errorf("the columns of line %d start at %v; the header's at %v:\n%s", i, cols, starts, strings.Join(lines, "\n"))
		}
	}
}

func TestTokenRevoke(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "token", "revoke", "aaaaaaaaaa")
	checkRequest(t, g.last(), "DELETE", protocol.AdminTokensPath+"/aaaaaaaaaa")
	contains(t, "token revoke", r.stdout, "aaaaaaaaaa revoked")

	// The whole token names its id.
	g.requests = nil
	_, _, token := protocol.NewJoinToken()
	id, _, _ := protocol.ParseJoinToken(token)
	r = fleetctl(t, adminEnv(g), "token", "revoke", token)
	checkRequest(t, g.last(), "DELETE", protocol.AdminTokensPath+"/"+id)
	if r.code != 1 || r.stderr != "fleetctl: no join token "+id+" (not_found)\n" {
		t.Errorf("revoking an unknown token: exit %d, %q; want the API error", r.code, r.stderr)
	}
	g.requests = nil
	for _, bad := range []string{"AAAAAAAAAA", "short", "../agents", "aaaaaaaaaa/x"} {
		if r := fleetctl(t, adminEnv(g), "token", "revoke", bad); r.code != 2 || !strings.Contains(r.stderr, "token id") {
			t.Errorf("token revoke %q: exit %d, %q; want a usage error about the token id", bad, r.code, r.stderr)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests for ids that are not token ids", n)
	}
}

func TestAgentList(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "agent", "list")
	checkRequest(t, g.last(), "GET", protocol.AdminAgentsPath)
	lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("agent list printed %d lines; want a header and 2 hosts:\n%s", len(lines), r.stdout)
	}
	checkTable(t, lines, [][]string{
		{"HOST", "STATE", "LABELS", "OS/ARCH", "CREDENTIAL EXPIRES", "RECOVERIES"},
		{"db-1", "revoked", "-", "linux/arm64", "2026-12-01 09:00Z", "0"},
		{"web-1", "online", "env=prod", "linux/amd64", "2026-12-30 09:00Z", "0"},
	})
}

func TestAgentRevoke(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "agent", "revoke", "web-1")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminAgentsPath+"/web-1/revoke")
	if len(got.Body) != 0 {
		t.Errorf("agent revoke sent a body: %s", got.Body)
	}
	contains(t, "agent revoke", r.stdout, "web-1 revoked", "--replace web-1")

	g.requests = nil
	r = fleetctl(t, adminEnv(g), "agent", "revoke", "nosuch")
	if r.code != 1 || r.stderr != "fleetctl: no enrolled host nosuch (unknown_host)\n" {
		t.Errorf("revoking an unknown host: exit %d, %q", r.code, r.stderr)
	}
	g.requests = nil
	for _, bad := range []string{"web.1", "../tokens", "a/b", ""} {
		if r := fleetctl(t, adminEnv(g), "agent", "revoke", bad); r.code != 2 {
			t.Errorf("agent revoke %q: exit %d, %q; want a usage error", bad, r.code, r.stderr)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests for names that are not host names", n)
	}
}

// TestAgentRevokeKey: agent revoke --key revokes one agent key by itself,
// whether or not a host is known for it.
func TestAgentRevokeKey(t *testing.T) {
	g := startFakeGateway(t)
	key := "U" + strings.Repeat("WEB2", 13) + "WEB"
	g.mu.Lock()
	g.agents["web-1"].PublicKey = key
	g.mu.Unlock()
	r := mustRun(t, adminEnv(g), "agent", "revoke", "--key", key)
	checkRequest(t, g.last(), "POST", protocol.AdminKeysPath+"/"+key+"/revoke")
	contains(t, "agent revoke --key", r.stdout, "Key "+key+" of host web-1 revoked")
	other := "U" + strings.Repeat("A", 55)
	r = mustRun(t, adminEnv(g), "agent", "revoke", "--key", other)
	contains(t, "agent revoke --key of an unknown key", r.stdout, "Key "+other+" revoked", "no host is known")
	g.requests = nil
	for _, bad := range [][]string{{"--key", "web-1"}, {"--key", strings.Repeat("U", 57)}, {"--key", key, "web-1"}} {
		if r := fleetctl(t, adminEnv(g), append([]string{"agent", "revoke"}, bad...)...); r.code != 2 {
			t.Errorf("agent revoke %q: exit %d, %q; want a usage error", bad, r.code, r.stderr)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests for arguments that are not one agent key", n)
	}
}

func TestAgentLabel(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "agent", "label", "web-1", "tier=front", "env-", "owner=team-a")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminAgentsPath+"/web-1/labels")
	var req protocol.LabelsRequest
	body(t, got, &req)
	want := protocol.LabelsRequest{Set: map[string]string{"tier": "front", "owner": "team-a"}, Remove: []string{"env"}}
	if !equalJSON(req, want) {
		t.Errorf("agent label sent %+v; want %+v", req, want)
	}
	contains(t, "agent label", r.stdout, "Labels of web-1: owner=team-a,tier=front")

	// Only removals: no set at all.
	g.requests = nil
	mustRun(t, adminEnv(g), "agent", "label", "web-1", "tier-")
	if b := string(g.last().Body); b != `{"remove":["tier"]}` {
		t.Errorf("agent label web-1 tier- sent %s", b)
	}
	g.requests = nil
	for _, args := range [][]string{{"web-1"}, {"web-1", "tier"}, {"web-1", "a=1", "a-"}, {"web.1", "a=1"}, {"web-1", "tier=gold*"}, {"web-1", "owner=team=a"}} {
		if r := fleetctl(t, adminEnv(g), append([]string{"agent", "label"}, args...)...); r.code != 2 {
			t.Errorf("agent label %v: exit %d, %q; want a usage error", args, r.code, r.stderr)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests for label changes it refused", n)
	}
}

func TestAgentAllowRecovery(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "agent", "allow-recovery", "web-1")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminAgentsPath+"/web-1/allow-recovery")
	var req protocol.AllowRecoveryRequest
	body(t, got, &req)
	if req.Count != 1 {
		t.Errorf("count %d; want 1 by default", req.Count)
	}
	contains(t, "allow-recovery", r.stdout, "web-1 may recover 1 more time")

	g.requests = nil
	r = mustRun(t, adminEnv(g), "agent", "allow-recovery", "web-1", "--count", "3")
	body(t, g.last(), &req)
	if req.Count != 3 {
		t.Errorf("count %d; want 3", req.Count)
	}
	contains(t, "allow-recovery", r.stdout, "web-1 may recover 4 more time") // the gateway's count
	if r := fleetctl(t, adminEnv(g), "agent", "allow-recovery", "web-1", "--count", "0"); r.code != 2 {
		t.Errorf("--count 0: exit %d; want a usage error", r.code)
	}
}

// TestJSON: --json prints the gateway's answer as it came, for every
// command, wherever the flag is.
func TestJSON(t *testing.T) {
	g := startFakeGateway(t)
	for _, args := range [][]string{
		{"--json", "token", "create", "--labels", "a=b"},
		{"token", "list", "--json"},
		{"token", "revoke", "--json", "aaaaaaaaaa"},
		{"agent", "list", "--json"},
		{"agent", "revoke", "web-1", "--json"},
		{"agent", "label", "--json", "web-1", "a=b"},
		{"agent", "allow-recovery", "web-1", "--json", "--count", "2"},
	} {
		r := mustRun(t, adminEnv(g), args...)
		if want := string(g.answered()) + "\n"; r.stdout != want {
			t.Errorf("fleetctl %v printed\n%s\nwant the answer as it came:\n%s", args, r.stdout, want)
		}
	}
}

// TestAPIErrors: an API error is printed as "fleetctl: MESSAGE (CODE)"
// with exit status 1; a refused token says how to get an admin's.
func TestAPIErrors(t *testing.T) {
	g := startFakeGateway(t)
	env := adminEnv(g)
	env["FLEET_API_TOKEN"] = "fmcp_wrong"
	r := fleetctl(t, env, "agent", "list")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "fleetctl: no valid bearer token (unauthorized)\n") {
		t.Errorf("a wrong token: exit %d, %q", r.code, r.stderr)
	}
	contains(t, "a wrong token", r.stderr, "admin token", "--api_token_file", "admin: true", "--new_api_token")

	env["FLEET_API_TOKEN"] = userToken
	r = fleetctl(t, env, "token", "list")
	if r.code != 1 || !strings.HasPrefix(r.stderr, "fleetctl: the admin API is for admins; your token is not one (forbidden)\n") {
		t.Errorf("a caller's token: exit %d, %q", r.code, r.stderr)
	}
	contains(t, "a caller's token", r.stderr, "admin: true")

	r = fleetctl(t, adminEnv(g), "token", "create", "--ttl", "1000h")
	if r.code != 1 || r.stderr != "fleetctl: ttl 1000h0m0s: want a duration up to 720h (bad_request)\n" {
		t.Errorf("a refused creation: exit %d, %q", r.code, r.stderr)
	}
}

// TestNotTheAdminAPI: answers that are not the admin API's say what is
// wrong; a redirect is not followed (the token goes nowhere else).
func TestNotTheAdminAPI(t *testing.T) {
	g := startFakeGateway(t)
	env := adminEnv(g)
	env["FLEET_GATEWAY"] = g.url() + "/mcp"
	r := fleetctl(t, env, "agent", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "404") || !strings.Contains(r.stderr, "no admin API") {
		t.Errorf("a URL without the admin API: exit %d, %q", r.code, r.stderr)
	}
	if got := g.last().Path; got != "/mcp"+protocol.AdminAgentsPath {
		t.Errorf("a --gateway with a path asked %s; want the API under that path", got)
	}

	ca := newTestCA(t, "fleet CA")
	redirect := startFakeGatewayWith(t, ca, ca.serverCert(t, "127.0.0.1"))
	redirect.srv.Config.Handler = redirectHandler(g.url())
	env = adminEnv(redirect)
	r = fleetctl(t, env, "agent", "list")
	if r.code != 1 || !strings.Contains(r.stderr, "does not follow") {
		t.Errorf("a redirect: exit %d, %q", r.code, r.stderr)
	}
}

func redirectHandler(to string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", to+r.URL.Path)
		w.WriteHeader(http.StatusTemporaryRedirect)
	}
}
