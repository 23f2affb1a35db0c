package agent

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Helpers of the tests that build on every system the agent runs on.

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// testGuard returns a guard for pol (nil: unrestricted) with a state
// directory of its own.
func testGuard(t *testing.T, pol *policy.Policy) *guard {
	t.Helper()
	g, err := newGuard(pol, ownFiles{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func writeSkill(t *testing.T, root, name, desc, text string) {
	t.Helper()
	if text == "" {
		text = fmt.Sprintf("---\nname: %s\ndescription: %s\n---\n# %s\n", name, desc, name)
	}
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, skillFile), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newTestAgent returns an Agent that is never run, for unit tests.
func newTestAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	if cfg.Servers == nil {
		cfg.Servers = []string{"nats://127.0.0.1:1"}
	}
	if cfg.Name == "" {
		cfg.Name = "asm-1"
	}
	cfg.StateDir = t.TempDir()
	cfg.Cwd = t.TempDir()
	cfg.Logger = quietLogger()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func callFrame(id string, part, parts int, data string) protocol.Frame {
	return protocol.Frame{Kind: protocol.KindCall, CallID: id, Seq: uint64(part), Part: part, Parts: parts, Data: []byte(data)}
}
