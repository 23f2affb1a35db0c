package statelock

import (
	"errors"
	"os"

	"golang.org/x/sys/windows"
)

// errLocked reports a lock another process holds.
var errLocked = errors.New("locked by another process")

// openLockFile opens (creating it) the lock file at path. Handles are not
// inherited by the programs the agent starts.
func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}

// lockFile takes an exclusive lock on f without waiting: one byte far
// past the end, so that the holder's process ID at the start stays
// readable. It lasts until f is closed or the process dies.
func lockFile(f *os.File) error {
	ol := &windows.Overlapped{OffsetHigh: 0x7fffffff}
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
		return errLocked
	}
	return err
}
