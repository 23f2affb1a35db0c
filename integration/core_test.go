package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCoreToolsBothEras(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			if era.Version != "" && cs.InitializeResult().ProtocolVersion != era.Version {
				t.Fatalf("negotiated %s, want %s", cs.InitializeResult().ProtocolVersion, era.Version)
			}

			hosts := mustOK(t, call(t, cs, "hosts", nil))
			if !strings.Contains(hosts, "alpha\tonline") || !strings.Contains(hosts, "beta\tonline") {
				t.Fatalf("hosts output missing online hosts:\n%s", hosts)
			}
			if got := structured(t, call(t, cs, "hosts", map[string]any{"filter": "be*"}))["hosts"].([]any); len(got) != 1 {
				t.Fatalf("filter be* gave %d hosts, want 1", len(got))
			}

			path := "dir-" + era.Name + "/notes.txt"
			mustOK(t, call(t, cs, "write", map[string]any{"host": "alpha", "path": path, "content": "one\ntwo\nthree\n"}))
			data, err := os.ReadFile(filepath.Join(env.AgentDir("alpha"), path))
			if err != nil || string(data) != "one\ntwo\nthree\n" {
				t.Fatalf("file on alpha = %q, %v", data, err)
			}
			if _, err := os.Stat(filepath.Join(env.AgentDir("beta"), path)); !os.IsNotExist(err) {
				t.Fatalf("write to alpha touched beta: %v", err)
			}

			if got := mustOK(t, call(t, cs, "read", map[string]any{"host": "alpha", "path": path, "offset": 2, "limit": 1})); !strings.HasPrefix(got, "two") {
				t.Fatalf("read offset 2 limit 1 = %q", got)
			}
			mustOK(t, call(t, cs, "edit", map[string]any{"host": "alpha", "path": path, "edits": []map[string]any{
				{"old_string": "two", "new_string": "2"}, {"old_string": "three", "new_string": "3"},
			}}))
			mustErr(t, call(t, cs, "edit", map[string]any{"host": "alpha", "path": path, "edits": []map[string]any{
				{"old_string": "one", "new_string": "1"}, {"old_string": "missing", "new_string": "x"},
			}}), "edit 2 of 2")
			if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "cat " + path})); got != "one\n2\n3\n" {
				t.Fatalf("after edits: %q", got)
			}

			res := call(t, cs, "bash", map[string]any{"host": "beta", "command": `echo '{"ok": true, "n": 3}'`})
			mustOK(t, res)
			if s := structured(t, res); s["ok"] != true {
				t.Fatalf("structured bash output = %v", s)
			}
			mustErr(t, call(t, cs, "bash", map[string]any{"host": "beta", "command": "echo out; echo err >&2; exit 3"}), "out\nerr\n\nCommand exited with code 3")
			if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "beta", "command": "true"})); got != "(no output)" {
				t.Fatalf("empty output = %q", got)
			}
		})
	}
}

func TestCallErrors(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("2025-11-25", nil)
	mustErr(t, call(t, cs, "read", map[string]any{"host": "nope", "path": "x"}), `unknown host "nope": call the hosts tool`)
	mustErr(t, call(t, cs, "read", map[string]any{"host": "bad.host", "path": "x"}), "invalid host")
	mustErr(t, call(t, cs, "read", map[string]any{"host": "alpha", "path": "missing.txt"}), "no such file")
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha"}), "command")
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "ls", "colour": "red"}), "colour")

	env.StartAgent("gamma", nil)
	env.WaitHost("gamma", true)
	env.StopAgent("gamma")
	env.WaitHost("gamma", false)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "gamma", "command": "true"}), `host "gamma" is offline`)
}
