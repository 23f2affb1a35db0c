// Package profile keeps fleetctl's profile: the gateway it talks to, the
// pin of that gateway's CA and the admin token, saved by fleetctl login
// (or by a --dev gateway for its own user) so that later commands need no
// flags. The file is JSON, 0600, in the user's configuration directory;
// one readable by others is refused, as ssh refuses such a key.
package profile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Profile is what fleetctl remembers of a gateway.
type Profile struct {
	Gateway  string `json:"gateway"`
	CAPin    string `json:"ca_pin,omitempty"`
	APIToken string `json:"api_token,omitempty"`
	// Dev marks a profile a --dev gateway wrote; it may replace it at
	// its next start, never a profile of another gateway.
	Dev bool `json:"dev,omitempty"`
}

// EnvPath names another profile file than the default.
const EnvPath = "FLEET_PROFILE"

// maxBytes bounds a profile file.
const maxBytes = 64 << 10

// Path is the profile file: $FLEET_PROFILE, else fleetmcp/fleetctl.json in
// the user's configuration directory (os.UserConfigDir: $XDG_CONFIG_HOME
// or ~/.config on Linux, ~/Library/Application Support on macOS,
// %AppData% on Windows).
func Path(getenv func(string) string) (string, error) {
	if p := getenv(EnvPath); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("no configuration directory for the profile (%w): set %s=FILE", err, EnvPath)
	}
	return filepath.Join(dir, "fleetmcp", "fleetctl.json"), nil
}

// Load reads the profile at path; a missing file is no profile (nil, nil).
func Load(path string) (*Profile, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	if err := checkMode(path, fi); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("profile %s: %w", path, err)
	}
	if len(data) > maxBytes {
		return nil, fmt.Errorf("profile %s: larger than %d bytes, not a profile: remove it and run fleetctl login", path, maxBytes)
	}
	return Parse(path, data)
}

// Parse decodes and checks a profile's contents (path names it in
// errors).
func Parse(path string, data []byte) (*Profile, error) {
	var p Profile
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("profile %s is not a fleetctl profile (%v): fix it, or remove it and run fleetctl login", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("profile %s: more than one JSON object: fix it, or remove it and run fleetctl login", path)
	}
	if p.Gateway == "" {
		return nil, fmt.Errorf("profile %s names no gateway: run fleetctl login --gateway https://GATEWAY:8443 --ca_pin PIN", path)
	}
	if strings.ContainsAny(p.APIToken, "\r\n\t ") {
		return nil, fmt.Errorf("profile %s: the api_token has spaces or line breaks: run fleetctl login again", path)
	}
	return &p, nil
}

// checkMode refuses a profile others may read or write (not checked on
// Windows, whose files have ACLs instead).
func checkMode(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("profile %s is not a regular file", path)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("profile %s is %#o, open to other users, and may hold an admin token: refused; run chmod 600 %s (and fleetctl login again if the token may have been read)",
			path, fi.Mode().Perm(), path)
	}
	return nil
}

// Save writes p to path (0600, its directory 0700), replacing the file in
// one step.
func Save(path string, p *Profile) error {
	if p.Gateway == "" {
		return errors.New("profile: no gateway")
	}
	data, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".fleetctl-*.json")
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil && runtime.GOOS != "windows" {
		tmp.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("profile: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	return nil
}
