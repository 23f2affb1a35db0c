package safefs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// Locks on Windows: the directory locks that make compare-and-swap hold
// between agents on one host (see Locks.Lock), and the lock that
// marks a patch journal as in use.

// fileIDInfo is FILE_ID_INFO: a volume serial number and a 128-bit file
// ID (ReFS needs all of it; NTFS uses 64 bits).
type fileIDInfo struct {
	VolumeSerialNumber uint64
	FileID             [16]byte
}

// identity returns the volume and file ID of the directory d.
func (d *Dir) identity() (uint64, [16]byte, error) {
	var id fileIDInfo
	err := windows.GetFileInformationByHandleEx(d.h, windows.FileIdInfo, (*byte)(unsafe.Pointer(&id)), uint32(unsafe.Sizeof(id)))
	if err == nil {
		return id.VolumeSerialNumber, id.FileID, nil
	}
	// File systems without 128-bit IDs (FAT): the 64-bit index.
	info, err := queryInfo(d.h)
	if err != nil {
		return 0, id.FileID, err
	}
	var fid [16]byte
	binary.LittleEndian.PutUint64(fid[:], info.index)
	return uint64(info.volume), fid, nil
}

// flockDir locks the directory dir against the other agents on this
// host and returns the function that unlocks it. A directory cannot be
// locked on Windows, so every agent locks the byte that stands for it
// (lockOffset of its volume and file ID, the same whatever path reaches
// it) in one host-wide file, dirLockFile. It polls, so that a process
// that holds the lock for good cannot make it wait for ever: after wait
// it gives up with ErrDirLocked. Windows releases the lock if the agent
// dies.
func flockDir(dir string, wait time.Duration) (func(), error) {
	d, err := OpenDir(dir, false)
	if err != nil {
		return nil, err
	}
	volume, id, err := d.identity()
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("identify %s: %w", dir, err)
	}
	f, err := openDirLockFile()
	if err != nil {
		return nil, err
	}
	off := lockOffset(volume, id)
	ol := windows.Overlapped{Offset: uint32(off), OffsetHigh: uint32(off >> 32)}
	deadline := time.Now().Add(wait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := windows.LockFileEx(f, windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, &ol)
		if err == nil {
			return func() {
				_ = windows.UnlockFileEx(f, 0, 1, 0, &ol)
				windows.CloseHandle(f)
			}, nil
		}
		if !errors.Is(err, windows.ERROR_LOCK_VIOLATION) || time.Now().After(deadline) {
			windows.CloseHandle(f)
			if errors.Is(err, windows.ERROR_LOCK_VIOLATION) {
				err = ErrDirLocked
			}
			return nil, err
		}
		time.Sleep(pause)
	}
}

// dirLockFile is the host-wide file whose bytes stand for directories
// (see flockDir), in ProgramData so that every agent on the host, under
// whichever account, finds the same one. It is reached like any file the
// tools open, refusing links and junctions on the way: a junction planted
// there cannot make an agent running as SYSTEM create a file elsewhere.
// It is only ever opened for reading (locking needs no more) and holds
// nothing.
const dirLockFile = `fleetmcp\dirlocks`

func openDirLockFile() (windows.Handle, error) {
	base, err := windows.KnownFolderPath(windows.FOLDERID_ProgramData, 0)
	if err != nil {
		return windows.InvalidHandle, fmt.Errorf("find ProgramData for the directory lock file: %w", err)
	}
	p := filepath.Join(base, dirLockFile)
	d, err := OpenDir(filepath.Dir(p), true)
	if err != nil {
		return windows.InvalidHandle, fmt.Errorf("directory lock file: %s", Problem(filepath.Dir(p), err))
	}
	defer d.Close()
	h, _, err := d.openAt(filepath.Base(p), openSpec{access: windows.FILE_GENERIC_READ, disposition: windows.FILE_OPEN_IF, options: windows.FILE_NON_DIRECTORY_FILE, raw: true})
	if err != nil {
		return windows.InvalidHandle, fmt.Errorf("directory lock file: %s", Problem(p, err))
	}
	return h, nil
}

// NoFollow makes an os.OpenFile open a link itself rather than follow it
// (os.OpenFile passes FILE_FLAG_* bits on to CreateFile).
const NoFollow = windows.FILE_FLAG_OPEN_REPARSE_POINT

// LockNB takes an exclusive lock on f without waiting: one byte far past
// the end, as the state directory's lock does. It reports false when
// another open file holds one (err is then nil) or on failure.
func LockNB(f *os.File) (bool, error) {
	ol := &windows.Overlapped{OffsetHigh: 0x7fffffff}
	err := windows.LockFileEx(windows.Handle(f.Fd()), windows.LOCKFILE_EXCLUSIVE_LOCK|windows.LOCKFILE_FAIL_IMMEDIATELY, 0, 1, 0, ol)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, windows.ERROR_LOCK_VIOLATION):
		return false, nil
	}
	return false, err
}
