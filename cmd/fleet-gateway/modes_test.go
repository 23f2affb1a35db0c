//go:build unix

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The gateway refuses to start with a data directory others may write, a
// key of its own others than its user may read, or a TLS key anyone may
// read, and names the chmod that fixes each; it changes no mode itself.
func TestRunRefusesOpenModes(t *testing.T) {
	for name, tc := range map[string]struct {
		file string // under the data directory
		mode os.FileMode
		flag string // the flag naming the file, if any
		want string
	}{
		"writable data dir": {"", 0o777, "", "chmod go-w "},
		"readable NATS key": {"nats/gateway-signer.nk", 0o644, "", "chmod 0600 "},
		"readable old key":  {"nats/account.nk", 0o644, "", "chmod 0600 "},
		"group NATS key":    {"nats/operator.nk", 0o640, "", "chmod 0600 "},
		"readable CA key":   {"tls/ca.key", 0o604, "", "chmod 0600 "},
		"readable TLS key":  {"mcp.key", 0o644, "--tls_key", "chmod 0640 "},
		"writable nats dir": {"nats", 0o770, "", "chmod go-w "},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tc.file)
			if tc.file != "" && !strings.HasSuffix(tc.file, "nats") {
				if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte("secret\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			} else if tc.file != "" {
				if err := os.Mkdir(path, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			args := []string{"--dev", "--data_dir", dir, "--listen", "127.0.0.1:0", "--nats_listen", "127.0.0.1:0", "--api_listen", "127.0.0.1:0"}
			if tc.flag != "" {
				args = append(args, tc.flag, path, "--tls_cert", filepath.Join(dir, "mcp.pem"))
			}
			_, err := runFails(t, args, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want+path) || !strings.Contains(err.Error(), "refusing to start") {
				t.Errorf("%v; want %q", err, tc.want+path)
			}
			if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != tc.mode {
				t.Errorf("the mode of %s changed: %v", path, fi.Mode())
			}
		})
	}
}
