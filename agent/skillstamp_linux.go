package agent

import (
	"io/fs"
	"syscall"
)

// sysStamp is the part of a file's identity only the system's own file
// information holds: which file it is, and when its inode last changed
// (which a write, a rename over it or a change of its times all move,
// and no user can set back).
type sysStamp struct {
	dev, ino    uint64
	ctime, nsec int64
}

func sysStampOf(fi fs.FileInfo) sysStamp {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sysStamp{}
	}
	return sysStamp{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctim.Sec, nsec: st.Ctim.Nsec}
}
