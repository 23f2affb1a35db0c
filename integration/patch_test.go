package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPatchTool: the patch tool end to end, in both eras: a multi-file
// patch, a dry run, a failing patch that changes nothing, and a patch
// larger than one NATS message.
func TestPatchTool(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	dir := env.AgentDir("alpha")
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			sub := "p-" + era.Name
			mustOK(t, call(t, cs, "write", map[string]any{"host": "alpha", "path": sub + "/main.go", "content": "package main\n\nfunc main() {\n\tprintln(1)\n}\n"}))
			patch := fmt.Sprintf("diff --git a/%[1]s/main.go b/%[1]s/main.go\n--- a/%[1]s/main.go\n+++ b/%[1]s/main.go\n@@ -3,3 +3,3 @@\n func main() {\n-\tprintln(1)\n+\tprintln(2)\n }\n"+
				"diff --git a/%[1]s/new.txt b/%[1]s/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/%[1]s/new.txt\n@@ -0,0 +1 @@\n+hello\n", sub)

			dry := call(t, cs, "patch", map[string]any{"host": "alpha", "patch": patch, "dry_run": true})
			if got := mustOK(t, dry); !strings.Contains(got, "Dry run: the patch applies cleanly to 2 files (+2 -1)") || !strings.Contains(got, "hunk 1 @@ -3,3 +3,3 @@: applies at line 3") {
				t.Fatalf("dry run: %s", got)
			}
			if _, err := os.Stat(filepath.Join(dir, sub, "new.txt")); !os.IsNotExist(err) {
				t.Fatalf("dry run created a file: %v", err)
			}

			res := call(t, cs, "patch", map[string]any{"host": "alpha", "patch": patch})
			mustOK(t, res)
			s := structured(t, res)
			files, _ := s["files"].([]any)
			if s["applied"] != true || len(files) != 2 {
				t.Fatalf("structured = %v", s)
			}
			want := "package main\n\nfunc main() {\n\tprintln(2)\n}\n"
			sum := sha256.Sum256([]byte(want))
			if f := files[0].(map[string]any); f["action"] != "modified" || f["sha256"] != hex.EncodeToString(sum[:]) {
				t.Errorf("main.go entry = %v", f)
			}
			for name, content := range map[string]string{"main.go": want, "new.txt": "hello\n"} {
				if data, err := os.ReadFile(filepath.Join(dir, sub, name)); err != nil || string(data) != content {
					t.Errorf("%s = %q, %v", name, data, err)
				}
			}

			// The same patch again: the creation fails, so nothing changes.
			res = call(t, cs, "patch", map[string]any{"host": "alpha", "patch": patch})
			mustErr(t, res, "already exists, but the patch creates it")
			if s := structured(t, res); s["applied"] != false {
				t.Errorf("failed patch structured = %v", s)
			}
			if data, _ := os.ReadFile(filepath.Join(dir, sub, "main.go")); string(data) != want {
				t.Errorf("a failed patch changed main.go: %q", data)
			}

			// A patch of several MiB travels in many messages.
			big := strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", 48<<10)
			bigPatch := fmt.Sprintf("--- /dev/null\n+++ b/%s/big.txt\n@@ -0,0 +1,%d @@\n", sub, 48<<10) +
				"+" + strings.ReplaceAll(strings.TrimSuffix(big, "\n"), "\n", "\n+") + "\n"
			mustOK(t, call(t, cs, "patch", map[string]any{"host": "alpha", "patch": bigPatch}))
			if data, err := os.ReadFile(filepath.Join(dir, sub, "big.txt")); err != nil || string(data) != big {
				t.Errorf("big.txt: %d bytes, %v; want %d bytes", len(data), err, len(big))
			}
		})
	}
}
