//go:build unix

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// One process holds a state directory at a time; its identity is made
// once, kept private and survives the holder.
func TestStateDirLockAndIdentity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	first, err := openStateDir(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !validAgentID(first.agentID) {
		t.Fatalf("agent ID %q, want %d hex digits", first.agentID, agentIDLen)
	}
	fi, err := os.Stat(filepath.Join(dir, agentIDFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent-id: %v, mode %v; want 0600", err, fi.Mode())
	}

	_, err = openStateDir(dir, nil)
	var inUse *StateDirInUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() {
		t.Fatalf("second open: %v; want a StateDirInUseError naming pid %d", err, os.Getpid())
	}
	for _, want := range []string{dir, "pid " + strconv.Itoa(os.Getpid()), "--state_dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not mention %q", err, want)
		}
	}

	first.close()
	again, err := openStateDir(dir, nil)
	if err != nil {
		t.Fatalf("open after the holder let go: %v", err)
	}
	if again.agentID != first.agentID {
		t.Errorf("agent ID changed from %q to %q", first.agentID, again.agentID)
	}
	again.close()
	if other, err := openStateDir(t.TempDir(), nil); err != nil || other.agentID == first.agentID {
		t.Errorf("another state directory: %v, ID %q; want its own identity", err, other.agentID)
	} else {
		other.close()
	}

	// A damaged identity is named, not silently replaced.
	if err := os.WriteFile(filepath.Join(dir, agentIDFile), []byte("not-hex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openStateDir(dir, nil); err == nil || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "delete it") {
		t.Errorf("open with a damaged agent-id: %v", err)
	}
	// The lock is never taken through a link planted in its place.
	linked := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(linked, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Symlink(target, filepath.Join(linked, stateLockFile)); err != nil {
		t.Fatal(err)
	}
	if s, err := openStateDir(linked, nil); err == nil {
		s.close()
		t.Error("the lock was taken through a symbolic link")
	}
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the link's target was created: %v", err)
	}
}

// New refuses a state directory another agent holds, before it touches
// anything in it: no interrupted patch is recovered, no git guard or
// task folder written.
func TestNewRefusesStateDirInUse(t *testing.T) {
	state := t.TempDir()
	held, err := openStateDir(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.close()
	before, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "web-1", StateDir: state, Cwd: t.TempDir(), Logger: quietLogger()})
	var inUse *StateDirInUseError
	if !errors.As(err, &inUse) {
		t.Fatalf("New = %v, want a StateDirInUseError", err)
	}
	after, err := os.ReadDir(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("the refused agent wrote into the state directory: %d entries before, %d after", len(before), len(after))
	}
}
