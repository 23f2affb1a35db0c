package safefs

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"strconv"
	"syscall"
)

// Meta describes a directory entry: a write keeps the mode and owner
// of the file it replaces; list and the tree walks use the rest.
type Meta struct {
	Mode     fs.FileMode
	UID, GID int
	Size     int64
	Dev      uint64 // the file system it is on
	// Name is the entry described, in the directory it was read from: on
	// Windows a replacement takes its access rules from it.
	Name string
}

// ErrSwapped reports a path that changed between its check and its use.
var ErrSwapped = errors.New(LinkKind + " appeared in it after it was checked")

// tempName is a new hidden name next to name for a file that replaces it.
func tempName(name string) string {
	return "." + CutName(name, 100) + ".tmp-" + strconv.FormatUint(rand.Uint64()%1e12, 10)
}

// fillTemp writes data to tmp, gives it the owner and mode of old (0644
// when old is nil), syncs and closes it.
func fillTemp(tmp *os.File, data []byte, old *Meta) error {
	if err := writeTemp(tmp, data, old); err != nil {
		return err
	}
	return tmp.Close()
}

// writeTemp is fillTemp without the close.
func writeTemp(tmp *os.File, data []byte, old *Meta) error {
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if old != nil {
		mode = old.Mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if old.UID != os.Geteuid() || old.GID != os.Getegid() {
			// Keeping the owner only works with privileges; without them
			// the file gets the agent's owner, as any new file would.
			_ = tmp.Chown(old.UID, old.GID)
		}
	}
	// Chmod after Chown: chown clears the set-user-ID bit.
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	return tmp.Sync()
}

// Problem describes a file-system error on path for a model.
func Problem(path string, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return path + ": no such file"
	case errors.Is(err, fs.ErrPermission):
		return path + ": permission denied"
	case errors.Is(err, syscall.ENOTDIR):
		return path + ": a parent of it is not a directory"
	case errors.Is(err, syscall.ELOOP):
		return path + ": too many levels of symbolic links"
	case errors.Is(err, ErrSwapped):
		return path + ": changed while it was being checked (" + LinkKind + " appeared in it); try again"
	}
	return err.Error()
}
