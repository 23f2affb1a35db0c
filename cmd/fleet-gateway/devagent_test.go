package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// The dev agent installs the fleet's skills in the data directory, not
// in the working directory's .agents/skills: run from a checkout, a
// rollout does not write into the repository.
func TestDevAgentSkillsOutsideTheCheckout(t *testing.T) {
	cwd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	cfg := devAgentConfig(dataDir, &identity.Identity{})
	within := func(dir, root string) bool {
		rel, err := filepath.Rel(root, dir)
		return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
	}
	if cfg.FleetSkillsDir == "" || !within(cfg.FleetSkillsDir, dataDir) || !within(cfg.StateDir, dataDir) {
		t.Errorf("the dev agent's fleet skills %q and state %q are not in the data directory %s", cfg.FleetSkillsDir, cfg.StateDir, dataDir)
	}
	// This test runs in the checkout (its package directory).
	checkout := cwd
	for ; checkout != filepath.Dir(checkout); checkout = filepath.Dir(checkout) {
		if _, err := os.Stat(filepath.Join(checkout, "go.mod")); err == nil {
			break
		}
	}
	if within(cfg.FleetSkillsDir, checkout) || within(cfg.FleetSkillsDir, filepath.Join(cwd, ".agents")) {
		t.Errorf("the dev agent's fleet skills %s are in the checkout %s", cfg.FleetSkillsDir, checkout)
	}
}
