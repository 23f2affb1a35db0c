//go:build !unix && !windows

package statelock

import (
	"errors"
	"os"
)

// errLocked reports a lock another process holds.
var errLocked = errors.New("locked by another process")

func openLockFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}

// lockFile cannot lock here: one agent per state directory is then up to
// the operator.
func lockFile(*os.File) error { return nil }
