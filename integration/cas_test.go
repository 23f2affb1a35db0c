package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A model's edit loop through the gateway: the hash read returns guards
// the next change, a stale one changes nothing, and an anchored read
// finds its place in a CRLF file that edit keeps CRLF.
func TestCompareAndSwapEndToEnd(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	file := filepath.Join(env.AgentDir("alpha"), "win.ini")
	orig := strings.ReplaceAll("[a]\nx=1\n[b]\nx=2\n[c]\nx=3\n", "\n", "\r\n")
	res := call(t, cs, "write", map[string]any{"host": "alpha", "path": "win.ini", "content": orig, "overwrite": false})
	mustOK(t, res)
	if s := structured(t, res); s["sha256"] != hashOf(orig) || s["created"] != true {
		t.Fatalf("write structured = %v", s)
	}
	mustErr(t, call(t, cs, "write", map[string]any{"host": "alpha", "path": "win.ini", "content": "", "overwrite": false}),
		"already exists (sha256 "+hashOf(orig)+")")

	res = call(t, cs, "read", map[string]any{"host": "alpha", "path": "win.ini", "anchor": "[b]\nx=", "context": 1})
	if got := mustOK(t, res); got != "x=1\r\n[b]\r\nx=2\r\n[c]\r\n\n[1 more lines in file. Use offset=6 to continue.]" {
		t.Fatalf("anchored read = %q", got)
	}
	s := structured(t, res)
	if s["sha256"] != hashOf(orig) || s["anchor_line"] != 3.0 || s["start_line"] != 2.0 || s["total_lines"] != 6.0 {
		t.Fatalf("read structured = %v", s)
	}

	edit := func(expected string) map[string]any {
		return map[string]any{"host": "alpha", "path": "win.ini", "expected_sha256": expected,
			"edits": []map[string]any{{"old_string": "[b]\nx=2\n", "new_string": "[b]\nx=20\ny=21\n"}}}
	}
	mustErr(t, call(t, cs, "edit", edit(hashOf("stale"))), "has changed: its sha256 is "+hashOf(orig))
	res = call(t, cs, "edit", edit(hashOf(orig)))
	mustOK(t, res)
	want := strings.Replace(orig, "[b]\r\nx=2\r\n", "[b]\r\nx=20\r\ny=21\r\n", 1)
	if data, err := os.ReadFile(file); err != nil || string(data) != want {
		t.Fatalf("after edit: %q (%v), want %q", data, err, want)
	}
	if s := structured(t, res); s["sha256"] != hashOf(want) {
		t.Fatalf("edit structured = %v", s)
	}
	// The same edit again, against the hash it was made for, is refused.
	mustErr(t, call(t, cs, "edit", edit(hashOf(orig))), "nothing was changed")
}

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
