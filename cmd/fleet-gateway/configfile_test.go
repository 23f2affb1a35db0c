package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/cmd/internal/configfile"
)

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// --config sets flags from YAML: lists become comma-separated values, the
// command line wins over the file and the file over the environment.
func TestConfigFile(t *testing.T) {
	path := writeConfig(t, `# fleet-gateway settings
listen: 127.0.0.1:9000
session_timeout: 5m
cors_origins: [https://app.example.com, http://localhost:6274]
metrics: true
jwt_issuer: https://id.example
rate_limit: 10/s
`)
	getenv := env(map[string]string{"JWT_ISSUER": "https://from-env.example"})
	o, err := parseFlags([]string{"--config", path, "--rate_limit", "5/s"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.listen != "127.0.0.1:9000" || o.sessionTTL != 5*time.Minute || o.corsOrigins != "https://app.example.com,http://localhost:6274" ||
		!o.metrics || o.jwtIssuer != "https://id.example" || o.rateLimit != "5/s" {
		t.Fatalf("options %+v", o)
	}
	if !o.set["jwt_issuer"] || !o.set["listen"] {
		t.Errorf("settings from the file count as given: %v", o.set)
	}
	for _, tc := range []struct{ text, want string }{
		{"listen: 127.0.0.1:9000\nlisen: x\n", `unknown key "lisen"`},
		{"session_timeout: soon\n", "session_timeout"},
		{"listen: a\nlisten: b\n", `"listen" is set twice`},
		{"- listen\n", "key: value"},
		{"cors_origins: {a: b}\n", "not a mapping"},
		{"config: other.yaml\n", "command-line flag only"},
		{"listen: a\n---\nlisten: b\n", "more than one YAML document"},
		{"listen: [a, 'b,c']\n", "has a comma"},
		{"listen: [\n", "gateway.yaml"},
	} {
		_, err := parseFlags([]string{"--config", writeConfig(t, tc.text)}, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--config") {
			t.Errorf("config %q: err = %v, want one naming %s", tc.text, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"--config", filepath.Join(t.TempDir(), "none.yaml")}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("missing config file: %v", err)
	}
	if o, err := parseFlags([]string{"--config", writeConfig(t, "# nothing yet\n")}, env(nil), io.Discard); err != nil || o.listen != "127.0.0.1:8080" {
		t.Errorf("empty config file: %v, listen %q", err, o.listen)
	}
}

// A reload says which settings of the --config file changed since the
// start (they need a restart), and that a file that no longer reads
// would fail one; the command line still wins over the file.
func TestConfigFileChangesAtReload(t *testing.T) {
	path := writeConfig(t, "listen: 127.0.0.1:9000\nsession_timeout: 5m\n")
	args := []string{"--config", path, "--rate_limit", "5/s"}
	o, err := parseFlags(args, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	changes := configChanges(o, args, env(nil))
	logged := func() string {
		var b syncBuffer
		configfile.LogChanges(changes, slog.New(slog.NewTextHandler(&b, nil)), ", not at a reload")
		return b.String()
	}
	if got := logged(); !strings.Contains(got, "settings are those running") {
		t.Errorf("an unchanged file: %s", got)
	}
	// 5m written as 300s is the same setting.
	if err := os.WriteFile(path, []byte("listen: 127.0.0.1:9001\nsession_timeout: 300s\nrate_limit: 1/s\nmetrics: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := logged(); !strings.Contains(got, "keys=listen,metrics\n") || !strings.Contains(got, "next restart") {
		t.Errorf("a changed file: %s", got)
	}
	if err := os.WriteFile(path, []byte("lisen: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := logged(); !strings.Contains(got, "level=ERROR") || !strings.Contains(got, `unknown key \"lisen\"`) {
		t.Errorf("a broken file: %s", got)
	}
	if configChanges(&options{}, nil, env(nil)) != nil {
		t.Error("changes without --config")
	}
}
