package profile

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestSaveLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cfg", "fleetmcp", "fleetctl.json")
	if p, err := Load(path); p != nil || err != nil {
		t.Fatalf("no file: %v, %v", p, err)
	}
	want := &Profile{Gateway: "https://gw:8443", CAPin: "sha256:ab", APIToken: "tok"}
	if err := Save(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil || *got != *want {
		t.Fatalf("Load = %+v, %v", got, err)
	}
	if runtime.GOOS == "windows" {
		return
	}
	fi, _ := os.Stat(path)
	di, _ := os.Stat(filepath.Dir(path))
	if fi.Mode().Perm() != 0o600 || di.Mode().Perm() != 0o700 {
		t.Errorf("modes %v %v", fi.Mode(), di.Mode())
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
		t.Errorf("a world-readable profile: %v", err)
	}
}

func TestParseRefuses(t *testing.T) {
	for in, want := range map[string]string{
		`{}`:                               "names no gateway",
		`{"gateway":"https://g","nope":1}`: "not a fleetctl profile",
		`not json`:                         "not a fleetctl profile",
		`{"gateway":"https://g"} {}`:       "more than one",
		`{"gateway":"https://g","api_token":"a b"}`: "spaces",
	} {
		if _, err := Parse("p", []byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) = %v; want %q", in, err, want)
		}
	}
}

func TestPath(t *testing.T) {
	if p, _ := Path(func(k string) string { return map[string]string{EnvPath: "/x/p.json"}[k] }); p != "/x/p.json" {
		t.Errorf("Path with %s = %s", EnvPath, p)
	}
	if p, err := Path(func(string) string { return "" }); err == nil && !strings.HasSuffix(p, filepath.Join("fleetmcp", "fleetctl.json")) {
		t.Errorf("Path = %s", p)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"gateway":"https://g","ca_pin":"sha256:ab","api_token":"t"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("p", data)
		if err == nil && (p.Gateway == "" || strings.ContainsAny(p.APIToken, "\r\n\t ")) {
			t.Fatalf("accepted %+v", p)
		}
	})
}
