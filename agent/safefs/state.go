package safefs

import (
	"io"
	"os"
	"path/filepath"
)

// The agent's own state (its identity, the skills' records, the patch
// journal, the background tasks) lives in folders only the agent writes,
// so it is reached by plain paths; what matters there is that a crash
// never leaves a file half-written.

// WriteStateFile replaces path with data (mode 0600): a temporary file in
// the same folder, synced, renamed over path, and the folder synced, so a
// crash at any point leaves either the old or the new file whole.
func WriteStateFile(path string, data []byte) error {
	return ReplaceFile(path, 0o600, writeAll(data), nil)
}

// PlaceStateFile is WriteStateFile with place putting the synced
// temporary file at path (for a link that refuses to replace anything).
func PlaceStateFile(path string, data []byte, place func(tmp, path string) error) error {
	return ReplaceFile(path, 0o600, writeAll(data), place)
}

// ReplaceFile writes path through fill, whole or not at all, and durable
// once it returns: fill writes a temporary file beside path (mode perm),
// which is synced, put at path by place (nil: renamed over it), and the
// folder synced. The temporary file is removed whatever happened.
func ReplaceFile(path string, perm os.FileMode, fill func(io.Writer) error, place func(tmp, path string) error) error {
	if place == nil {
		place = os.Rename
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // once renamed, this fails harmlessly
	err = fill(f)
	if err == nil && perm != 0o600 {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(f.Name(), path)
	}
	if err != nil {
		return err
	}
	SyncDir(dir)
	return nil
}

func writeAll(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// SyncDir makes renames and removals in dir durable; errors are ignored
// (some file systems, and Windows, cannot sync directories).
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
