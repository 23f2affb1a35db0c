//go:build !unix

package agent

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// The race-free file layer needs openat and O_NOFOLLOW; on other systems
// (Windows) the file tools refuse to work rather than work unsafely.

var errNoSafeFS = errors.New("the file tools are not available on this host yet: its agent runs on Windows, where they cannot refuse links and junctions race-free; use bash, which runs PowerShell here")

type dirHandle struct{ path string }

type fileID struct{ dev, ino uint64 }

func openDir(string, bool) (*dirHandle, error)                       { return nil, errNoSafeFS }
func (d *dirHandle) Close() error                                    { return nil }
func (d *dirHandle) openRead(string) (*os.File, error)               { return nil, errNoSafeFS }
func (d *dirHandle) lstat(string) (*fileMeta, error)                 { return nil, errNoSafeFS }
func (d *dirHandle) replace(string, []byte, *fileMeta) error         { return errNoSafeFS }
func (d *dirHandle) stage(string, []byte, *fileMeta) (string, error) { return "", errNoSafeFS }
func (d *dirHandle) rename(string, string) error                     { return errNoSafeFS }
func (d *dirHandle) linkNew(string, string) error                    { return errNoSafeFS }
func (d *dirHandle) stageAs(string, []byte, *fileMeta) error         { return errNoSafeFS }
func (d *dirHandle) link(string, string) error                       { return errNoSafeFS }
func (d *dirHandle) renameNew(string, string) error                  { return errNoSafeFS }
func (d *dirHandle) sync()                                           {}
func identity(fs.FileInfo) (fileID, bool)                            { return fileID{}, false }
func (d *dirHandle) sub(string) (*dirHandle, error)                  { return nil, errNoSafeFS }
func (d *dirHandle) readNames(int) ([]string, bool, error)           { return nil, false, errNoSafeFS }
func (d *dirHandle) readlink(string) (string, error)                 { return "", errNoSafeFS }
func (d *dirHandle) remove(string, bool) error                       { return errNoSafeFS }
func (d *dirHandle) moveTo(string, *dirHandle, string, bool) error {
	return errNoSafeFS
}

func flockDir(string, time.Duration) (int, error) { return -1, nil }
func noHardLinks(error) bool                      { return false }
func lockNB(*os.File) (bool, error)               { return false, errNoSafeFS }

const noFollow = 0

func closeFD(int) {}
