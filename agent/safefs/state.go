package safefs

import (
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
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	SyncDir(dir)
	return nil
}

// SyncDir makes renames and removals in dir durable; errors are ignored
// (some file systems, and Windows, cannot sync directories).
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
