//go:build unix

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// cancelBound is how soon after a cancel a tool must return: generous,
// for a loaded machine; the work in these tests takes far longer.
const cancelBound = 3 * time.Second

// runCancelled runs tool with args and cancels it once it has run for
// delay. It fails unless the tool was still running then and returned,
// cancelled, within cancelBound of the cancel.
func runCancelled(t *testing.T, tb *toolbox, tool string, args any, delay time.Duration) *protocol.Result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan *protocol.Result, 1)
	go func() {
		r, _ := tbCall(t, ctx, tb, tool, args)
		done <- r
	}()
	select {
	case r := <-done:
		t.Fatalf("%s finished in under %s, before it could be cancelled; make its work larger: %+v", tool, delay, r)
	case <-time.After(delay):
	}
	cancel()
	cancelled := time.Now()
	var r *protocol.Result
	select {
	case r = <-done:
	case <-time.After(cancelBound):
		t.Errorf("%s still running %s after the cancel", tool, cancelBound)
		r = <-done
	}
	took := time.Since(cancelled)
	t.Logf("%s returned %s after the cancel", tool, took.Round(time.Millisecond))
	if r.Error == nil || r.Error.Code != protocol.CodeCancelled {
		t.Errorf("%s after a cancel: %+v, want a %s error", tool, r, protocol.CodeCancelled)
	}
	return r
}

// TestEditCancelled: an edit of many replacements over a large file
// stops soon after a cancel and changes nothing. Every edit rewrites
// every line, so the work is long however it is done.
func TestEditCancelled(t *testing.T) {
	tb := tbNew(t)
	content := strings.Repeat(strings.Repeat("a", 63)+"\n", 16<<20/64)
	p := tbFile(t, tb.cfg.Cwd, "big.txt", content)
	var es []map[string]any
	for i := range 1000 {
		from, to := "a", "b"
		if i%2 == 1 {
			from, to = "b", "a"
		}
		es = append(es, map[string]any{"old_string": from, "new_string": to, "replace_all": true})
	}
	runCancelled(t, tb, "edit", map[string]any{"path": p, "edits": es}, 500*time.Millisecond)
	if tbRead(t, p) != content {
		t.Error("a cancelled edit changed the file")
	}
	tbOnly(t, tb.cfg.Cwd, "big.txt")
}

// TestSearchCancelled: a search whose regular expression is slow on
// every line stops soon after a cancel, not at the end of the file it is
// in.
func TestSearchCancelled(t *testing.T) {
	tb := tbNew(t)
	line := strings.Repeat("lorem ipsum dolor sit amet consectetur ", 16<<10/40) + "\n"
	for i := range 3 {
		tbFile(t, tb.cfg.Cwd, fmt.Sprintf("words%d.txt", i), strings.Repeat(line, 4<<20/len(line)))
	}
	runCancelled(t, tb, "search", map[string]any{"query": `(\w+\s+){20}XYZ`, "regex": true}, 500*time.Millisecond)
}

// TestCompareAndSwapCancelled: checking expected_sha256 of a very large
// file stops soon after a cancel.
func TestCompareAndSwapCancelled(t *testing.T) {
	tb := tbNew(t)
	p := filepath.Join(tb.cfg.Cwd, "huge.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: it takes no room, but hashing reads 64 GiB of zeros.
	if err := f.Truncate(64 << 30); err != nil {
		t.Skipf("sparse files: %v", err)
	}
	f.Close()
	r := runCancelled(t, tb, "delete", map[string]any{"path": p, "expected_sha256": strings.Repeat("0", 64)}, 500*time.Millisecond)
	if r.Error != nil && !strings.Contains(r.Error.Message, "nothing was changed") {
		t.Errorf("message %q does not say nothing was changed", r.Error.Message)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("the file is gone: %v", err)
	}
}

// TestPatchApplyCancelled: a hunk searched for over a long file of
// repeating lines stops soon after a cancel and changes nothing.
func TestPatchApplyCancelled(t *testing.T) {
	tb := tbNew(t)
	content := strings.Repeat("x\n", 2<<20)
	p := tbFile(t, tb.cfg.Cwd, "rep.txt", content)
	hunk := strings.Repeat(" x\n", 3000) + "-y\n+z\n"
	patch := fmt.Sprintf("--- a/rep.txt\n+++ b/rep.txt\n@@ -1,3001 +1,3001 @@\n%s", hunk)
	runCancelled(t, tb, "patch", map[string]any{"patch": patch}, 500*time.Millisecond)
	if tbRead(t, p) != content {
		t.Error("a cancelled patch changed the file")
	}
}

// TestDeleteCheckCancelled: a recursive delete, checking every entry and
// then removing them, stops soon after a cancel.
func TestDeleteCheckCancelled(t *testing.T) {
	tb := tbNew(t)
	top := filepath.Join(tb.cfg.Cwd, "tree")
	for i := range 40 {
		dir := filepath.Join(top, fmt.Sprintf("d%03d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 250 {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%03d", j)))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
	runCancelled(t, tb, "delete", map[string]any{"path": top, "recursive": true}, 10*time.Millisecond)
	if _, err := os.Stat(top); err != nil {
		t.Errorf("the tree is gone: %v", err)
	}
}
