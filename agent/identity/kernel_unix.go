//go:build unix

package identity

import "golang.org/x/sys/unix"

// kernelRelease returns the kernel's release (uname -r), or "".
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
