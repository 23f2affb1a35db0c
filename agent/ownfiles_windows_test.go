package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
)

// These tests run the agent's own-file rules against a real NTFS volume,
// through a junction (made with cmd's mklink /J). They need Windows.

// winTree makes dir\real\f.txt ("secret") and the junction dir\j to
// dir\real, and returns dir, with its names as the volume holds them.
func winTree(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "f.txt"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cmd", "/c", "mklink", "/J", filepath.Join(dir, "j"), filepath.Join(dir, "real")).CombinedOutput(); err != nil {
		t.Fatalf("mklink /J: %v: %s", err, out)
	}
	return dir
}

// TestWinOwnFilesThroughJunction: the agent's state directory named
// through a junction is its own where the junction leads, in any case.
func TestWinOwnFilesThroughJunction(t *testing.T) {
	dir := winTree(t)
	g, err := newGuard(nil, ownFiles{StateDir: filepath.Join(dir, "j")})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "real", "f.txt"), strings.ToUpper(filepath.Join(dir, "j", "f.txt"))} {
		var own *ownError
		if _, err := g.checkPath(p, policy.Write); !errors.As(err, &own) {
			t.Errorf("write %s: %v, want a refusal", p, err)
		}
	}
	tb := &toolbox{locks: safefs.NewLocks(func(p string) string { return pathKey(p, foldNames) })}
	if tb.locks.Key(filepath.Join(dir, "real", "A.txt")) != tb.locks.Key(strings.ToLower(filepath.Join(dir, "real", "a.TXT"))) {
		t.Error("one file has two lock keys")
	}
}
