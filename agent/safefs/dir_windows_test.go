package safefs

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/windows"
)

// These tests run the Windows file layer against a real NTFS volume. They
// need Windows (a junction is made with cmd's mklink /J; symbolic links
// need developer mode or the privilege, and are skipped without).

// winTree makes dir\real\f.txt ("secret") and the junction dir\j to
// dir\real, and returns dir, with its names as the volume holds them.
func winTree(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "real", "f.txt"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cmd", "/c", "mklink", "/J", filepath.Join(dir, "j"), filepath.Join(dir, "real")).CombinedOutput(); err != nil {
		t.Fatalf("mklink /J: %v: %s", err, out)
	}
	return dir
}

// TestWinJunctionsRefused: the layer never goes through a junction, and
// treats one as a link: lstat says so, readlink reads it, remove removes
// the junction and not what it leads to.
func TestWinJunctionsRefused(t *testing.T) {
	dir := winTree(t)
	if d, err := OpenDir(filepath.Join(dir, "j"), false); !errors.Is(err, ErrSwapped) {
		if d != nil {
			d.Close()
		}
		t.Fatalf("OpenDir through a junction: %v, want ErrSwapped", err)
	}
	d, err := OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if f, err := d.OpenRead("j"); !errors.Is(err, ErrSwapped) {
		if f != nil {
			f.Close()
		}
		t.Errorf("openRead of a junction: %v, want ErrSwapped", err)
	}
	meta, err := d.Lstat("j")
	if err != nil || meta.Mode&fs.ModeSymlink == 0 {
		t.Fatalf("lstat(junction) = %+v, %v; want a link", meta, err)
	}
	if target, err := d.Readlink("j"); err != nil || !strings.EqualFold(target, filepath.Join(dir, "real")) {
		t.Errorf("readlink(junction) = %q, %v", target, err)
	}
	if got, err := RealPath(filepath.Join(dir, "j", "f.txt")); err != nil || got != filepath.Join(dir, "real", "f.txt") {
		t.Errorf("RealPath through the junction = %q, %v", got, err)
	}
	if err := d.Remove("j", false); err != nil {
		t.Fatalf("remove(junction): %v", err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "real", "f.txt")); err != nil || string(data) != "secret" {
		t.Errorf("after removing the junction its target holds %q, %v", data, err)
	}
}

// TestWinSymlinksRefused: the same for symbolic links, to files and to
// directories.
func TestWinSymlinksRefused(t *testing.T) {
	dir := winTree(t)
	if err := os.Symlink(filepath.Join(dir, "real", "f.txt"), filepath.Join(dir, "fl")); err != nil {
		t.Skip("cannot make symbolic links here:", err)
	}
	if err := os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "dl")); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"fl", "dl"} {
		if f, err := d.OpenRead(name); !errors.Is(err, ErrSwapped) {
			if f != nil {
				f.Close()
			}
			t.Errorf("openRead(%s): %v, want ErrSwapped", name, err)
		}
		if sub, err := d.Sub(name); !errors.Is(err, ErrSwapped) {
			if sub != nil {
				sub.Close()
			}
			t.Errorf("sub(%s): %v, want ErrSwapped", name, err)
		}
	}
	if err := d.Replace("fl", []byte("x"), nil); err != nil {
		t.Fatalf("replace over a link: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "real", "f.txt")); string(data) != "secret" {
		t.Errorf("replacing the link wrote through it: %q", data)
	}
}

// TestWinReplace: a replacement is atomic, keeps the read-only attribute
// and access rules of its own, and leaves no temporary file.
func TestWinReplace(t *testing.T) {
	dir := winTree(t)
	p := filepath.Join(dir, "real", "f.txt")
	own, err := windows.SecurityDescriptorFromString("D:P(A;;FA;;;OW)(A;;FA;;;SY)")
	if err != nil {
		t.Fatal(err)
	}
	dacl, _, err := own.DACL()
	if err != nil {
		t.Fatal(err)
	}
	if err := windows.SetNamedSecurityInfo(p, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION|windows.PROTECTED_DACL_SECURITY_INFORMATION, nil, nil, dacl, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o444); err != nil {
		t.Fatal(err)
	}
	before, err := windows.GetNamedSecurityInfo(p, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION)
	if err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(filepath.Dir(p), false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	old, err := d.Lstat(filepath.Base(p))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Replace(filepath.Base(p), []byte("new\r\ncontent\r\n"), old); err != nil {
		t.Fatalf("Replace: %v", err)
	}
	if data, _ := os.ReadFile(p); string(data) != "new\r\ncontent\r\n" {
		t.Errorf("content %q", data)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o200 != 0 {
		t.Errorf("the read-only attribute was lost: %v, %v", fi.Mode(), err)
	}
	after, err := windows.GetNamedSecurityInfo(p, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION)
	if err != nil || after.String() != before.String() {
		t.Errorf("access rules %s, want %s (%v)", after, before, err)
	}
	names, err := os.ReadDir(filepath.Join(dir, "real"))
	if err != nil || len(names) != 1 {
		t.Errorf("directory holds %v, %v; want f.txt alone", names, err)
	}
}

// TestWinNoReplaceRename: renameNew and moveTo never replace, linkNew
// neither; rename does.
func TestWinNoReplaceRename(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"a", "b"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.RenameNew("a", "b"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("renameNew onto a file: %v, want fs.ErrExist", err)
	}
	if err := d.LinkNew("a", "b"); !errors.Is(err, fs.ErrExist) {
		t.Errorf("linkNew onto a file: %v, want fs.ErrExist", err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "b")); string(data) != "b" {
		t.Errorf("b was replaced: %q", data)
	}
	if err := d.Rename("a", "b"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(dir, "b")); string(data) != "a" {
		t.Errorf("rename did not replace b: %q", data)
	}
	if err := d.Link("b", "c"); err != nil && !NoHardLinks(err) {
		t.Errorf("link: %v", err)
	}
}

// TestWinReadNames reads a directory in parts and whole, twice from one
// handle.
func TestWinReadNames(t *testing.T) {
	dir := t.TempDir()
	var want []string
	for i := range 3000 {
		n := strings.Repeat("n", i%50) + "-" + time.Duration(i).String()
		want = append(want, n)
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if names, more, err := d.ReadNames(100); err != nil || len(names) != 100 || !more {
		t.Errorf("readNames(100) = %d names, %v, %v", len(names), more, err)
	}
	names, more, err := d.ReadNames(5000)
	slices.Sort(names)
	slices.Sort(want)
	if err != nil || more || !slices.Equal(names, want) {
		t.Errorf("readNames(5000) = %d names, %v, %v; want %d", len(names), more, err, len(want))
	}
}

// TestWinDirLock: a directory locked by one holder stays locked for
// another, whatever path or case names it, until released.
func TestWinDirLock(t *testing.T) {
	dir := t.TempDir()
	release, err := flockDir(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := flockDir(strings.ToUpper(dir), 100*time.Millisecond); !errors.Is(err, ErrDirLocked) {
		t.Fatalf("second lock: %v, want ErrDirLocked", err)
	}
	release()
	again, err := flockDir(dir, time.Second)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again()
}

// TestWinRefusedNames: names Windows reads as something else are neither
// opened nor created.
func TestWinRefusedNames(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, name := range []string{"a.txt:stream", "a.txt::$DATA", "a.txt.", "nul", "COM1.txt"} {
		if f, err := d.OpenRead(name); err == nil {
			f.Close()
			t.Errorf("openRead(%q) opened", name)
		}
		if err := d.Replace(name, []byte("x"), nil); err == nil {
			t.Errorf("replace(%q) wrote", name)
		}
	}
	if _, err := OpenDir(`\\.\pipe\x`, false); err == nil {
		t.Error(`OpenDir(\\.\pipe\x) opened`)
	}
}
