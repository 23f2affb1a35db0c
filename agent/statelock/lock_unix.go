//go:build unix

package statelock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// errLocked reports a lock another process holds.
var errLocked = errors.New("locked by another process")

// openLockFile opens (creating it, mode 0600) the lock file at path,
// close-on-exec, never through a symbolic link.
func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
}

// lockFile takes an exclusive flock on f without waiting. The lock
// belongs to f's open file description: it lasts until f is closed or
// the process dies, and, f being close-on-exec, no program the process
// starts inherits it. A second open in the same process conflicts with
// it, as another process's would.
func lockFile(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return errLocked
		}
		return err
	}
}
