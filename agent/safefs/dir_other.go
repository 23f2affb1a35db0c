//go:build !unix && !windows

package safefs

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

type Dir struct{ Path string }

func OpenDir(string, bool) (*Dir, error)                   { return nil, errNoSafeFS }
func (d *Dir) Close() error                                { return nil }
func (d *Dir) OpenRead(string) (*os.File, error)           { return nil, errNoSafeFS }
func (d *Dir) Lstat(string) (*Meta, error)                 { return nil, errNoSafeFS }
func (d *Dir) Replace(string, []byte, *Meta) error         { return errNoSafeFS }
func (d *Dir) Stage(string, []byte, *Meta) (string, error) { return "", errNoSafeFS }
func (d *Dir) Rename(string, string) error                 { return errNoSafeFS }
func (d *Dir) LinkNew(string, string) error                { return errNoSafeFS }
func (d *Dir) StageAs(string, []byte, *Meta) error         { return errNoSafeFS }
func (d *Dir) Link(string, string) error                   { return errNoSafeFS }
func (d *Dir) RenameNew(string, string) error              { return errNoSafeFS }
func (d *Dir) Sync()                                       {}
func (d *Dir) Sub(string) (*Dir, error)                    { return nil, errNoSafeFS }
func (d *Dir) ReadNames(int) ([]string, bool, error)       { return nil, false, errNoSafeFS }
func (d *Dir) Readlink(string) (string, error)             { return "", errNoSafeFS }
func (d *Dir) Remove(string, bool) error                   { return errNoSafeFS }
func (d *Dir) MoveTo(string, *Dir, string, bool) error {
	return errNoSafeFS
}

func flockDir(string, time.Duration) (func(), error) { return func() {}, nil }
func NoHardLinks(error) bool                         { return false }
func LockNB(*os.File) (bool, error)                  { return false, errNoSafeFS }
func DeviceOf(string) (uint64, bool)                 { return 0, false }
func OpenedRegular(fi fs.FileInfo) bool              { return fi.Mode().IsRegular() }
func RealName(_, name string) (string, error)        { return name, nil }

const NoFollow = 0

// LinkKind names what the layer refuses to go through, for messages.
const LinkKind = "a symbolic link"
