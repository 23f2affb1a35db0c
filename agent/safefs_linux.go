package agent

import "golang.org/x/sys/unix"

// dirFlags open a directory for walking: O_PATH needs only search
// permission, like the kernel's own path walk.
const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC
