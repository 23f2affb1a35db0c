package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// StateDirHolder finds the agent that holds a state directory, and
// changes nothing of one no agent ever ran on.
func TestStateDirHolder(t *testing.T) {
	dir := t.TempDir()
	if held, _, err := StateDirHolder(dir); held || err != nil {
		t.Fatalf("fresh directory: held %v, %v", held, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, stateLockFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the probe made a lock file: %v", err)
	}
	sd, err := openStateDir(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	held, pid, err := StateDirHolder(dir)
	if !held || pid != os.Getpid() || err != nil {
		t.Errorf("held directory: held %v pid %d (want %d), %v", held, pid, os.Getpid(), err)
	}
	sd.close()
	if held, _, err := StateDirHolder(dir); held || err != nil {
		t.Errorf("released directory: held %v, %v", held, err)
	}
	// The probe let go: an agent can take the directory.
	sd, err = openStateDir(dir, nil)
	if err != nil {
		t.Fatalf("after the probe: %v", err)
	}
	sd.close()
}

// CheckPolicy compiles the policy file as the agent would and names the
// problem of a bad one.
func TestCheckPolicy(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("tools: {allow: [read]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("bash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := CheckPolicy(Config{PolicyFile: good, Cwd: dir}); err != nil || len(s) == 0 {
		t.Errorf("good policy: %q, %v", s, err)
	}
	if _, err := CheckPolicy(Config{PolicyFile: bad, Cwd: dir}); err == nil || !strings.Contains(err.Error(), `"alow"`) {
		t.Errorf("bad policy: %v", err)
	}
	if s, err := CheckPolicy(Config{}); s != nil || err != nil {
		t.Errorf("no policy: %q, %v", s, err)
	}
}
