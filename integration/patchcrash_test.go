//go:build unix

package integration

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestPatchAgentKilledMidCommit: a real fleet-agent process is killed
// with SIGKILL while it renames in the files of a 400-file patch sent
// through the gateway. Restarted, it leaves the 400 files all as before
// or all as after the patch, with no hidden file and no journal left,
// and patches again normally.
func TestPatchAgentKilledMidCommit(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgentProcess("crashy")
	env.WaitHost("crashy", true)
	cs := env.Client("2025-11-25", nil)
	dir := env.AgentDir("crashy")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 2))
	kills := 3
	if testing.Short() {
		kills = 1
	}
	outcomes := map[string]int{}
	for i := range kills {
		sub := fmt.Sprintf("round%d", i)
		before, after, patch := crashPatch(t, filepath.Join(dir, sub), sub)
		first := filepath.Join(dir, sub, "d0", "m000.txt")
		firstIno := inode(t, first)

		done := make(chan *mcp.CallToolResult, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "patch", Arguments: map[string]any{"host": "crashy", "patch": patch}})
			done <- res
		}()
		// The renames begin with the first file: kill soon after it has
		// been replaced.
		for deadline := time.Now().Add(2 * time.Minute); inode(t, first) == firstIno; time.Sleep(200 * time.Microsecond) {
			if len(done) > 0 {
				break // finished before it was seen
			}
			if time.Now().After(deadline) {
				t.Fatal("the first file was not renamed in within 2 minutes")
			}
		}
		time.Sleep(time.Duration(r.IntN(4000)) * time.Microsecond)
		env.KillAgent("crashy")
		<-done
		env.WaitHost("crashy", false) // a restart before that is refused as a conflict
		env.RestartAgentProcess("crashy")
		env.WaitHost("crashy", true)

		got := treeOutcome(t, filepath.Join(dir, sub), before, after)
		if names, _ := os.ReadDir(filepath.Join(dir, ".state", "journal")); len(names) > 0 {
			t.Errorf("the journal directory still holds %s", names[0].Name())
		}
		outcomes[got]++
		if got == "before" {
			// Nothing of the interrupted patch stands in the way.
			mustOK(t, call(t, cs, "patch", map[string]any{"host": "crashy", "patch": patch}))
			if treeOutcome(t, filepath.Join(dir, sub), before, after) != "after" {
				t.Fatal("the patch applied again after the recovery, but the files are not as after it")
			}
		}
	}
	t.Logf("outcomes: %v", outcomes)
}

// crashPatch writes a tree of files under root and returns the files
// before and after a patch (relative paths, paths given from the agent's
// working directory with prefix) that modifies 390 of them, deletes 5 and
// creates 5.
func crashPatch(t *testing.T, root, prefix string) (before, after map[string]string, patch string) {
	before, after = map[string]string{}, map[string]string{}
	var b strings.Builder
	for i := range 390 {
		p := fmt.Sprintf("d%d/m%03d.txt", i%6, i)
		before[p] = fmt.Sprintf("first %d\nold %d\nlast\n", i, i)
		after[p] = fmt.Sprintf("first %d\nnew %d\nlast\n", i, i)
		fmt.Fprintf(&b, "--- a/%[1]s/%[2]s\n+++ b/%[1]s/%[2]s\n@@ -1,3 +1,3 @@\n first %[3]d\n-old %[3]d\n+new %[3]d\n last\n", prefix, p, i)
	}
	for i := range 5 {
		p := fmt.Sprintf("d%d/gone%d.txt", i, i)
		before[p] = fmt.Sprintf("gone %d\n", i)
		fmt.Fprintf(&b, "--- a/%[1]s/%[2]s\n+++ /dev/null\n@@ -1 +0,0 @@\n-gone %[3]d\n", prefix, p, i)
		p = fmt.Sprintf("made/n%d.txt", i)
		after[p] = fmt.Sprintf("made %d\n", i)
		fmt.Fprintf(&b, "--- /dev/null\n+++ b/%[1]s/%[2]s\n@@ -0,0 +1 @@\n+made %[3]d\n", prefix, p, i)
	}
	for p, c := range before {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return before, after, b.String()
}

// treeOutcome says whether the files under root are all as before or
// all as after, and fails on anything else, hidden commit files
// included.
func treeOutcome(t *testing.T, root string, before, after map[string]string) string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if strings.Contains(d.Name(), ".tmp-") || strings.Contains(d.Name(), ".orig-") {
			t.Errorf("hidden file of the commit left: %s", rel)
		}
		data, err := os.ReadFile(p)
		got[rel] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	same := func(want map[string]string) bool {
		if len(got) != len(want) {
			return false
		}
		for p, c := range want {
			if got[p] != c {
				return false
			}
		}
		return true
	}
	switch {
	case same(before):
		if _, err := os.Stat(filepath.Join(root, "made")); err == nil {
			t.Error("the files are as before, but the directory the patch made is left")
		}
		return "before"
	case same(after):
		return "after"
	}
	n := 0
	for p, c := range got {
		if c == after[p] {
			n++
		}
	}
	t.Fatalf("half patched: %d of %d files as after the patch", n, len(got))
	return ""
}

func inode(t *testing.T, p string) uint64 {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}
