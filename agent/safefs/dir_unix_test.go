//go:build unix

package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestToolboxPathLocks(t *testing.T) {
	var l pathLocks
	var wg sync.WaitGroup
	var a, b int
	counts := map[string]*int{"/a": &a, "/b": &b} // only read concurrently
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := []string{"/a", "/b"}[i%2]
			unlock := l.lock(p)
			*counts[p]++ // the race detector catches unserialised access
			unlock()
		}()
	}
	wg.Wait()
	if a != 25 || b != 25 {
		t.Errorf("counts = %d, %d; want 25, 25", a, b)
	}
	if n := l.size(); n != 0 {
		t.Errorf("%d lock entries left, want 0", n)
	}

	unlock := l.lock("/c")
	got := make(chan bool)
	go func() {
		u := l.lock("/c")
		got <- true
		u()
	}()
	select {
	case <-got:
		t.Fatal("second lock of /c did not wait")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	<-got
}

// A directory another process keeps locked fails the change after the
// wait, changing nothing; a directory that does not exist yet is not
// locked.
func TestDirLockHeldElsewhere(t *testing.T) {
	dir := t.TempDir()
	release, err := flockDir(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	start := time.Now()
	if _, err := flockDir(dir, 100*time.Millisecond); !errors.Is(err, ErrDirLocked) {
		t.Fatalf("second lock: %v, want ErrDirLocked", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("gave up after %v", d)
	}
	var l dirLocks
	unlock, err := l.lock(filepath.Join(dir, "not-yet"), filepath.Join(dir, "not-yet"))
	if err != nil {
		t.Fatalf("missing directory: %v", err)
	}
	unlock()
}

func TestEvalExisting(t *testing.T) {
	dir := t.TempDir()
	real, _ := filepath.EvalSymlinks(dir)
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "a"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		filepath.Join(dir, "link", "new", "file"): filepath.Join(real, "a", "new", "file"),
		filepath.Join(dir, "a"):                   filepath.Join(real, "a"),
		filepath.Join(dir, "missing"):             filepath.Join(real, "missing"),
	} {
		if got, err := EvalExisting(in); err != nil || got != want {
			t.Errorf("EvalExisting(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

// writeFiles makes the files of files (relative path: content) below dir,
// with their directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// content is the content of the file at p, "" if there is none.
func content(p string) string {
	data, _ := os.ReadFile(p)
	return string(data)
}

// renameChecked is the rename where renameat2 is missing: it never
// replaces, for files (link and unlink) and directories.
func TestRenameChecked(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"a": "a", "b": "b", "d/x": "x"})
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := renameChecked(fd, "a", fd, "b", false); !errors.Is(err, unix.EEXIST) {
		t.Errorf("file onto a file: %v", err)
	}
	if err := renameChecked(fd, "d", fd, "b", true); !errors.Is(err, unix.EEXIST) {
		t.Errorf("directory onto a file: %v", err)
	}
	if err := renameChecked(fd, "a", fd, "c", false); err != nil || content(filepath.Join(dir, "c")) != "a" || content(filepath.Join(dir, "a")) != "" {
		t.Errorf("file: %v", err)
	}
	if err := renameChecked(fd, "d", fd, "e", true); err != nil || content(filepath.Join(dir, "e/x")) != "x" {
		t.Errorf("directory: %v", err)
	}
	if err := renameChecked(fd, "missing", fd, "f", false); !errors.Is(err, unix.ENOENT) {
		t.Errorf("missing file: %v", err)
	}
}
