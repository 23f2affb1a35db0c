//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package agent

// ioctlPending asks how many bytes wait in a pipe: FIONREAD,
// _IOR('f', 127, int) on the BSDs.
const ioctlPending = 0x4004667f
