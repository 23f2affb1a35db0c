package agent

import (
	"io/fs"
	"syscall"
)

// sysStamp: see skillstamp_linux.go.
type sysStamp struct {
	dev, ino    uint64
	ctime, nsec int64
}

func sysStampOf(fi fs.FileInfo) sysStamp {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sysStamp{}
	}
	return sysStamp{dev: uint64(st.Dev), ino: st.Ino, ctime: st.Ctimespec.Sec, nsec: st.Ctimespec.Nsec}
}
