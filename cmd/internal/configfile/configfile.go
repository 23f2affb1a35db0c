// Package configfile reads the --config file of the fleetmcp daemons
// (fleet-gateway, fleet-agent): YAML whose keys are the flag names, so
// that a service definition can hold one path instead of a long command
// line, and a setting is spelt the same on either.
package configfile

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A --config file holds flags as YAML, one key per flag, named as the
// flag is without its dashes:
//
//	listen: 0.0.0.0:8443
//	api_tokens: /etc/fleetmcp/tokens.yaml
//	cors_origins: [https://app.example.com, http://localhost:6274]
//	metrics_listen: 127.0.0.1:9464
//
// A list stands for a comma-separated value. Flags given on the command
// line win over the file; the file wins over the environment. An unknown
// key is an error naming it.

// MaxSize bounds a --config file.
const MaxSize = 1 << 20

// Parse parses a --config file into flag values by flag name; name is
// used in messages, and every error starts with it.
func Parse(name string, data []byte) (map[string]string, error) {
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s is larger than %d KiB", name, MaxSize>>10)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return map[string]string{}, nil
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var extra yaml.Node
	if dec.Decode(&extra) == nil {
		return nil, fmt.Errorf("%s: more than one YAML document; put every setting in one", name)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return map[string]string{}, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s line %d: want settings as key: value lines, one per flag", name, root.Line)
	}
	out := map[string]string{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		key := strings.TrimLeft(k.Value, "-")
		if k.Kind != yaml.ScalarNode || key == "" {
			return nil, fmt.Errorf("%s line %d: a key must be a flag name", name, k.Line)
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%s line %d: %q is set twice", name, k.Line, key)
		}
		val, err := configValue(v)
		if err != nil {
			return nil, fmt.Errorf("%s line %d: %s: %w", name, v.Line, key, err)
		}
		out[key] = val
	}
	return out, nil
}

// configValue turns a YAML value into a flag value: a scalar as written,
// a list of scalars joined with commas.
func configValue(v *yaml.Node) (string, error) {
	switch v.Kind {
	case yaml.ScalarNode:
		if v.Tag == "!!null" {
			return "", nil
		}
		return v.Value, nil
	case yaml.SequenceNode:
		items := make([]string, 0, len(v.Content))
		for _, it := range v.Content {
			if it.Kind != yaml.ScalarNode {
				return "", errors.New("a list may hold only plain values")
			}
			if strings.Contains(it.Value, ",") {
				return "", fmt.Errorf("list item %q has a comma, which would split it", it.Value)
			}
			items = append(items, it.Value)
		}
		return strings.Join(items, ","), nil
	case yaml.AliasNode:
		return "", errors.New("YAML aliases are not supported here")
	default:
		return "", errors.New("want a value or a list, not a mapping")
	}
}

// Apply sets the flags of fs from the --config file at path, except
// those given on the command line (set). The flags named in cmdlineOnly
// (and "config" itself) may not be set from the file.
func Apply(fs *flag.FlagSet, path string, set map[string]bool, cmdlineOnly ...string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	values, err := Parse(path, data)
	if err != nil {
		return fmt.Errorf("--config %w", err)
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f := fs.Lookup(k)
		switch {
		case f == nil:
			return fmt.Errorf("--config %s: unknown key %q: keys are the flag names without dashes (see -h)", path, k)
		case k == "config" || slices.Contains(cmdlineOnly, k):
			return fmt.Errorf("--config %s: %q is a command-line flag only", path, k)
		case set[k]:
			continue // the command line wins
		}
		if err := fs.Set(k, values[k]); err != nil {
			return fmt.Errorf("--config %s: %s %q: %w", path, k, values[k], err)
		}
	}
	return nil
}

// Values returns the value of every flag of fs, by name: what a daemon
// runs with, to compare with the settings of its --config file read
// again (Changed).
func Values(fs *flag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { out[f.Name] = f.Value.String() })
	return out
}

// Changed returns, sorted, the names whose values differ between running
// and reread (a name in only one of them counts).
func Changed(running, reread map[string]string) []string {
	var out []string
	for k, v := range running {
		if w, ok := reread[k]; !ok || w != v {
			out = append(out, k)
		}
	}
	for k := range reread {
		if _, ok := running[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// LogChanges logs, at a reload, the settings of the --config file that
// changed since the start (changes says which; nil: no --config file).
// A reload re-reads the files the settings name, not the settings, which
// take effect at the next restart; reloads says what a reload does
// instead, for the message.
func LogChanges(changes func() ([]string, error), log *slog.Logger, reloads string) {
	if changes == nil {
		return
	}
	changed, err := changes()
	switch {
	case err != nil:
		log.Error("reload: the --config file does not read; the running settings stay, and a restart would fail with it", "err", err)
	case len(changed) > 0:
		log.Warn("reload: settings of the --config file changed; they take effect at the next restart"+reloads, "keys", strings.Join(changed, ","))
	default:
		log.Info("reload: the --config file's settings are those running")
	}
}
