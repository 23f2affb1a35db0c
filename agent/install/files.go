package install

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
)

// writeIfChanged makes path hold data with mode perm, replacing it
// atomically (temporary file, fsync, rename, fsync of the directory) and
// only when its content or mode differ. It reports whether it wrote.
func writeIfChanged(path string, data []byte, perm os.FileMode) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		fi, err := os.Stat(path)
		if err == nil && fi.Mode().Perm() == perm {
			return false, nil
		}
		if err == nil {
			return true, os.Chmod(path, perm)
		}
	}
	return true, replaceFile(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// copyIfChanged makes dst a copy of src (mode perm), atomically and only
// when they differ. It reports whether it copied.
func copyIfChanged(src, dst string, perm os.FileMode) (bool, error) {
	same, err := sameContent(src, dst)
	if err != nil {
		return false, err
	}
	if same {
		if fi, err := os.Stat(dst); err == nil && fi.Mode().Perm() != perm {
			return true, os.Chmod(dst, perm)
		}
		return false, nil
	}
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	return true, replaceFile(dst, perm, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

// sameContent reports whether the files a and b hold the same bytes (b
// missing: false).
func sameContent(a, b string) (bool, error) {
	fa, err := os.Stat(a)
	if err != nil {
		return false, err
	}
	fb, err := os.Stat(b)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if os.SameFile(fa, fb) {
		return true, nil
	}
	if fa.Size() != fb.Size() {
		return false, nil
	}
	da, err := os.ReadFile(a)
	if err != nil {
		return false, err
	}
	db, err := os.ReadFile(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(da, db), nil
}

// replaceFile writes path through fill: whole or not at all, durable once
// it returns. The directory is made (0755) when missing.
func replaceFile(path string, perm os.FileMode, fill func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := safefs.ReplaceFile(path, perm, fill, nil); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// ensureDir makes dir with mode perm, or sets the mode of the one there.
// It reports whether it changed anything.
func ensureDir(dir string, perm os.FileMode) (bool, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, perm); err != nil {
			return false, err
		}
		return true, os.Chmod(dir, perm) // MkdirAll applies the umask
	case err != nil:
		return false, err
	case !fi.IsDir():
		return false, fmt.Errorf("%s is not a directory", dir)
	case fi.Mode().Perm() != perm:
		return true, os.Chmod(dir, perm)
	}
	return false, nil
}
