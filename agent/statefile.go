package agent

import (
	"os"
	"path/filepath"
)

// The agent's own state files (its identity, the skills' records, the
// patch journal's folders) are replaced atomically and their folders
// synced, as the background tasks' files are (agent/tasks).

// writeStateFile replaces path with data (mode 0600): a temporary file in
// the same folder, synced, renamed over path, and the folder synced, so a
// crash at any point leaves either the old or the new file whole.
func writeStateFile(path string, data []byte) error {
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
	syncDir(dir)
	return nil
}

// syncDir makes renames in dir durable; errors are ignored (some file
// systems cannot sync directories).
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}
