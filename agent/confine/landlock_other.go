//go:build !linux

package confine

import (
	"errors"
	"runtime"
)

// ABI returns 0 and why: only Linux has Landlock.
func ABI() (int, string) {
	return 0, runtime.GOOS + " has no Landlock; run the agent's commands as a user of their own"
}

func restrict([]Rule, int) error {
	return errors.New(runtime.GOOS + " cannot confine commands")
}

func execve([]string, []string) error {
	return errors.New(runtime.GOOS + " cannot confine commands")
}
