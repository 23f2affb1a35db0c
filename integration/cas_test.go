package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	if s := structured(t, res); s["sha256"] != sum(orig) || s["created"] != true {
		t.Fatalf("write structured = %v", s)
	}
	mustErr(t, call(t, cs, "write", map[string]any{"host": "alpha", "path": "win.ini", "content": "", "overwrite": false}),
		"already exists (sha256 "+sum(orig)+")")

	res = call(t, cs, "read", map[string]any{"host": "alpha", "path": "win.ini", "anchor": "[b]\nx=", "context": 1})
	if got := mustOK(t, res); got != "x=1\r\n[b]\r\nx=2\r\n[c]\r\n\n[1 more lines in file. Use offset=6 to continue.]" {
		t.Fatalf("anchored read = %q", got)
	}
	s := structured(t, res)
	if s["sha256"] != sum(orig) || s["anchor_line"] != 3.0 || s["start_line"] != 2.0 || s["total_lines"] != 6.0 {
		t.Fatalf("read structured = %v", s)
	}

	edit := func(expected string) map[string]any {
		return map[string]any{"host": "alpha", "path": "win.ini", "expected_sha256": expected,
			"edits": []map[string]any{{"old_string": "[b]\nx=2\n", "new_string": "[b]\nx=20\ny=21\n"}}}
	}
	mustErr(t, call(t, cs, "edit", edit(sum("stale"))), "has changed: its sha256 is "+sum(orig))
	res = call(t, cs, "edit", edit(sum(orig)))
	mustOK(t, res)
	want := strings.Replace(orig, "[b]\r\nx=2\r\n", "[b]\r\nx=20\r\ny=21\r\n", 1)
	if data, err := os.ReadFile(file); err != nil || string(data) != want {
		t.Fatalf("after edit: %q (%v), want %q", data, err, want)
	}
	if s := structured(t, res); s["sha256"] != sum(want) {
		t.Fatalf("edit structured = %v", s)
	}
	// The same edit again, against the hash it was made for, is refused.
	mustErr(t, call(t, cs, "edit", edit(sum(orig))), "nothing was changed")
}

// Writers racing through the gateway with the same expected hash: exactly
// one wins, every other one is refused with the winner's hash, and the
// file holds the winner's content.
func TestRacingWritersOneWins(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	file := filepath.Join(env.AgentDir("alpha"), "shared.conf")
	if err := os.WriteFile(file, []byte("v0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	type outcome struct {
		content string
		ok      bool
		text    string
	}
	out := make([]outcome, writers)
	var wg sync.WaitGroup
	for i := range writers {
		cs := env.Client(eras[i%2].Version, nil)
		wg.Go(func() {
			content := fmt.Sprintf("v1 from writer %d\n", i)
			res := call(t, cs, "write", map[string]any{"host": "alpha", "path": "shared.conf", "content": content, "expected_sha256": sum("v0\n")})
			out[i] = outcome{content, !res.IsError, text(res)}
		})
	}
	wg.Wait()
	var winner string
	for _, o := range out {
		if o.ok {
			if winner != "" {
				t.Fatalf("two writers won: %q and %q", winner, o.content)
			}
			winner = o.content
		}
	}
	if winner == "" {
		t.Fatalf("no writer won: %+v", out)
	}
	for _, o := range out {
		if !o.ok && !strings.Contains(o.text, "its sha256 is "+sum(winner)) {
			t.Errorf("loser's error does not carry the winner's hash: %q", o.text)
		}
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != winner {
		t.Fatalf("file holds %q (%v), want the winner's %q", data, err, winner)
	}

	// delete with a stale hash changes nothing; with the current one it
	// deletes.
	cs := env.Client("", nil)
	mustErr(t, call(t, cs, "delete", map[string]any{"host": "alpha", "path": "shared.conf", "expected_sha256": sum("v0\n")}), "has changed")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("stale delete removed the file: %v", err)
	}
	mustOK(t, call(t, cs, "delete", map[string]any{"host": "alpha", "path": "shared.conf", "expected_sha256": sum(winner)}))
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Fatalf("file still there after delete: %v", err)
	}
}

// search through the gateway stops at max_results and says more remain.
func TestSearchCaps(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	dir := env.AgentDir("alpha")
	var b strings.Builder
	for i := range 300 {
		fmt.Fprintf(&b, "line %d needle %s\n", i, strings.Repeat("x", 400))
	}
	if err := os.WriteFile(filepath.Join(dir, "big.txt"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cs := env.Client("", nil)
	got := mustOK(t, call(t, cs, "search", map[string]any{"host": "alpha", "query": "needle", "max_results": 5}))
	lines := strings.Split(got, "\n")
	if n := strings.Count(got, "big.txt:"); n != 5 {
		t.Fatalf("%d matches shown, want 5:\n%s", n, got)
	}
	if !strings.Contains(got, "[Showing the first 5 matches; more remain.") {
		t.Errorf("no note that more matches remain:\n%s", got)
	}
	for _, l := range lines[:5] {
		if len(l) > 400 {
			t.Errorf("a match line of %d bytes was not shortened", len(l))
		}
	}
	// The byte budget holds with the default cap raised.
	got = mustOK(t, call(t, cs, "search", map[string]any{"host": "alpha", "query": "needle", "max_results": 1000}))
	if len(got) > 50<<10+1024 {
		t.Errorf("search output %d bytes, over the 50 KB budget", len(got))
	}
}
