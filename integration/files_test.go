package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFileTools: list, search, delete and move through the gateway, on a
// host whose policy hides a directory and protects a file from changes.
func TestFileTools(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	cwd := policyHost(t, env, "files", `paths: {deny: ["**/secret/**"], write: {deny: ["**/keep.txt"]}}`)
	writeFile(t, filepath.Join(cwd, "src/main.go"), "package main\n// TODO: greet\n")
	writeFile(t, filepath.Join(cwd, "src/keep.txt"), "TODO: keep me\n")
	writeFile(t, filepath.Join(cwd, "secret/key.txt"), "TODO: secret\n")
	writeFile(t, filepath.Join(cwd, "old.txt"), "old\n")
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)

			res := call(t, cs, "list", map[string]any{"host": "files"})
			got := mustOK(t, res)
			if !strings.Contains(got, "src/main.go  ") || strings.Contains(got, "secret") || !strings.Contains(got, "entries hidden") {
				t.Errorf("list:\n%s", got)
			}
			if entries, _ := structured(t, res)["entries"].([]any); len(entries) == 0 {
				t.Errorf("list has no structured entries: %v", structured(t, res))
			}

			res = call(t, cs, "search", map[string]any{"host": "files", "query": "todo", "regex": false})
			if got := mustOK(t, res); !strings.HasPrefix(got, `No matches for "todo"`) {
				t.Errorf("case-sensitive literal search: %s", got)
			}
			// Hidden: secret/ and the agent's state directory.
			got = mustOK(t, call(t, cs, "search", map[string]any{"host": "files", "query": "(?i)todo", "regex": true}))
			if got != "src/keep.txt:1: TODO: keep me\nsrc/main.go:2: // TODO: greet\n\n[Not searched: 2 entries the tools may not read (host policy or the agent's own files).]" {
				t.Errorf("search:\n%s", got)
			}
			mustErr(t, call(t, cs, "search", map[string]any{"host": "files", "query": "a(", "regex": true}), "missing closing )")
		})
	}
	cs := env.Client("2025-11-25", nil)

	// move: never onto an existing file; a stale hash refused; then done.
	mustErr(t, call(t, cs, "move", map[string]any{"host": "files", "path": "old.txt", "destination": "src/main.go"}), "already exists")
	mustErr(t, call(t, cs, "move", map[string]any{"host": "files", "path": "old.txt", "destination": "new/old.txt", "expected_sha256": sum("stale\n")}), "has changed")
	mustOK(t, call(t, cs, "move", map[string]any{"host": "files", "path": "old.txt", "destination": "new/old.txt", "expected_sha256": sum("old\n")}))
	if data, err := os.ReadFile(filepath.Join(cwd, "new/old.txt")); err != nil || string(data) != "old\n" {
		t.Fatalf("moved file: %q, %v", data, err)
	}

	// delete: a tree with a protected file is refused whole; the host's
	// refusal is audited as one.
	mustErr(t, call(t, cs, "delete", map[string]any{"host": "files", "path": "src", "recursive": true}), "nothing was deleted")
	if _, err := os.Stat(filepath.Join(cwd, "src/main.go")); err != nil {
		t.Fatalf("a refused delete deleted: %v", err)
	}
	denied := auditRecords(t, cs, map[string]any{"host": "files", "tool": "delete", "decision": "denied"})
	if len(denied) != 1 || denied[0].Rule != "host policy" {
		t.Errorf("audit records of the refused delete: %+v", denied)
	}
	mustOK(t, call(t, cs, "delete", map[string]any{"host": "files", "path": "new", "recursive": true}))
	if _, err := os.Stat(filepath.Join(cwd, "new")); !os.IsNotExist(err) {
		t.Errorf("deleted directory still there: %v", err)
	}
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}
