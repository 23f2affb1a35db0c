//go:build unix

package main

import (
	"bytes"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/cmd/internal/configfile"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The agent refuses to start (and join refuses to enrol) with a key or
// credential others may read, or a state directory others may write, and
// says the chmod that fixes it; it changes no mode itself.
func TestRunRefusesOpenModes(t *testing.T) {
	for name, tc := range map[string]struct {
		file string // under the state directory
		mode os.FileMode
		want string
	}{
		"readable key":        {filepath.Join(identity.Dir, identity.KeyFile), 0o644, "chmod 0600 "},
		"group-readable key":  {filepath.Join(identity.Dir, identity.KeyFile), 0o640, "chmod 0600 "},
		"readable credential": {filepath.Join(identity.Dir, identity.JWTFile), 0o604, "chmod 0600 "},
		"writable state dir":  {"", 0o777, "chmod go-w "},
		"writable id dir":     {identity.Dir, 0o770, "chmod go-w "},
	} {
		t.Run(name, func(t *testing.T) {
			dir := enrolled(t, "web-1")
			path := filepath.Join(dir, tc.file)
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, _, token := protocol.NewJoinToken()
			for _, args := range [][]string{
				{"--state_dir", dir},
				{"join", "--state_dir", dir, "--gateway", "https://127.0.0.1:1", "--token", token, "--ca_pin", "sha256:" + strings.Repeat("0", 64)},
			} {
				_, err := runFails(t, args, nil)
				if err == nil || !strings.Contains(err.Error(), tc.want+path) || !strings.Contains(err.Error(), "refusing to start") {
					t.Errorf("%q: %v; want %q", args[:1], err, tc.want+path)
				}
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != tc.mode {
				t.Errorf("the mode of %s changed: %v", path, fi.Mode())
			}
		})
	}
}

// At a reload the agent says which settings of its --config file changed
// since it started: they take effect at a restart.
func TestConfigChangesAtReload(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(conf, []byte("max_concurrent: 8\nbash_timeout: 2m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("fleet-agent", flag.ContinueOnError)
	rf := addRunFlags(fs, env(nil))
	args := []string{"--config", conf, "--log_level", "warn"}
	if _, err := parse(fs, args); err != nil {
		t.Fatal(err)
	}
	rf.watchConfig(fs, args, func(fs *flag.FlagSet) { addRunFlags(fs, env(nil)) })
	logged := func() string {
		var b bytes.Buffer
		configfile.LogChanges(rf.configChanges, slog.New(slog.NewTextHandler(&b, nil)), " (a reload re-reads the host policy file only)")
		return b.String()
	}
	if got := logged(); !strings.Contains(got, "are those running") {
		t.Errorf("unchanged: %s", got)
	}
	// 2m as 120s is the same; log_level is the command line's.
	if err := os.WriteFile(conf, []byte("max_concurrent: 4\nbash_timeout: 120s\nlog_level: debug\npolicy: /etc/p.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := logged(); !strings.Contains(got, "keys=max_concurrent,policy\n") || !strings.Contains(got, "next restart") {
		t.Errorf("changed: %s", got)
	}
}
