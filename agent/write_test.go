//go:build unix

package agent

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbRead returns the content of file p.
func tbRead(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tbMode returns the permission bits of p.
func tbMode(t *testing.T, p string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

// tbOnly checks that dir holds exactly the named entries (no leftover
// temporary files).
func tbOnly(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if fmt.Sprint(got) != fmt.Sprint(names) {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

func TestWriteCreates(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	r, _ := tbCall(t, ctx, tb, "write", map[string]any{"path": "a/b/new.txt", "content": "hello"})
	p := filepath.Join(tb.cfg.Cwd, "a/b/new.txt")
	tbWant(t, r, false, "Successfully wrote 5 bytes to "+p)
	if got := tbRead(t, p); got != "hello" {
		t.Errorf("content = %q", got)
	}
	if m := tbMode(t, p); m != 0o644 {
		t.Errorf("new file mode = %v, want 0644", m)
	}
	if fi, err := os.Stat(filepath.Dir(p)); err != nil || !fi.IsDir() {
		t.Errorf("parent directory: %v", err)
	}
	tbOnly(t, filepath.Dir(p), "new.txt")

	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": ""})
	tbWant(t, r, false, "Successfully wrote 0 bytes to "+p)
	if got := tbRead(t, p); got != "" {
		t.Errorf("content = %q, want empty", got)
	}
}

func TestWriteKeepsMode(t *testing.T) {
	tb := tbNew(t)
	for _, mode := range []os.FileMode{0o600, 0o755, 0o640} {
		p := tbFile(t, tb.cfg.Cwd, "f", "old")
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": p, "content": "new content"})
		tbWant(t, r, false, "Successfully wrote 11 bytes to "+p)
		if m := tbMode(t, p); m != mode {
			t.Errorf("mode after write = %v, want %v", m, mode)
		}
		if got := tbRead(t, p); got != "new content" {
			t.Errorf("content = %q", got)
		}
	}
	tbOnly(t, tb.cfg.Cwd, "f")
}

func TestWriteSymlink(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	real := tbFile(t, dir, "real/target.txt", "old")
	if err := os.Chmod(real, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.txt")
	if err := os.Symlink("real/target.txt", link); err != nil {
		t.Fatal(err)
	}
	// A chain of links ends at the same file.
	chain := filepath.Join(dir, "chain.txt")
	if err := os.Symlink(link, chain); err != nil {
		t.Fatal(err)
	}
	r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": "chain.txt", "content": "new"})
	tbWant(t, r, false, "Successfully wrote 3 bytes to "+chain)
	for _, l := range []string{link, chain} {
		if fi, err := os.Lstat(l); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a symlink (%v)", l, err)
		}
	}
	if got := tbRead(t, real); got != "new" {
		t.Errorf("target content = %q, want new", got)
	}
	if m := tbMode(t, real); m != 0o600 {
		t.Errorf("target mode = %v, want 0600", m)
	}

	// A dangling link gets its target created.
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink("made/later.txt", dangling); err != nil {
		t.Fatal(err)
	}
	r, _ = tbCall(t, context.Background(), tb, "write", map[string]any{"path": dangling, "content": "x"})
	tbWant(t, r, false, "Successfully wrote 1 bytes to "+dangling)
	if got := tbRead(t, filepath.Join(dir, "made/later.txt")); got != "x" {
		t.Errorf("dangling target content = %q", got)
	}

	loop := filepath.Join(dir, "loop")
	if err := os.Symlink("loop", loop); err != nil {
		t.Fatal(err)
	}
	r, _ = tbCall(t, context.Background(), tb, "write", map[string]any{"path": loop, "content": "x"})
	tbWant(t, r, true, loop+": too many levels of symbolic links")
}

func TestWriteRefuses(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	file := tbFile(t, dir, "file", "keep")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, want string
	}{
		{"", "path is empty; give a file path"},
		{"sub", filepath.Join(dir, "sub") + " is a directory; give the path of a file"},
		{"file/child", filepath.Join(dir, "file/child") + ": a parent of it is not a directory"},
	}
	for _, tt := range tests {
		r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": tt.path, "content": "x"})
		tbWant(t, r, true, tt.want)
	}
	if got := tbRead(t, file); got != "keep" {
		t.Errorf("file changed to %q", got)
	}
}

func TestWriteFailureLeavesTarget(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "f.txt", "original")
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	// A file size limit makes writing the new content fail half way, for
	// root too.
	withFileSizeLimit(t, func(limit int) {
		r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": p, "content": strings.Repeat("x", limit+1<<20)})
		if !r.IsError || !strings.Contains(tbText(t, r), "write "+p+": ") {
			t.Errorf("oversized write: %+v", r)
		}
	})
	if got := tbRead(t, p); got != "original" {
		t.Errorf("target changed to %q", got)
	}
	if m := tbMode(t, p); m != 0o600 {
		t.Errorf("target mode changed to %v", m)
	}
	tbOnly(t, tb.cfg.Cwd, "f.txt")
}

// withFileSizeLimit runs f with the process's file size limit lowered
// to limit bytes, which it passes to f: writes beyond it fail (Go ignores
// SIGXFSZ, so with EFBIG). The limit is at least 64 KiB and stays above
// the test log go test keeps (it grows through the whole run), so that
// the log can still be written.
func withFileSizeLimit(t *testing.T, f func(limit int)) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	limit := uint64(64 << 10)
	if fl := flag.Lookup("test.testlogfile"); fl != nil && fl.Value.String() != "" {
		if fi, err := os.Stat(fl.Value.String()); err == nil {
			limit = max(limit, uint64(fi.Size())+64<<10)
		}
	}
	lim := old
	lim.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("cannot lower the file size limit: %v", err)
	}
	defer func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
			t.Fatal(err)
		}
	}()
	f(int(limit))
}

func TestWriteConcurrent(t *testing.T) {
	tb := tbNew(t)
	var wg sync.WaitGroup
	contents := map[string]bool{}
	for i := range 8 {
		c := fmt.Sprintf("writer %d\n", i)
		contents[c] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, _ := tbCall(t, context.Background(), tb, "write", map[string]any{"path": "shared.txt", "content": c})
			if r.IsError {
				t.Errorf("write: %+v", r)
			}
		}()
	}
	wg.Wait()
	if got := tbRead(t, filepath.Join(tb.cfg.Cwd, "shared.txt")); !contents[got] {
		t.Errorf("content = %q, want one writer's whole content", got)
	}
	tbOnly(t, tb.cfg.Cwd, "shared.txt")
	if n := tb.locks.Held(); n != 0 {
		t.Errorf("%d lock entries left", n)
	}
}

func TestWriteResult(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	p := filepath.Join(tb.cfg.Cwd, "r.txt")
	r, _ := tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "first"})
	want := fmt.Sprintf(`{"bytes":5,"created":true,"path":%q,"sha256":%q}`, p, sha256Hex([]byte("first")))
	if string(r.Structured) != want {
		t.Errorf("structured = %s, want %s", r.Structured, want)
	}
	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "second"})
	want = fmt.Sprintf(`{"bytes":6,"created":false,"path":%q,"sha256":%q}`, p, sha256Hex([]byte("second")))
	if string(r.Structured) != want {
		t.Errorf("structured = %s, want %s", r.Structured, want)
	}
	// The hash write returns is the one read returns.
	r, _ = tbCall(t, ctx, tb, "read", map[string]any{"path": p})
	if info := tbReadInfo(t, r); info.SHA256 != sha256Hex([]byte("second")) {
		t.Errorf("read sha256 = %s", info.SHA256)
	}
}

func TestWriteOverwriteFalse(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	dir := tb.cfg.Cwd
	p := filepath.Join(dir, "new.txt")
	no := false
	r, _ := tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "made", "overwrite": no})
	tbWant(t, r, false, "Successfully wrote 4 bytes to "+p)
	if info := tbStructured(t, r); info["created"] != true {
		t.Errorf("structured = %v, want created", info)
	}

	sum := sha256Hex([]byte("made"))
	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "again", "overwrite": no})
	tbWant(t, r, true, p+" already exists (sha256 "+sum+"); nothing was written. To replace it, write again with expected_sha256 "+sum+" instead of overwrite false.")
	if info := tbStructured(t, r); info["current_sha256"] != sum || info["exists"] != true {
		t.Errorf("structured = %v", info)
	}
	if got := tbRead(t, p); got != "made" {
		t.Errorf("content = %q, want the first write's", got)
	}

	// A directory is something that exists too.
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": "sub", "content": "x", "overwrite": no})
	tbWant(t, r, true, filepath.Join(dir, "sub")+" already exists; nothing was written. Leave out overwrite (or set it to true) to replace it.")

	// overwrite true is the default.
	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "replaced", "overwrite": true})
	tbWant(t, r, false, "Successfully wrote 8 bytes to "+p)

	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "x", "overwrite": no, "expected_sha256": sum})
	tbWant(t, r, true, "overwrite false and expected_sha256 contradict each other: the first only creates a new file, the second only replaces an existing one; give one of them")
	tbOnly(t, dir, "new.txt", "sub")
}

func TestWriteCompareAndSwap(t *testing.T) {
	tb := tbNew(t)
	ctx := context.Background()
	p := tbFile(t, tb.cfg.Cwd, "f.txt", "v1")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := os.Chtimes(p, old, old); err != nil {
		t.Fatal(err)
	}
	v1, stale := sha256Hex([]byte("v1")), sha256Hex([]byte("v0"))

	r, _ := tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "v2", "expected_sha256": stale})
	tbWant(t, r, true, p+" has changed: its sha256 is "+v1+", not the expected "+stale+"; nothing was changed. Read the file again and redo the change against its current content.")
	if fi, err := os.Stat(p); err != nil || !fi.ModTime().Equal(old) || tbRead(t, p) != "v1" {
		t.Fatalf("file touched by a refused write (%v)", err)
	}

	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": p, "content": "v2", "expected_sha256": v1})
	tbWant(t, r, false, "Successfully wrote 2 bytes to "+p)
	if info := tbStructured(t, r); info["sha256"] != sha256Hex([]byte("v2")) || info["created"] != false {
		t.Errorf("structured = %v", info)
	}

	gone := filepath.Join(tb.cfg.Cwd, "gone.txt")
	r, _ = tbCall(t, ctx, tb, "write", map[string]any{"path": gone, "content": "x", "expected_sha256": v1})
	tbWant(t, r, true, gone+" does not exist (expected sha256 "+v1+"); nothing was changed. Check the path, or leave out expected_sha256 to create it.")
	tbOnly(t, tb.cfg.Cwd, "f.txt")
}

// Writers that all expect the same version: exactly one replaces it, the
// others learn the hash of what it wrote.
func TestWriteCompareAndSwapRace(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "shared.txt", "base")
	base := sha256Hex([]byte("base"))
	const writers = 8
	results := make([]*protocol.Result, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			tool, args := "write", map[string]any{"path": p, "content": fmt.Sprintf("writer %d", i), "expected_sha256": base}
			if i%2 == 1 {
				tool, args = "edit", map[string]any{"path": p, "edits": edits("base", fmt.Sprintf("writer %d", i)), "expected_sha256": base}
			}
			results[i], _ = tbCall(t, context.Background(), tb, tool, args)
		}()
	}
	close(start)
	wg.Wait()
	final := tbRead(t, p)
	winners := 0
	for i, r := range results {
		if !r.IsError {
			winners++
			if want := fmt.Sprintf("writer %d", i); final != want {
				t.Errorf("writer %d succeeded but the file holds %q", i, final)
			}
			continue
		}
		if info := tbStructured(t, r); info["current_sha256"] != sha256Hex([]byte(final)) {
			t.Errorf("writer %d: %s; want the winner's hash", i, tbText(t, r))
		}
	}
	if winners != 1 {
		t.Errorf("%d writers succeeded, want exactly 1", winners)
	}
	tbOnly(t, tb.cfg.Cwd, "shared.txt")
}

// expected_sha256 and overwrite false look at the file, so a path the
// policy lets the agent write but not read refuses them.
func TestWriteCompareNeedsRead(t *testing.T) {
	g := tbPolicy(t, `paths: {read: {deny: ["CWD/drop/**"]}}`)
	p := g.file(t, "drop/box.txt", "secret content")
	sum := sha256Hex([]byte("secret content"))
	no := false
	for _, args := range []map[string]any{
		{"path": p, "content": "x", "expected_sha256": sum},
		{"path": p, "content": "x", "overwrite": no},
	} {
		r := run(t, g.toolbox, "write", args)
		if r.Error == nil || r.Error.Code != protocol.CodeDenied || strings.Contains(r.Error.Message, sum) {
			t.Errorf("write %v = %+v, want a denial", args, r)
		}
	}
	if got := tbRead(t, p); got != "secret content" {
		t.Fatalf("content = %q", got)
	}
	if r := run(t, g.toolbox, "write", map[string]any{"path": p, "content": "x"}); r.IsError || r.Error != nil {
		t.Errorf("plain write refused: %+v", r)
	}
}
