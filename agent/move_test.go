//go:build unix

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
)

func TestMove(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	src := tbFile(t, dir, "a.txt", "hello")
	if err := os.Chmod(src, 0o600); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "new/dirs/b.txt")
	tbWant(t, run(t, tb, "move", map[string]any{"path": "a.txt", "destination": "new/dirs/b.txt"}), false, "Moved file "+src+" to "+dst)
	if tbExists(t, src) || tbRead(t, dst) != "hello" || tbMode(t, dst) != 0o600 {
		t.Error("the file did not move as it was")
	}

	// A link moves itself, not what it leads to.
	outside := tbFile(t, t.TempDir(), "target.txt", "keep")
	tbLink(t, dir, "link", outside)
	tbWant(t, run(t, tb, "move", map[string]any{"path": "link", "destination": "moved-link"}), false,
		"Moved symbolic link "+filepath.Join(dir, "link")+" to "+filepath.Join(dir, "moved-link"))
	if dest, err := os.Readlink(filepath.Join(dir, "moved-link")); err != nil || dest != outside || tbRead(t, outside) != "keep" {
		t.Errorf("moved link: %q, %v", dest, err)
	}

	// A directory, with a matching hash refused for it.
	tbFile(t, dir, "tree/sub/x.txt", "x")
	wantFailure(t, "move a directory with a hash", run(t, tb, "move", map[string]any{"path": "tree", "destination": "tree2", "expected_sha256": sha256Hex(nil)}),
		"is a directory; expected_sha256 applies to regular files only")
	tbWant(t, run(t, tb, "move", map[string]any{"path": "tree", "destination": "tree2"}), false,
		"Moved directory "+filepath.Join(dir, "tree")+" to "+filepath.Join(dir, "tree2"))
	if tbRead(t, filepath.Join(dir, "tree2/sub/x.txt")) != "x" || tbExists(t, filepath.Join(dir, "tree")) {
		t.Error("the directory did not move")
	}
	wantFailure(t, "move a directory into itself", run(t, tb, "move", map[string]any{"path": "tree2", "destination": "tree2/sub/inner"}),
		"cannot move directory "+filepath.Join(dir, "tree2")+" into itself")
	if tbExists(t, filepath.Join(dir, "tree2/sub/inner")) {
		t.Error("a refused move created its destination")
	}

	for _, tt := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"path": "", "destination": "x"}, "path is empty"},
		{map[string]any{"path": "x", "destination": ""}, "destination is empty"},
		{map[string]any{"path": "missing", "destination": "x"}, "missing: no such file"},
		{map[string]any{"path": "tree2", "destination": "./tree2"}, "is the same as path"},
		{map[string]any{"path": "/", "destination": "x"}, "/ is the root directory"},
	} {
		wantFailure(t, "move "+tt.args["path"].(string), run(t, tb, "move", tt.args), tt.want)
	}
	tbBadArgs(t, run(t, tb, "move", map[string]any{"path": "x", "to": "y"}), "unknown field")
}

// move never replaces: onto an existing file, directory or link it is
// refused and both sides stay as they were.
func TestMoveNoReplace(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	src := tbFile(t, dir, "a.txt", "source")
	dst := tbFile(t, dir, "b.txt", "destination")
	tbFile(t, dir, "d/x", "x")
	tbLink(t, dir, "dangling", filepath.Join(dir, "nowhere"))
	for _, dest := range []string{"b.txt", "d", "dangling"} {
		wantFailure(t, "move onto "+dest, run(t, tb, "move", map[string]any{"path": "a.txt", "destination": dest}),
			"already exists; move never replaces anything, and nothing was moved")
	}
	if tbRead(t, src) != "source" || tbRead(t, dst) != "destination" || tbExists(t, filepath.Join(dir, "nowhere")) {
		t.Error("a refused move changed something")
	}
	// The rename itself refuses an entry that appears after the check.
	sd, err := safefs.OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	for _, isDir := range []bool{false, true} {
		name := "a.txt"
		if isDir {
			name = "d"
		}
		if err := sd.MoveTo(name, sd, "b.txt", isDir); !errors.Is(err, os.ErrExist) {
			t.Errorf("moveTo onto an existing file (dir %v): %v", isDir, err)
		}
	}
	if tbRead(t, src) != "source" || tbRead(t, dst) != "destination" {
		t.Error("moveTo replaced a file")
	}
}

// A stale expected_sha256 leaves both sides untouched, and creates no
// directory for the destination.
func TestMoveExpectedHash(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	src := tbFile(t, dir, "a.txt", "current")
	r := run(t, tb, "move", map[string]any{"path": "a.txt", "destination": "new/b.txt", "expected_sha256": sha256Hex([]byte("old"))})
	wantFailure(t, "stale hash", r, "has changed: its sha256 is "+sha256Hex([]byte("current")))
	if tbRead(t, src) != "current" || tbExists(t, filepath.Join(dir, "new")) {
		t.Fatal("a refused move changed something")
	}
	tbLink(t, dir, "link", src)
	wantFailure(t, "hash on a link", run(t, tb, "move", map[string]any{"path": "link", "destination": "l2", "expected_sha256": sha256Hex([]byte("current"))}),
		"is a symbolic link; expected_sha256 applies to regular files only")
	wantAllowed(t, "current hash", run(t, tb, "move", map[string]any{"path": "a.txt", "destination": "new/b.txt", "expected_sha256": sha256Hex([]byte("current"))}))
	if tbRead(t, filepath.Join(dir, "new/b.txt")) != "current" {
		t.Error("the move with the current hash did not happen")
	}
}

// Both paths are checked: read and write where it is, write where it
// goes, and for a directory every entry below it on both sides.
func TestMovePolicy(t *testing.T) {
	g := tbPolicy(t, `paths: {write: {allow: ["CWD/**"], deny: ["CWD/public/**/*.key"]}, read: {deny: ["CWD/sealed"]}}`)
	elsewhere := t.TempDir()
	a := g.file(t, "a.txt", "a")
	sealed := g.file(t, "sealed", "s")
	keyDir := g.file(t, "dir/tls/server.key", "k")
	g.file(t, "dir/readme", "r")

	wantDenied(t, "move out of the allowed tree", run(t, g.toolbox, "move", map[string]any{"path": "a.txt", "destination": filepath.Join(elsewhere, "a.txt")}), "outside paths.write.allow")
	wantDenied(t, "move an unreadable file", run(t, g.toolbox, "move", map[string]any{"path": "sealed", "destination": "unsealed"}), "paths.read.deny")
	wantDenied(t, "move a directory whose entry may not go there", run(t, g.toolbox, "move", map[string]any{"path": "dir", "destination": "public/dir"}),
		`paths.write.deny "`+g.cwd+`/public/**/*.key"; nothing was moved`)
	if !tbExists(t, a) || !tbExists(t, sealed) || !tbExists(t, keyDir) || tbExists(t, filepath.Join(g.cwd, "public")) || tbExists(t, filepath.Join(elsewhere, "a.txt")) {
		t.Fatal("a refused move changed something")
	}
	wantAllowed(t, "move within the tree", run(t, g.toolbox, "move", map[string]any{"path": "dir", "destination": "private/dir"}))

	// The agent's own files, and trees that hold them, whatever the
	// policy says.
	g = tbPolicy(t, "# unrestricted\n")
	g.file(t, "a.txt", "a")
	wantDenied(t, "move the policy file", run(t, g.toolbox, "move", map[string]any{"path": g.policyFile, "destination": "p.yaml"}), "its policy file")
	wantDenied(t, "move into the state directory", run(t, g.toolbox, "move", map[string]any{"path": "a.txt", "destination": filepath.Join(g.state, "a.txt")}), "its state directory")
	wantDenied(t, "move what holds the state directory", run(t, g.toolbox, "move", map[string]any{"path": filepath.Dir(g.state), "destination": "own"}),
		"it holds "+g.state+", which belongs to the agent (its state directory)")
	wantFailure(t, "move the working directory", run(t, g.toolbox, "move", map[string]any{"path": g.cwd, "destination": g.cwd + "-moved"}), "is the agent's working directory or holds it")
	if !tbExists(t, g.policyFile) || !tbExists(t, g.state) || !tbExists(t, g.cwd) {
		t.Fatal("a refused move moved the agent's files")
	}
}

// A move between file systems is refused with a way out, before any
// directory is created for it.
func TestMoveCrossDevice(t *testing.T) {
	tb := tbNew(t)
	var st1, st2 syscall.Stat_t
	if syscall.Stat(tb.cfg.Cwd, &st1) != nil || syscall.Stat("/dev/shm", &st2) != nil || st1.Dev == st2.Dev {
		t.Skip("no second file system at /dev/shm")
	}
	other, err := os.MkdirTemp("/dev/shm", "move")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	src := tbFile(t, tb.cfg.Cwd, "a.txt", "a")
	wantFailure(t, "move across file systems", run(t, tb, "move", map[string]any{"path": "a.txt", "destination": filepath.Join(other, "new/a.txt")}),
		"are on different file systems, and move only renames; nothing was moved. Copy a file with read and write, then delete the original")
	if !tbExists(t, src) || tbExists(t, filepath.Join(other, "new")) {
		t.Error("a refused move changed something")
	}
}

// Moves that swap two paths in opposite directions at once never
// deadlock: both paths are locked in one order.
func TestMoveLockOrder(t *testing.T) {
	tb := tbNew(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tbFile(t, tb.cfg.Cwd, "a", "a")
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 200 {
				from, to := "a", "b"
				if i%2 == 1 {
					from, to = to, from
				}
				tbCall(t, ctx, tb, "move", map[string]any{"path": from, "destination": to})
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("concurrent moves deadlocked")
	}
	if tbExists(t, filepath.Join(tb.cfg.Cwd, "a")) == tbExists(t, filepath.Join(tb.cfg.Cwd, "b")) {
		t.Error("the file was lost or duplicated")
	}
	if n := tb.locks.Held(); n != 0 {
		t.Errorf("%d locks left", n)
	}
}
