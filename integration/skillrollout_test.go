//go:build unix

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// A skill folder on a real agent's host is pushed with skill_push and
// rolled out with skill_rollout to simulated hosts that speak the agent's
// side of the protocol (direct get, manifest, blobs, status), followed
// with skill_rollout_status and rolled back with skill_rollout_control.
func TestSkillRolloutEndToEnd(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	keys := env.Gateway.SigningKeys()
	if len(keys) != 1 {
		t.Fatalf("signing keys = %v", keys)
	}
	if creds, _ := env.Enrol("beta"); !slices.Equal(creds.SigningKeys, keys) {
		t.Fatalf("an enrolment gives the keys %v, want %v", creds.SigningKeys, keys)
	}
	// The key file is the gateway's secret: 0600, and no tool reaches it.
	var keyFile string
	for _, p := range env.Gateway.SecretPaths() {
		if filepath.Base(p) == "gateway.key" {
			keyFile = p
		}
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("signing key %q in SecretPaths: %v %v", keyFile, fi, err)
	}

	dir := filepath.Join(t.TempDir(), "deploy")
	for name, data := range map[string]string{
		"SKILL.md":       "---\nname: deploy\ndescription: Deploys the app.\n---\nRun scripts/run.sh.\n",
		"scripts/run.sh": "#!/bin/sh\necho deploying\n",
		"reference.md":   "details",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hosts := make([]string, 12)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("sim-%02d", i)
	}
	fleet, err := simfleet.Start(context.Background(), simfleet.Config{URL: env.NATSURL(), Hosts: hosts,
		Credentials: env.SimCredentials(map[string]string{"role": "sim"}), SigningKeys: keys, Skills: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	for _, h := range hosts {
		env.WaitHost(h, true)
	}
	cs := env.Client("", nil)
	pushed := structured(t, call(t, cs, "skill_push", map[string]any{"host": "alpha", "path": dir}))
	bundle, _ := pushed["bundle_id"].(string)
	if pushed["created"] != true || pushed["files"] != float64(3) || pushed["skill"] != "deploy" {
		t.Fatalf("skill_push = %v", pushed)
	}
	if again := structured(t, call(t, cs, "skill_push", map[string]any{"host": "alpha", "path": dir})); again["created"] != false || again["bundle_id"] != bundle {
		t.Fatalf("the same folder again = %v", again)
	}
	if vs, err := env.Gateway.SkillVersions(context.Background(), "deploy"); err != nil || len(vs) != 1 {
		t.Fatalf("versions = %v, %v", vs, err)
	}

	started := structured(t, call(t, cs, "skill_rollout", map[string]any{"skill": "deploy", "selector": "role=sim", "canary": 1, "batch": "50%"}))
	id, _ := started["id"].(string)
	if started["hosts"] != float64(12) || started["batches"] != float64(3) {
		t.Fatalf("skill_rollout = %v", started)
	}
	waitFor(t, 30*time.Second, "every host installs", func() bool {
		st := structured(t, call(t, cs, "skill_rollout_status", map[string]any{"rollout": id}))
		return st["state"] == protocol.RolloutDone
	})
	if n := fleet.Installed("deploy", bundle); n != 12 {
		t.Fatalf("%d of 12 simulated hosts hold the bundle", n)
	}
	list := structured(t, call(t, cs, "skill_rollout_status", map[string]any{}))
	if skills, _ := list["skills"].([]any); len(skills) != 1 {
		t.Fatalf("skill list = %v", list)
	}

	// A link in the folder is refused, and nothing new is stored.
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	mustErr(t, call(t, cs, "skill_push", map[string]any{"host": "alpha", "path": dir}), "passwd is a link")
	if err := os.Remove(filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "scripts", "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustErr(t, call(t, cs, "skill_push", map[string]any{"host": "alpha", "path": dir}), "scripts/pipe is a named pipe")
	if vs, _ := env.Gateway.SkillVersions(context.Background(), "deploy"); len(vs) != 1 {
		t.Fatalf("a refused push added a version: %v", vs)
	}

	mustOK(t, call(t, cs, "skill_rollout_control", map[string]any{"rollout": id, "action": "rollback"}))
	waitFor(t, 30*time.Second, "every host removes the skill", func() bool { return fleet.Installed("deploy", bundle) == 0 })
	mustErr(t, call(t, cs, "skill_rollout_control", map[string]any{"rollout": id, "action": "pause"}), "rolled_back")
}
