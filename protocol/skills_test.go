package protocol

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func sampleManifest() Manifest {
	return Manifest{Name: "deploy-web", Files: []BundleFile{
		{Path: "SKILL.md", Size: 5, Mode: 0o644, SHA256: digest("skill")},
		{Path: "scripts/run.sh", Size: 3, Mode: 0o755, SHA256: digest("run")},
	}}
}

func TestManifestCanonical(t *testing.T) {
	m := sampleManifest()
	want := "fleetmcp-skill-v1 name=10:deploy-web\n8:SKILL.md 5 644 " + digest("skill") + "\n14:scripts/run.sh 3 755 " + digest("run") + "\n"
	if got := string(m.CanonicalBytes()); got != want {
		t.Errorf("canonical bytes\n%q\nwant\n%q", got, want)
	}
	id := m.BundleID()
	if !strings.HasPrefix(id, "sha256:") || len(id) != 7+64 {
		t.Errorf("bundle id %q", id)
	}
	m2 := sampleManifest()
	m2.Files[1].Mode = 0o644
	if m2.BundleID() == id {
		t.Error("a changed mode keeps the bundle id")
	}
	if err := m.Validate(); err != nil {
		t.Errorf("valid manifest refused: %v", err)
	}
}

func TestManifestValidateRefuses(t *testing.T) {
	cases := map[string]func(m *Manifest){
		"bad name":    func(m *Manifest) { m.Name = "Deploy" },
		"no SKILL.md": func(m *Manifest) { m.Files = m.Files[1:] },
		"unsorted":    func(m *Manifest) { m.Files[0], m.Files[1] = m.Files[1], m.Files[0] },
		"duplicate":   func(m *Manifest) { m.Files[1] = m.Files[0] },
		"case clash": func(m *Manifest) {
			m.Files = append(m.Files, BundleFile{Path: "skill.md", Mode: 0o644, SHA256: digest("")})
		},
		"mode":      func(m *Manifest) { m.Files[1].Mode = 0o4755 },
		"digest":    func(m *Manifest) { m.Files[1].SHA256 = strings.ToUpper(m.Files[1].SHA256) },
		"negative":  func(m *Manifest) { m.Files[1].Size = -1 },
		"too large": func(m *Manifest) { m.Files[1].Size = MaxBundleBytes },
		"file + folder": func(m *Manifest) {
			m.Files = append(m.Files, BundleFile{Path: "scripts/run.sh/x", Mode: 0o644, SHA256: digest("")})
		},
		"escape": func(m *Manifest) { m.Files[1].Path = "../x" },
	}
	for name, change := range cases {
		m := sampleManifest()
		change(&m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	m := sampleManifest()
	for i := range MaxBundleFiles {
		m.Files = append(m.Files, BundleFile{Path: "z/" + strings.Repeat("a", 1+i%200) + string(rune('a'+i/200)), Mode: 0o644, SHA256: digest("")})
	}
	SortFiles(m.Files)
	if err := m.Validate(); err == nil || !strings.Contains(err.Error(), "files") {
		t.Errorf("too many files: %v", err)
	}
}

func TestCheckBundlePath(t *testing.T) {
	for _, ok := range []string{"SKILL.md", "a/b/c.txt", "refs/ünïcode.md", "a b/c-d_e.f"} {
		if err := CheckBundlePath(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "/etc/passwd", "../x", "a/../b", "a/./b", "./a", "a//b", "a/", `a\b`, "a\x00b", "a\nb",
		"c:x", "CON", "con.txt", "a/NUL", "com1.md", "LPT9", "x.", "x ", "a?b", string([]byte{0xff}), strings.Repeat("a", 256)} {
		if err := CheckBundlePath(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestSignatures(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	trusted := []string{FormatSigningKey(pub)}
	if k, err := ParseSigningKey(trusted[0]); err != nil || !k.Equal(pub) {
		t.Fatalf("ParseSigningKey: %v", err)
	}
	m := sampleManifest()
	sig := SignBytes(priv, PurposeManifest, m.CanonicalBytes())
	if err := VerifyBytes(trusted, PurposeManifest, m.CanonicalBytes(), sig); err != nil {
		t.Fatal(err)
	}
	if VerifyBytes(trusted, PurposeDesired, m.CanonicalBytes(), sig) == nil {
		t.Error("a manifest signature verifies as a desired state's")
	}
	m.Files[0].Size++
	if VerifyBytes(trusted, PurposeManifest, m.CanonicalBytes(), sig) == nil {
		t.Error("a changed manifest verifies")
	}
	if VerifyBytes(trusted, PurposeManifest, m.CanonicalBytes(), SignBytes(other, PurposeManifest, m.CanonicalBytes())) == nil {
		t.Error("an untrusted key verifies")
	}
	d := DesiredState{Host: "web-1", Revision: 3, At: time.Unix(5, 0), Skills: map[string]DesiredSkill{"a": {BundleID: "sha256:x", Rollout: "r1"}}}
	d2 := d
	d2.Host = "web-2"
	if string(d.CanonicalBytes()) == string(d2.CanonicalBytes()) {
		t.Error("desired states of two hosts sign alike")
	}
}

func FuzzCheckBundlePath(f *testing.F) {
	for _, s := range []string{"SKILL.md", "a/../b", "CON.txt", "a//b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if CheckBundlePath(p) != nil {
			return
		}
		if strings.HasPrefix(p, "/") || strings.Contains(p, "..") && strings.Contains("/"+p+"/", "/../") || strings.ContainsAny(p, "\\\x00") {
			t.Fatalf("%q accepted", p)
		}
	})
}
