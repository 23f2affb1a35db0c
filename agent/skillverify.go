package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A skill the fleet installed is served only while its version folder
// holds exactly the files of its signed manifest. The skill tool checks
// the folder on every call, the catalog on every rescan, and the desired
// state's reconcile, hashing every file, on every check of the desired
// state; a mismatch is reported as tampered and repaired at the next
// reconcile.
//
// Hashing every file on every call would cost a skill's whole size per
// call, so the calls remember, per file, the identity it had when it last
// matched its digest (fileStamp: size, modification time, mode, and where
// the system gives them the device, inode and inode change time). Writing
// to a file, renaming another over it or changing its times changes its
// inode change time, which no user can set back (only a change of the
// system clock can), so a file whose content changed is hashed again even
// when its modification time was restored. Systems without an inode
// change time in their file information (Windows) rely on size and
// modification time between reconciles; the reconcile's full hash catches
// what those miss.

// maxVerifyCache bounds the files whose last good identity is kept.
const maxVerifyCache = 4096

// verifyCache remembers the identity of files that matched their digest.
// It is safe for concurrent use.
type verifyCache struct {
	mu    sync.Mutex
	files map[string]verifiedFile // by absolute path
}

type verifiedFile struct {
	stamp  fileStamp
	sha256 string
}

// fileStamp is what identifies one state of a file's content.
type fileStamp struct {
	size  int64
	mtime int64
	mode  fs.FileMode
	sys   sysStamp
}

func stampOf(fi fs.FileInfo) fileStamp {
	return fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode(), sys: sysStampOf(fi)}
}

func newVerifyCache() *verifyCache { return &verifyCache{files: make(map[string]verifiedFile)} }

// known reports whether the file at p was seen with stamp st holding the
// content of digest sha.
func (c *verifyCache) known(p string, st fileStamp, sha string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.files[p]
	return ok && v.stamp == st && v.sha256 == sha
}

func (c *verifyCache) remember(p string, st fileStamp, sha string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) >= maxVerifyCache {
		clear(c.files)
	}
	c.files[p] = verifiedFile{st, sha}
}

// verifyFiles checks that the version folder dir holds exactly m's files:
// nothing else but folders, each file a regular file (not a link) of its
// size, executable bit and SHA-256. Files whose identity cache remembers
// matching are not hashed again; a nil cache hashes every file. The error
// names the first file that differs and how.
func verifyFiles(dir string, m *protocol.Manifest, cache *verifyCache) error {
	want := make(map[string]protocol.BundleFile, len(m.Files))
	for _, f := range m.Files {
		want[f.Path] = f
	}
	seen := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
			if !d.IsDir() {
				return fmt.Errorf("%s is not a folder", dir)
			}
			return nil
		case d.IsDir():
			return nil // folders are checked by the files in them
		case !d.Type().IsRegular():
			return fmt.Errorf("%s is not a regular file (a %s)", rel, typeName(d.Type()))
		}
		f, ok := want[rel]
		if !ok {
			return fmt.Errorf("%s is not in the bundle", rel)
		}
		seen++
		return checkFileCached(p, f, cache)
	})
	if err == nil && seen != len(m.Files) {
		err = fmt.Errorf("%d of the bundle's %d files are missing", len(m.Files)-seen, len(m.Files))
	}
	return err
}

// checkFileCached checks the file at p against f, hashing it unless cache
// remembers it matching with the identity it has now.
func checkFileCached(p string, f protocol.BundleFile, cache *verifyCache) error {
	fh, err := os.Open(p)
	if err != nil {
		return err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	// What was opened must be the regular file the walk saw, not a link
	// or a FIFO put in its place since.
	if lfi, err := os.Lstat(p); err != nil || !os.SameFile(fi, lfi) || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s changed while it was checked", f.Path)
	}
	if fi.Size() != f.Size {
		return fmt.Errorf("%s is %d bytes, not %d", f.Path, fi.Size(), f.Size)
	}
	if fs.FileMode(f.Mode)&0o100 != fi.Mode()&0o100 && !windowsModes() {
		return fmt.Errorf("%s has mode %o, not %o", f.Path, fi.Mode().Perm(), f.Mode)
	}
	st := stampOf(fi)
	if cache.known(p, st, f.SHA256) {
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(fh, f.Size+1)); err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return fmt.Errorf("%s has SHA-256 %s, not %s", f.Path, got, f.SHA256)
	}
	cache.remember(p, st, f.SHA256)
	return nil
}

// tamperedError is a fleet skill whose files differ from its signed
// manifest.
type tamperedError struct {
	name, bundle string
	err          error
}

func (e *tamperedError) Error() string {
	return fmt.Sprintf("skill %s was changed on disk since the fleet installed it (%s): %v", e.name, shortBundleID(e.bundle), e.err)
}

func (e *tamperedError) Unwrap() error { return e.err }

// shortBundleID names a bundle in a message.
func shortBundleID(id string) string {
	if len(id) > len("sha256:")+12 {
		return id[:len("sha256:")+12]
	}
	return id
}
