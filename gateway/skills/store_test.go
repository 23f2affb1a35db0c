package skills

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func skillMD(name, desc string) []byte {
	return []byte("---\nname: " + name + "\ndescription: " + desc + "\n---\n# " + name + "\n")
}

// storedCounts returns how many files and manifests the store holds.
func storedCounts(t *testing.T, s *Store) (files, manifests int) {
	t.Helper()
	ctx := context.Background()
	objs, err := s.files.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		t.Fatal(err)
	}
	keys, err := s.bundles.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range keys.Keys() {
		manifests++
	}
	return len(objs), manifests
}

// A bundle that breaks a rule is refused with a reason, and nothing of
// it is stored: no file, no manifest.
func TestSkillPushRefusals(t *testing.T) {
	ns := startJetStream(t)
	s := testSkills(t, ns, newFakeFleet("web-1"), testSigningKey(t), "a")
	ok := skillMD("deploy", "Deploys the app.")
	big := bytes.Repeat([]byte("x"), protocol.MaxBundleBytes/2+1)
	many := []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}}
	for i := range protocol.MaxBundleFiles {
		many = append(many, protocol.SkillPushFile{Path: fmt.Sprintf("f%03d", i), Data: []byte{byte(i)}})
	}
	for _, tt := range []struct {
		name, skill string
		files       []protocol.SkillPushFile
		want        string
	}{
		{"no SKILL.md", "deploy", []protocol.SkillPushFile{{Path: "README.md", Data: []byte("x")}}, "no SKILL.md"},
		{"name differs from frontmatter", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD("other", "x")}}, "differs from its folder name"},
		{"no description", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: []byte("---\nname: deploy\n---\n")}}, "description is missing"},
		{"no frontmatter", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: []byte("# deploy\n")}}, "does not start with YAML frontmatter"},
		{"unknown key", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: []byte("---\nname: deploy\ndescription: x\nrun: rm\n---\n")}}, "unknown key"},
		{"bad skill name", "Deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}}, "lowercase"},
		{"escape", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "../x", Data: []byte("x")}}, ".. part"},
		{"absolute", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "/etc/x", Data: []byte("x")}}, "absolute"},
		{"device name", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "scripts/CON.txt", Data: []byte("x")}}, "device"},
		{"case clash", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "a.txt", Data: []byte("1")}, {Path: "A.txt", Data: []byte("2")}}, "differ only in case"},
		{"twice", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "a", Data: []byte("1")}, {Path: "a", Data: []byte("2")}}, "twice"},
		{"bad mode", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok, Mode: 0o777}}, "mode 777"},
		{"oversize", "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: ok}, {Path: "a", Data: big}, {Path: "b", Data: big}}, "over 16 MiB"},
		{"too many files", "deploy", many, "the limit is 512"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.push(context.Background(), tt.skill, tt.files, "test")
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("push = %v, want a refusal containing %q", err, tt.want)
			}
			if f, m := storedCounts(t, s); f != 0 || m != 0 {
				t.Fatalf("a refused push stored %d files and %d manifests", f, m)
			}
		})
	}
}

// The same bundle pushed twice is one version; a second version shares
// the files it did not change.
func TestSkillPushVersions(t *testing.T) {
	ns := startJetStream(t)
	key := testSigningKey(t)
	s := testSkills(t, ns, newFakeFleet("web-1"), key, "a")
	ctx := context.Background()
	v1 := []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD("deploy", "Deploys.")}, {Path: "scripts/run.sh", Data: []byte("#!/bin/sh\necho hi\n"), Mode: 0o755},
		{Path: "ref.md", Data: []byte("reference")}}
	a, err := s.push(ctx, "deploy", v1, "alice")
	if err != nil || !a.Created {
		t.Fatalf("first push = %+v, %v", a, err)
	}
	b, err := s.push(ctx, "deploy", v1, "bob")
	if err != nil || b.Created || b.BundleID != a.BundleID || b.PushedBy != "alice" {
		t.Fatalf("second push of the same files = %+v, %v; want the first version, not created", b, err)
	}
	if f, m := storedCounts(t, s); f != 3 || m != 1 {
		t.Fatalf("stored %d files and %d manifests, want 3 and 1", f, m)
	}
	v2 := append([]protocol.SkillPushFile{}, v1...)
	v2[2] = protocol.SkillPushFile{Path: "ref.md", Data: []byte("reference, second edition")}
	c, err := s.push(ctx, "deploy", v2, "alice")
	if err != nil || !c.Created || c.BundleID == a.BundleID {
		t.Fatalf("push of a changed bundle = %+v, %v", c, err)
	}
	if f, m := storedCounts(t, s); f != 4 || m != 2 {
		t.Fatalf("after a second version: %d files and %d manifests, want 4 (3 shared + 1) and 2", f, m)
	}
	if vs := s.versions("deploy"); len(vs) != 2 || vs[0].BundleID != c.BundleID {
		t.Fatalf("versions = %d, newest %v", len(vs), vs)
	}
	// The manifest is signed by the gateway's key and names the modes.
	rec, err := s.bundle(ctx, strings.TrimPrefix(a.BundleID, "sha256:"))
	if err != nil {
		t.Fatal(err)
	}
	if err := protocol.VerifyBytes(key.trusted(), protocol.PurposeManifest, rec.Manifest.CanonicalBytes(), rec.Signature); err != nil {
		t.Fatal(err)
	}
	if rec.Manifest.Files[2].Path != "scripts/run.sh" || rec.Manifest.Files[2].Mode != 0o755 {
		t.Fatalf("manifest files = %+v", rec.Manifest.Files)
	}
	// What the MCP Skills extension serves: the latest push, no rollout yet.
	got, ok, err := s.ServedSkill(ctx, "deploy")
	if err != nil || !ok || got.BundleID != c.BundleID {
		t.Fatalf("served = %v %v %v", got.BundleID, ok, err)
	}
	data, err := s.SkillFile(ctx, rec.Manifest.Files[1].SHA256)
	if err != nil || string(data) != "reference" {
		t.Fatalf("SkillFile = %q, %v", data, err)
	}
}

// blobReply asks for a part of a file as host and returns the bytes or
// the error code.
func blobReply(t *testing.T, s *Store, host string, req protocol.SkillBlobRequest) ([]byte, string) {
	t.Helper()
	data, _ := json.Marshal(req)
	m, err := agentRequest(s.nc, protocol.SkillsBlobSubject(host), data, waitFor)
	if err != nil {
		t.Fatal(err)
	}
	if code := m.Header.Get(protocol.SkillsErrorHeader); code != "" {
		var e protocol.APIError
		if err := json.Unmarshal(m.Data, &e); err != nil || string(e.Code) != code || e.Message == "" {
			t.Fatalf("error reply %q is not an APIError with code %s", m.Data, code)
		}
		return nil, code
	}
	return m.Data, ""
}

// Agents get manifests and files in parts; an unknown digest, a bad
// request, and a host that is unknown or revoked are refused with an
// APIError; many hosts fetching one file read it from the object store
// once.
func TestSkillServe(t *testing.T) {
	ns := startJetStream(t)
	fleet := newFakeFleet("web-1", "web-2")
	fleet.revoked["web-2"] = true
	key := testSigningKey(t)
	s := testSkills(t, ns, fleet, key, "a")
	ctx := context.Background()
	large := make([]byte, protocol.MaxBlobChunk*2+1234)
	for i := range large {
		large[i] = byte(i * 7)
	}
	resp, err := s.push(ctx, "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD("deploy", "Deploys.")}, {Path: "data.bin", Data: large}}, "t")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(large)
	digest := hex.EncodeToString(sum[:])
	got, err := fetchBlob(s.nc, "web-1", digest, int64(len(large)))
	if err != nil || !bytes.Equal(got, large) {
		t.Fatalf("chunked fetch: %d bytes, %v", len(got), err)
	}
	if part, code := blobReply(t, s, "web-1", protocol.SkillBlobRequest{SHA256: digest, Offset: protocol.MaxBlobChunk * 2, Length: protocol.MaxBlobChunk}); code != "" || len(part) != 1234 {
		t.Fatalf("last part = %d bytes, %s", len(part), code)
	}
	bad := []struct {
		host string
		req  protocol.SkillBlobRequest
		code protocol.APICode
	}{
		{"web-1", protocol.SkillBlobRequest{SHA256: strings.Repeat("0", 64), Length: 10}, protocol.APINotFound},
		{"web-1", protocol.SkillBlobRequest{SHA256: "../../etc/passwd", Length: 10}, protocol.APIBadRequest},
		{"web-1", protocol.SkillBlobRequest{SHA256: strings.ToUpper(digest), Length: 10}, protocol.APIBadRequest},
		{"web-1", protocol.SkillBlobRequest{SHA256: digest, Length: protocol.MaxBlobChunk + 1}, protocol.APIBadRequest},
		{"web-1", protocol.SkillBlobRequest{SHA256: digest, Offset: -1, Length: 10}, protocol.APIBadRequest},
		{"web-1", protocol.SkillBlobRequest{SHA256: digest, Offset: int64(len(large)) + 1, Length: 10}, protocol.APIBadRequest},
		{"web-2", protocol.SkillBlobRequest{SHA256: digest, Length: 10}, protocol.APIForbidden},
		{"db-9", protocol.SkillBlobRequest{SHA256: digest, Length: 10}, protocol.APIForbidden},
	}
	for _, b := range bad {
		if _, code := blobReply(t, s, b.host, b.req); code != string(b.code) {
			t.Errorf("blob %+v as %s: code %q, want %q", b.req, b.host, code, b.code)
		}
	}
	// Manifests: known, unknown, malformed, revoked host.
	manifest := func(host, id string) (protocol.SignedManifest, string) {
		data, _ := json.Marshal(protocol.SkillManifestRequest{BundleID: id})
		m, err := agentRequest(s.nc, protocol.SkillsManifestSubject(host), data, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		var sm protocol.SignedManifest
		if code := m.Header.Get(protocol.SkillsErrorHeader); code != "" {
			return sm, code
		}
		if err := json.Unmarshal(m.Data, &sm); err != nil {
			t.Fatal(err)
		}
		return sm, ""
	}
	if sm, code := manifest("web-1", resp.BundleID); code != "" || sm.Manifest.BundleID() != resp.BundleID {
		t.Fatalf("manifest = %v, %s", sm.BundleID, code)
	}
	for _, c := range []struct{ host, id, code string }{
		{"web-1", "sha256:" + strings.Repeat("1", 64), string(protocol.APINotFound)},
		{"web-1", "md5:1234", string(protocol.APIBadRequest)},
		{"web-2", resp.BundleID, string(protocol.APIForbidden)},
	} {
		if _, code := manifest(c.host, c.id); code != c.code {
			t.Errorf("manifest %s as %s: %q, want %q", c.id, c.host, code, c.code)
		}
	}
	// Many hosts at once: one read of the file from the store.
	_, loadsBefore := s.cache.stats()
	fleet.hosts["web-3"] = map[string]string{}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := fetchBlob(s.nc, "web-1", digest, int64(len(large))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if _, loads := s.cache.stats(); loads != loadsBefore {
		t.Fatalf("20 fetches of a cached file read the object store %d more times", loads-loadsBefore)
	}
}

// The cache holds at most its bound, evicting the least recently used,
// and concurrent misses of one file share one load.
func TestBlobCacheBound(t *testing.T) {
	c := newBlobCache(100)
	loads := 0
	var mu sync.Mutex
	load := func(_ context.Context, d string) ([]byte, error) {
		mu.Lock()
		loads++
		mu.Unlock()
		return bytes.Repeat([]byte(d[:1]), 40), nil
	}
	ctx := context.Background()
	for _, d := range []string{"a", "b", "a", "c", "a", "b"} {
		if _, err := c.get(ctx, d, load); err != nil {
			t.Fatal(err)
		}
	}
	// a, b (2 loads), a hit, c evicts b, a hit, b evicts c: 4 loads.
	if n, _ := c.stats(); n > 100 || loads != 4 {
		t.Fatalf("cache holds %d bytes after %d loads; want at most 100 after 4", n, loads)
	}
	if _, err := c.get(ctx, "huge", func(context.Context, string) ([]byte, error) { return make([]byte, 500), nil }); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.stats(); n > 100 {
		t.Fatalf("a file over the bound was kept: %d bytes", n)
	}
}

// TestSkillRecordsResigned: during a rotation the stored manifests and
// desired states are signed again with the new key, so that after the
// old key is retired hosts still take them; a record the fleet never
// signed is left as it is.
func TestSkillRecordsResigned(t *testing.T) {
	ns := startJetStream(t)
	_, oldPriv, _ := ed25519.GenerateKey(nil)
	key := memorySigningKey(oldPriv, nil)
	s := testSkills(t, ns, newFakeFleet("web-1"), key, "a")
	ctx := context.Background()
	pushed, err := s.push(ctx, "deploy", []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD("deploy", "Deploys.")}}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.setDesired(ctx, "web-1", func(m map[string]protocol.DesiredSkill) bool {
		m["deploy"] = protocol.DesiredSkill{BundleID: pushed.BundleID, Rollout: "r-1"}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	_, rogue, _ := ed25519.GenerateKey(nil)
	foreign, _ := json.Marshal(&protocol.SignedDesiredState{State: protocol.DesiredState{Host: "web-2", Revision: 1},
		Signature: protocol.SignBytes(rogue, protocol.PurposeDesired, (&protocol.DesiredState{Host: "web-2", Revision: 1}).CanonicalBytes())})
	if _, err := s.desired.Put(ctx, "web-2", foreign); err != nil {
		t.Fatal(err)
	}
	// Rotate: a new current key, the old one retiring.
	_, newPriv, _ := ed25519.GenerateKey(nil)
	key.set(newPriv, oldPriv)
	n, err := s.resignStored(ctx)
	if err != nil || n != 2 {
		t.Fatalf("re-signed %d records (%v), want the manifest and web-1's state", n, err)
	}
	// Retire: only the new key is left.
	key.set(newPriv, nil)
	d, _, err := s.readDesired(ctx, "web-1")
	if err != nil || d.Skills["deploy"].BundleID != pushed.BundleID {
		t.Errorf("web-1's desired state after the retirement: %+v, %v", d, err)
	}
	// The gateways' copy of the manifest follows the bucket.
	waitUntil(t, "the manifest signed with the new key", func() bool {
		rec, err := s.bundle(ctx, strings.TrimPrefix(pushed.BundleID, "sha256:"))
		return err == nil && protocol.VerifyBytes(key.trusted(), protocol.PurposeManifest, rec.Manifest.CanonicalBytes(), rec.Signature) == nil
	})
	e, _ := s.desired.Get(ctx, "web-2")
	if string(e.Value()) != string(foreign) {
		t.Error("a record the fleet never signed was signed again")
	}
	if n, err := s.resignStored(ctx); err != nil || n != 0 {
		t.Errorf("a second pass re-signed %d records (%v)", n, err)
	}
}
