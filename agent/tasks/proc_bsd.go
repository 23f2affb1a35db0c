//go:build unix && !linux

package tasks

import (
	"errors"
	"syscall"
)

// procIdentity on systems without /proc: only whether pid exists is known
// (a zombie counts as alive, and a reused PID cannot be told apart).
func procIdentity(pid int) (start string, exited bool, err error) {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return "", false, err
	}
	return "", false, nil
}

// bootID is unknown here.
func bootID() string { return "" }
