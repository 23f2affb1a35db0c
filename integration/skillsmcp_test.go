package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// These tests serve skills from an in-memory skill source (real signed
// manifests, real digests) through the MCP Skills extension, and read
// them with the go-sdk client in both protocol eras and with the
// TypeScript SDK client.

// memSkills is an in-memory skill source: the served bundle per skill
// name, and the files by digest.
type memSkills struct {
	mu        sync.Mutex
	manifests map[string]protocol.SignedManifest
	files     map[string][]byte
	key       ed25519.PrivateKey
}

func newMemSkills(t *testing.T) *memSkills {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &memSkills{manifests: map[string]protocol.SignedManifest{}, files: map[string][]byte{}, key: key}
}

func (m *memSkills) ServedSkills(context.Context) ([]protocol.SignedManifest, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]protocol.SignedManifest, 0, len(m.manifests))
	for _, sm := range m.manifests {
		out = append(out, sm)
	}
	return out, nil
}

func (m *memSkills) ServedSkill(_ context.Context, name string) (protocol.SignedManifest, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sm, ok := m.manifests[name]
	return sm, ok, nil
}

func (m *memSkills) SkillFile(_ context.Context, sha string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	data, ok := m.files[sha]
	if !ok {
		return nil, fmt.Errorf("no file %s", sha)
	}
	return bytes.Clone(data), nil
}

// add stores a bundle of files (path → contents; paths under scripts/
// are executable) as the served version of skill name.
func (m *memSkills) add(t *testing.T, name string, files map[string]string) protocol.SignedManifest {
	t.Helper()
	man := protocol.Manifest{Name: name}
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, content := range files {
		sum := sha256.Sum256([]byte(content))
		mode := uint32(0o644)
		if strings.HasPrefix(p, "scripts/") {
			mode = 0o755
		}
		man.Files = append(man.Files, protocol.BundleFile{Path: p, Size: int64(len(content)), Mode: mode, SHA256: hex.EncodeToString(sum[:])})
		m.files[hex.EncodeToString(sum[:])] = []byte(content)
	}
	protocol.SortFiles(man.Files)
	if err := man.Validate(); err != nil {
		t.Fatalf("bundle %s: %v", name, err)
	}
	sm := protocol.SignedManifest{Manifest: man, BundleID: man.BundleID(),
		Signature: protocol.SignBytes(m.key, protocol.PurposeManifest, man.CanonicalBytes())}
	m.manifests[name] = sm
	return sm
}

// damage replaces the stored bytes of the file with digest sha.
func (m *memSkills) damage(sha string, data []byte) {
	m.mu.Lock()
	m.files[sha] = data
	m.mu.Unlock()
}

const deploySkillMD = "---\nname: deploy-app\ndescription: Deploy the app to a host, the team's way.\nlicense: Apache-2.0\n" +
	"allowed-tools: Bash(git:*)\nmetadata:\n  version: \"1.2\"\n  owners: [ops, dev]\n  1: one\nretries: 3\n---\n\n# Deploy\n\nRun scripts/run.sh, then read templates/my file.md.\n"

// deployFiles is a skill with the kinds of files the extension must
// carry: nested paths, a space and non-ASCII in a name, a binary file,
// an empty one.
var deployFiles = map[string]string{
	"SKILL.md":             deploySkillMD,
	"scripts/run.sh":       "#!/bin/sh\necho deploying\n",
	"templates/my file.md": "Dear {{name}},\n",
	"notes/résumé.txt":     "naïve café\n",
	"assets/logo.bin":      "\x89PNG\r\n\x1a\n\x00\xff\xfe binary",
	"empty.txt":            "",
}

// deployFrontmatter is deploySkillMD's frontmatter as the extension must
// render it: every field, verbatim.
var deployFrontmatter = map[string]any{
	"name": "deploy-app", "description": "Deploy the app to a host, the team's way.", "license": "Apache-2.0",
	"allowed-tools": "Bash(git:*)", "retries": float64(3),
	"metadata": map[string]any{"version": "1.2", "owners": []any{"ops", "dev"}, "1": "one"},
}

// fillSkills serves deploy-app and enough small skills that skills/list
// takes two pages.
func fillSkills(t *testing.T, src *memSkills) []string {
	names := []string{"deploy-app"}
	src.add(t, "deploy-app", deployFiles)
	for i := range 60 {
		n := fmt.Sprintf("tiny-%02d", i)
		src.add(t, n, map[string]string{"SKILL.md": "---\nname: " + n + "\ndescription: Tiny skill " + n + ".\n---\nbody\n"})
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// The extension's wire types, decoded as a client sees them.
type skillFile struct {
	URI    string `json:"uri"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

type skillEntry struct {
	URI         string         `json:"uri"`
	Frontmatter map[string]any `json:"frontmatter"`
	Resources   []skillFile    `json:"resources"`
}

type listParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

type listResult struct {
	mcp.ResultBase
	ResultType string       `json:"resultType"`
	Skills     []skillEntry `json:"skills"`
	NextCursor string       `json:"nextCursor"`
	TTLMs      *int         `json:"ttlMs"`
	CacheScope string       `json:"cacheScope"`
}

type getParams struct {
	mcp.ParamsBase
	URI string `json:"uri"`
}

type dirParams struct {
	mcp.ParamsBase
	URI    string `json:"uri"`
	Cursor string `json:"cursor,omitempty"`
}

type dirResult struct {
	mcp.ResultBase
	ResultType string          `json:"resultType"`
	Resources  []*mcp.Resource `json:"resources"`
	NextCursor string          `json:"nextCursor"`
}

func readDir(cs *mcp.ClientSession, uri string) (*dirResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*dirParams, *dirResult](ctx, cs, "resources/directory/read", &dirParams{URI: uri})
}

type getResult struct {
	mcp.ResultBase
	ResultType string     `json:"resultType"`
	Skill      skillEntry `json:"skill"`
	TTLMs      *int       `json:"ttlMs"`
	CacheScope string     `json:"cacheScope"`
}

// skillsClient connects a go-sdk client that may send skills/list and
// skills/get, speaking version ("" the SDK's latest: 2026-07-28), with
// bearer token when not empty.
func skillsClient(t *testing.T, url, version, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-skills-test", Version: "1"}, nil)
	if err := mcp.AddSendingCustomMethod[*listParams, *listResult](c, "skills/list"); err != nil {
		t.Fatal(err)
	}
	if err := mcp.AddSendingCustomMethod[*getParams, *getResult](c, "skills/get"); err != nil {
		t.Fatal(err)
	}
	if err := mcp.AddSendingCustomMethod[*dirParams, *dirResult](c, "resources/directory/read"); err != nil {
		t.Fatal(err)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}
	if token != "" {
		tr.HTTPClient = BearerClient(token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect (%q): %v", version, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func listSkills(t *testing.T, cs *mcp.ClientSession, cursor string) (*listResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*listParams, *listResult](ctx, cs, "skills/list", &listParams{Cursor: cursor})
}

// listAllSkills pages through skills/list, checking each page's shape.
func listAllSkills(t *testing.T, cs *mcp.ClientSession) (skills []skillEntry, pages int) {
	t.Helper()
	cursor := ""
	for {
		res, err := listSkills(t, cs, cursor)
		if err != nil {
			t.Fatalf("skills/list (cursor %q): %v", cursor, err)
		}
		if res.ResultType != "complete" || res.TTLMs == nil || res.CacheScope != "private" {
			t.Fatalf("skills/list page: resultType %q, ttlMs %v, cacheScope %q; want complete, set, private", res.ResultType, res.TTLMs, res.CacheScope)
		}
		skills = append(skills, res.Skills...)
		pages++
		if res.NextCursor == "" {
			return skills, pages
		}
		cursor = res.NextCursor
		if pages > 10 {
			t.Fatal("skills/list does not end")
		}
	}
}

func getSkill(cs *mcp.ClientSession, uri string) (*getResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return mcp.CallCustomMethod[*getParams, *getResult](ctx, cs, "skills/get", &getParams{URI: uri})
}

// wantEntry is the entry the extension must give sm: every file by its
// canonical URI, its digest and size.
func wantEntry(sm protocol.SignedManifest, fm map[string]any) skillEntry {
	e := skillEntry{URI: "skill://" + sm.Manifest.Name + "/SKILL.md", Frontmatter: fm}
	for _, f := range sm.Manifest.Files {
		e.Resources = append(e.Resources, skillFile{URI: wantURI(sm.Manifest.Name, f.Path), Digest: "sha256:" + f.SHA256, Size: f.Size})
	}
	return e
}

// wantURI spells the URIs of deployFiles by hand, so that a change of the
// gateway's encoding shows.
func wantURI(name, path string) string {
	switch path {
	case "templates/my file.md":
		return "skill://" + name + "/templates/my%20file.md"
	case "notes/résumé.txt":
		return "skill://" + name + "/notes/r%C3%A9sum%C3%A9.txt"
	}
	return "skill://" + name + "/" + path
}

// readSkillBytes reads a skill file and returns its bytes, whether sent
// as text or base64.
func readSkillBytes(t *testing.T, cs *mcp.ClientSession, uri string) ([]byte, *mcp.ResourceContents) {
	t.Helper()
	c := readResource(t, cs, uri)
	if c.URI != uri {
		t.Errorf("read %s: contents of %s", uri, c.URI)
	}
	if c.Blob != nil {
		return c.Blob, c
	}
	return []byte(c.Text), c
}

// rpcCode returns the JSON-RPC error code of err (0 when none).
func rpcCode(err error) int64 {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je.Code
	}
	return 0
}

// TestSkillsExtension: the extension is declared; skills/list pages
// through every skill; skills/get gives the same entry as the listing,
// with the SKILL.md frontmatter verbatim and every file's digest and
// size; each file reads back byte for byte; resources/list lists them;
// unknown skills, files and bad URIs are refused with -32602 — in both
// protocol eras.
func TestSkillsExtension(t *testing.T) {
	src := newMemSkills(t)
	names := fillSkills(t, src)
	deploy, _, _ := src.ServedSkill(context.Background(), "deploy-app")
	e := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.SkillSource = src }})
	for _, version := range []string{"2025-11-25", ""} {
		t.Run("protocol="+version, func(t *testing.T) {
			cs := skillsClient(t, e.Gateway.MCPURL(), version, "")
			if version == "" && cs.InitializeResult().ProtocolVersion < "2026-07-28" {
				t.Fatalf("the latest client negotiated %s", cs.InitializeResult().ProtocolVersion)
			}
			ext := cs.InitializeResult().Capabilities.Extensions
			if settings, ok := ext["io.modelcontextprotocol/skills"]; !ok || !reflect.DeepEqual(settings, map[string]any{"directoryRead": true}) {
				t.Fatalf("capabilities.extensions = %v; want io.modelcontextprotocol/skills: {directoryRead: true}", ext)
			}
			if cs.InitializeResult().Capabilities.Resources == nil {
				t.Fatal("the resources capability is not declared; the extension requires it")
			}

			skills, pages := listAllSkills(t, cs)
			var got []string
			for _, s := range skills {
				got = append(got, s.Frontmatter["name"].(string))
			}
			if !slices.Equal(got, names) || pages != 2 {
				t.Fatalf("skills/list: %d pages of %v; want 2 pages of %v", pages, got, names)
			}
			want := wantEntry(deploy, deployFrontmatter)
			i := slices.IndexFunc(skills, func(s skillEntry) bool { return s.URI == want.URI })
			if !reflect.DeepEqual(skills[i], want) {
				t.Fatalf("listed entry:\n%+v\nwant\n%+v", skills[i], want)
			}
			res, err := getSkill(cs, want.URI)
			if err != nil {
				t.Fatalf("skills/get %s: %v", want.URI, err)
			}
			if !reflect.DeepEqual(res.Skill, want) || res.ResultType != "complete" || res.TTLMs == nil || res.CacheScope != "private" {
				t.Fatalf("skills/get: %+v\nwant %+v", res, want)
			}

			for _, f := range deploy.Manifest.Files {
				uri := wantURI("deploy-app", f.Path)
				data, c := readSkillBytes(t, cs, uri)
				sum := sha256.Sum256(data)
				if string(data) != deployFiles[f.Path] || "sha256:"+hex.EncodeToString(sum[:]) != "sha256:"+f.SHA256 || int64(len(data)) != f.Size {
					t.Errorf("read %s: %q, want %q", uri, data, deployFiles[f.Path])
				}
				if f.Path == "SKILL.md" && c.MIMEType != "text/markdown" {
					t.Errorf("SKILL.md MIME type %q, want text/markdown", c.MIMEType)
				}
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			listed, err := cs.ListResources(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			byURI := map[string]*mcp.Resource{}
			for _, r := range listed.Resources {
				byURI[r.URI] = r
			}
			md := byURI["skill://deploy-app/SKILL.md"]
			if md == nil || md.Name != "deploy-app" || md.Description != deployFrontmatter["description"] || md.MIMEType != "text/markdown" {
				t.Fatalf("resources/list: SKILL.md resource %+v", md)
			}
			for _, f := range want.Resources {
				if r := byURI[f.URI]; r == nil || r.Size != f.Size {
					t.Errorf("resources/list: %s missing or of the wrong size: %+v", f.URI, r)
				}
			}
			if byURI["resource://skills"] == nil || byURI["resource://hosts"] == nil {
				t.Error("resources/list lost the gateway's own resources")
			}

			checkDirectories(t, cs)

			refused := []struct{ what, uri string }{
				{"unknown skill", "skill://no-such-skill/SKILL.md"},
				{"a file the skill lacks", "skill://deploy-app/missing.md"},
				{"a file that is not SKILL.md", "skill://deploy-app/scripts/run.sh"},
				{"an escaping path", "skill://deploy-app/../tiny-00/SKILL.md"},
				{"an encoded escape", "skill://deploy-app/%2E%2E/SKILL.md"},
				{"a non-canonical spelling", "skill://deploy-app/SKILL%2Emd"},
				{"an invalid name", "skill://Deploy-App/SKILL.md"},
				{"another scheme", "file:///etc/passwd"},
			}
			for _, r := range refused {
				if _, err := getSkill(cs, r.uri); rpcCode(err) != jsonrpc.CodeInvalidParams {
					t.Errorf("skills/get of %s (%s): %v, want error -32602", r.what, r.uri, err)
				}
			}
			for _, r := range refused[:2] {
				_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: r.uri})
				if rpcCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), "not found") {
					t.Errorf("read of %s (%s): %v, want resource not found (-32602)", r.what, r.uri, err)
				}
			}
			for _, uri := range []string{"skill://deploy-app/%2E%2E/SKILL.md", "skill://deploy-app/SKILL%2Emd", "skill://deploy-app/templates/my file.md"} {
				if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); rpcCode(err) != jsonrpc.CodeInvalidParams {
					t.Errorf("read of %s: %v, want -32602", uri, err)
				}
			}
			if _, err := listSkills(t, cs, "bm90LWEtY3Vyc29y"); rpcCode(err) != jsonrpc.CodeInvalidParams {
				t.Errorf("skills/list with a forged cursor: %v, want -32602", err)
			}
		})
	}
}

// checkDirectories reads deploy-app's folders with
// resources/directory/read: direct children only, folders as
// inode/directory resources, files with their metadata; a file, a
// missing folder or skill is not a directory.
func checkDirectories(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	type child struct {
		URI, Name, MIME string
		Size            int64
	}
	want := map[string][]child{
		"skill://deploy-app": {
			{"skill://deploy-app/SKILL.md", "SKILL.md", "text/markdown", int64(len(deploySkillMD))},
			{"skill://deploy-app/assets", "assets", "inode/directory", 0},
			{"skill://deploy-app/empty.txt", "empty.txt", "text/plain", 0},
			{"skill://deploy-app/notes", "notes", "inode/directory", 0},
			{"skill://deploy-app/scripts", "scripts", "inode/directory", 0},
			{"skill://deploy-app/templates", "templates", "inode/directory", 0},
		},
		"skill://deploy-app/templates": {{"skill://deploy-app/templates/my%20file.md", "my file.md", "text/markdown", int64(len(deployFiles["templates/my file.md"]))}},
		"skill://deploy-app/notes":     {{"skill://deploy-app/notes/r%C3%A9sum%C3%A9.txt", "résumé.txt", "text/plain", int64(len(deployFiles["notes/résumé.txt"]))}},
	}
	for uri, children := range want {
		res, err := readDir(cs, uri)
		if err != nil {
			t.Fatalf("resources/directory/read %s: %v", uri, err)
		}
		var got []child
		for _, r := range res.Resources {
			got = append(got, child{r.URI, r.Name, r.MIMEType, r.Size})
		}
		if res.ResultType != "complete" || res.NextCursor != "" || !reflect.DeepEqual(got, children) {
			t.Errorf("resources/directory/read %s: %q %+v\nwant %+v", uri, res.ResultType, got, children)
		}
	}
	for _, uri := range []string{"skill://deploy-app/SKILL.md", "skill://deploy-app/missing", "skill://no-such-skill",
		"skill://deploy-app/", "skill://deploy-app/templates/", "skill://Deploy-app", "resource://hosts"} {
		if _, err := readDir(cs, uri); rpcCode(err) != jsonrpc.CodeInvalidParams {
			t.Errorf("resources/directory/read %s: %v, want -32602", uri, err)
		}
	}
}

// TestSkillsVisibilityFollowsReload: who may see the fleet's skills is
// decided with the access rules in force, so a reload that denies a
// caller the skill tool hides them at its next request.
func TestSkillsVisibilityFollowsReload(t *testing.T) {
	src := newMemSkills(t)
	fillSkills(t, src)
	dir := t.TempDir()
	accessFile := filepath.Join(dir, "access.yaml")
	writeFile(t, accessFile, "rules:\n  - {name: no-writes, deny: true, match: {sub: \"*\"}, hosts: [\"*\"], tools: [write]}\n")
	rules, err := access.LoadRules(accessFile)
	if err != nil {
		t.Fatal(err)
	}
	tok, line, err := access.NewAPIToken("skiller")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+strings.Replace(line, `tools: [read]`, `tools: [skill]`, 1)+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := NewEnv(t, Options{Agents: []string{"alpha"}, Gateway: func(c *gateway.Config) {
		c.SkillSource = src
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: tokens}
		c.Access = rules
	}})
	cs := skillsClient(t, e.Gateway.MCPURL(), "", tok)
	if skills, _ := listAllSkills(t, cs); len(skills) == 0 {
		t.Fatal("a caller granted skill sees no skills")
	}
	writeFile(t, accessFile, "rules:\n  - {name: no-skills, deny: true, match: {sub: \"*\"}, hosts: [\"*\"], tools: [skill]}\n")
	if err := e.Gateway.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	res, err := listSkills(t, cs, "")
	if err != nil {
		t.Fatalf("skills/list after the reload: %v", err)
	}
	if len(res.Skills) != 0 {
		t.Fatalf("after a reload that denies the skill tool, skills/list shows %d skills; want none", len(res.Skills))
	}
}

// TestSkillsExtensionAccess: a caller whose access rules grant the skill
// tool on no host sees no skills, and every skill and file is unknown to
// it, answered exactly as for a skill that does not exist.
func TestSkillsExtensionAccess(t *testing.T) {
	src := newMemSkills(t)
	fillSkills(t, src)
	tokenLines := map[string]string{}
	tokens := map[string]string{}
	for name, grant := range map[string]string{
		"skiller":   `hosts: [alpha], tools: [skill]`,
		"reader":    `hosts: ["*"], tools: [read, bash]`,
		"elsewhere": `hosts: [nowhere], tools: [skill]`,
	} {
		tok, line, err := access.NewAPIToken(name)
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = tok
		tokenLines[name] = strings.Replace(line, `hosts: ["*"], tools: [read]`, grant, 1)
	}
	var yaml strings.Builder
	yaml.WriteString("tokens:\n")
	for _, l := range tokenLines {
		yaml.WriteString("  " + l + "\n")
	}
	parsed, err := access.ParseAPITokens("tokens.yaml", []byte(yaml.String()))
	if err != nil {
		t.Fatal(err)
	}
	e := NewEnv(t, Options{Agents: []string{"alpha", "beta"}, Gateway: func(c *gateway.Config) {
		c.SkillSource = src
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: parsed}
	}})
	for _, version := range []string{"2025-11-25", ""} {
		t.Run("protocol="+version, func(t *testing.T) {
			ok := skillsClient(t, e.Gateway.MCPURL(), version, tokens["skiller"])
			if skills, _ := listAllSkills(t, ok); len(skills) != 61 {
				t.Fatalf("a caller granted skill on alpha sees %d skills, want 61", len(skills))
			}
			unknownRead := readErrText(t, ok, "skill://no-such-skill/SKILL.md")
			for _, who := range []string{"reader", "elsewhere"} {
				cs := skillsClient(t, e.Gateway.MCPURL(), version, tokens[who])
				res, err := listSkills(t, cs, "")
				if err != nil {
					t.Fatalf("%s: skills/list: %v", who, err)
				}
				if len(res.Skills) != 0 || res.NextCursor != "" {
					t.Fatalf("%s: skills/list shows %d skills (next cursor %q); want an empty list", who, len(res.Skills), res.NextCursor)
				}
				_, err = getSkill(cs, "skill://deploy-app/SKILL.md")
				if rpcCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), "no skill is served at skill://deploy-app/SKILL.md") {
					t.Fatalf("%s: skills/get: %v; want the unknown-skill error", who, err)
				}
				if _, err := readDir(cs, "skill://deploy-app"); rpcCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), "no directory is served") {
					t.Fatalf("%s: resources/directory/read: %v; want the unknown-directory error", who, err)
				}
				got := readErrText(t, cs, "skill://deploy-app/SKILL.md")
				if strings.ReplaceAll(got, "deploy-app", "no-such-skill") != unknownRead {
					t.Fatalf("%s: refused read %q differs from an unknown skill's %q", who, got, unknownRead)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				listed, err := cs.ListResources(ctx, nil)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range listed.Resources {
					if strings.HasPrefix(r.URI, "skill://") {
						t.Fatalf("%s: resources/list shows %s", who, r.URI)
					}
				}
			}
		})
	}
}

// readErrText reads uri expecting an error, and returns its message.
func readErrText(t *testing.T, cs *mcp.ClientSession, uri string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if rpcCode(err) != jsonrpc.CodeInvalidParams {
		t.Fatalf("read %s: %v, want a -32602 error", uri, err)
	}
	return err.Error()
}

// TestSkillsExtensionDamagedStore: a store that returns wrong bytes for a
// file gets an error, never the bytes; a damaged SKILL.md takes the skill
// out of the listing and skills/get fails, while other skills still
// serve.
func TestSkillsExtensionDamagedStore(t *testing.T) {
	src := newMemSkills(t)
	fillSkills(t, src)
	deploy, _, _ := src.ServedSkill(context.Background(), "deploy-app")
	e := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.SkillSource = src }})
	cs := skillsClient(t, e.Gateway.MCPURL(), "", "")
	sha := func(path string) string {
		i := slices.IndexFunc(deploy.Manifest.Files, func(f protocol.BundleFile) bool { return f.Path == path })
		return deploy.Manifest.Files[i].SHA256
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	src.damage(sha("scripts/run.sh"), []byte("#!/bin/sh\nrm -rf /\n"))    // different bytes
	src.damage(sha("templates/my file.md"), []byte("Dear {{name}},\n\n")) // one byte more
	for _, uri := range []string{"skill://deploy-app/scripts/run.sh", "skill://deploy-app/templates/my%20file.md"} {
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err == nil || rpcCode(err) != jsonrpc.CodeInternalError || !strings.Contains(err.Error(), "do not match") {
			t.Fatalf("read %s from a damaged store: %+v, %v; want an internal error", uri, res, err)
		}
	}
	if data, _ := readSkillBytes(t, cs, "skill://deploy-app/SKILL.md"); string(data) != deploySkillMD {
		t.Fatalf("an intact file of the damaged skill: %q", data)
	}

	// A damaged SKILL.md is never served; and a gateway that has not
	// parsed it before (another gateway over the same store) leaves the
	// skill out of skills/list and fails skills/get.
	src.damage(sha("SKILL.md"), []byte(strings.Replace(deploySkillMD, "team's way", "attacker's way", 1)))
	// (The same client: a file read is never to be kept, so it asks again.)
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "skill://deploy-app/SKILL.md"}); rpcCode(err) != jsonrpc.CodeInternalError {
		t.Fatalf("read of a damaged SKILL.md: %v, want -32603", err)
	}
	e2 := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.SkillSource = src }})
	cs2 := skillsClient(t, e2.Gateway.MCPURL(), "2025-11-25", "")
	skills, _ := listAllSkills(t, cs2)
	if len(skills) != 60 || slices.ContainsFunc(skills, func(s skillEntry) bool { return s.Frontmatter["name"] == "deploy-app" }) {
		t.Fatalf("listing over a damaged SKILL.md: %d skills", len(skills))
	}
	if _, err := getSkill(cs2, "skill://deploy-app/SKILL.md"); rpcCode(err) != jsonrpc.CodeInternalError {
		t.Fatalf("skills/get of a skill whose SKILL.md is damaged: %v, want -32603", err)
	}
}

// TestSkillsExtensionRolledOut: a gateway serves the extension from its
// own skill store: before anything is pushed the list is empty, and the
// skill tool and resource://skills are there as before.
func TestSkillsExtensionRolledOut(t *testing.T) {
	e := NewEnv(t)
	for _, version := range []string{"2025-11-25", ""} {
		cs := skillsClient(t, e.Gateway.MCPURL(), version, "")
		if _, ok := cs.InitializeResult().Capabilities.Extensions["io.modelcontextprotocol/skills"]; !ok {
			t.Fatalf("(%q) the gateway does not declare the skills extension", version)
		}
		var cat map[string]any
		readJSON(t, cs, "resource://skills", &cat)
		res, err := listSkills(t, cs, "")
		if err != nil || len(res.Skills) != 0 {
			t.Fatalf("(%q) skills/list with nothing pushed: %+v, %v; want an empty list", version, res, err)
		}
	}
}

// TestSkillsTypeScriptClient: the TypeScript SDK's client lists the
// skills, gets one and reads each of its files, byte for byte.
func TestSkillsTypeScriptClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: install Node.js 20 or later, then run integration/tsclient/install.sh")
	}
	dir, err := filepath.Abs("tsclient")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		t.Skip("the TypeScript MCP SDK is not installed: run integration/tsclient/install.sh")
	}
	src := newMemSkills(t)
	fillSkills(t, src)
	deploy, _, _ := src.ServedSkill(context.Background(), "deploy-app")
	e := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.SkillSource = src }})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "skills.mjs", e.Gateway.MCPURL(), "deploy-app")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node skills.mjs: %v\n%s", err, stderr.String())
	}
	var seen struct {
		Extensions map[string]any `json:"extensions"`
		Names      []string       `json:"names"`
		Listed     skillEntry     `json:"listed"`
		Got        skillEntry     `json:"got"`
		Files      map[string]struct {
			Size     int64  `json:"size"`
			Digest   string `json:"digest"`
			Base64   string `json:"base64"`
			MIMEType string `json:"mimeType"`
		} `json:"files"`
		Unknown *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"unknown"`
	}
	if err := json.Unmarshal(out, &seen); err != nil {
		t.Fatalf("node output: %v\n%s", err, out)
	}
	if _, ok := seen.Extensions["io.modelcontextprotocol/skills"]; !ok {
		t.Errorf("the TypeScript client sees extensions %v", seen.Extensions)
	}
	if len(seen.Names) != 61 {
		t.Errorf("the TypeScript client listed %d skills, want 61", len(seen.Names))
	}
	want := wantEntry(deploy, deployFrontmatter)
	if !reflect.DeepEqual(seen.Listed, want) || !reflect.DeepEqual(seen.Got, want) {
		t.Fatalf("TypeScript client: listed %+v\ngot %+v\nwant %+v", seen.Listed, seen.Got, want)
	}
	for _, f := range deploy.Manifest.Files {
		uri := wantURI("deploy-app", f.Path)
		got, ok := seen.Files[uri]
		data, _ := base64.StdEncoding.DecodeString(got.Base64)
		if !ok || string(data) != deployFiles[f.Path] || got.Digest != "sha256:"+f.SHA256 || got.Size != f.Size {
			t.Errorf("TypeScript client read %s: %+v (%q)", uri, got, data)
		}
	}
	if seen.Unknown == nil || seen.Unknown.Code != jsonrpc.CodeInvalidParams {
		t.Errorf("TypeScript client, unknown skill: %+v, want error -32602", seen.Unknown)
	}
}
