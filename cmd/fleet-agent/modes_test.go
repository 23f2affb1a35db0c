//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/identity"
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
