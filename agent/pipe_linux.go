package agent

import "golang.org/x/sys/unix"

// ioctlPending asks how many bytes wait in a pipe (FIONREAD).
const ioctlPending = unix.TIOCINQ
