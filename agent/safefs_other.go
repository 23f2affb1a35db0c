//go:build !unix && !windows

package agent

import (
	"errors"
	"io/fs"
	"os"
	"time"
)

// The race-free file layer needs openat and O_NOFOLLOW (Unix) or
// NtCreateFile relative to a directory handle (Windows); on other systems
// the file tools refuse to work rather than work unsafely.

var errNoSafeFS = errors.New("the file tools are not available on this host: its agent runs on a system that cannot open files without following links")

type dirHandle struct{ path string }

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
func (d *dirHandle) sub(string) (*dirHandle, error)                  { return nil, errNoSafeFS }
func (d *dirHandle) readNames(int) ([]string, bool, error)           { return nil, false, errNoSafeFS }
func (d *dirHandle) readlink(string) (string, error)                 { return "", errNoSafeFS }
func (d *dirHandle) remove(string, bool) error                       { return errNoSafeFS }
func (d *dirHandle) moveTo(string, *dirHandle, string, bool) error {
	return errNoSafeFS
}

func flockDir(string, time.Duration) (func(), error) { return func() {}, nil }
func noHardLinks(error) bool                         { return false }
func lockNB(*os.File) (bool, error)                  { return false, errNoSafeFS }
func deviceOf(string) (uint64, bool)                 { return 0, false }
func openedRegular(fi fs.FileInfo) bool              { return fi.Mode().IsRegular() }
func realName(_, name string) (string, error)        { return name, nil }

const noFollow = 0

// linkKind names what the layer refuses to go through, for messages.
const linkKind = "a symbolic link"
