package safefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/windows"
)

// The file tools check a resolved path, then open exactly that path: from
// its root (the drive or share), one name at a time, each relative to the
// handle of its parent directory (NtCreateFile with a RootDirectory) and
// with FILE_OPEN_REPARSE_POINT, so that no symbolic link, junction or
// mount point is ever followed: one found on the way fails the open (see
// isWinLink). A link swapped in after the check therefore cannot redirect
// a read or a write. Writes create their temporary file and rename it
// relative to the directory opened this way. The decisions that are plain
// Go (splitting a path, the names opened, modes, the records the kernel
// returns) are in winfs.go, tested on every system.

// The values winfs.go decides with are Windows' own: the build fails if
// they differ.
var (
	_ = [1]int{}[winAttrReadonly^windows.FILE_ATTRIBUTE_READONLY]
	_ = [1]int{}[winAttrDirectory^windows.FILE_ATTRIBUTE_DIRECTORY]
	_ = [1]int{}[winAttrReparse^windows.FILE_ATTRIBUTE_REPARSE_POINT]
	_ = [1]int{}[winTagSymlink^windows.IO_REPARSE_TAG_SYMLINK]
	_ = [1]int{}[winTagMountPoint^windows.IO_REPARSE_TAG_MOUNT_POINT]
)

// Dir is an open directory reached without following links.
type Dir struct {
	h windows.Handle
	// Path is the directory's path, as it was opened.
	Path string
}

const (
	shareAll = windows.FILE_SHARE_READ | windows.FILE_SHARE_WRITE | windows.FILE_SHARE_DELETE
	// dirAccess lets a handle list a directory, open names in it and
	// describe it. dirWalkAccess is what is left when listing is denied.
	dirAccess     = windows.FILE_LIST_DIRECTORY | dirWalkAccess
	dirWalkAccess = windows.FILE_TRAVERSE | windows.FILE_READ_ATTRIBUTES | windows.SYNCHRONIZE
	// fileRenameInformationEx and fileLinkInformation are
	// FILE_INFORMATION_CLASS values x/sys/windows does not name (its
	// FileLinkInformation, 72, is FileLinkInformationEx).
	fileRenameInformationEx = 65
	fileLinkInformation     = 11
)

// openSpec says how Dir.openAt opens a name.
type openSpec struct {
	access, disposition, options uint32
	// link opens a link itself (to describe, rename or remove it) instead
	// of failing with ErrSwapped.
	link bool
	// raw keeps a reparse point that is not a link as it is; otherwise it
	// is opened again through the filter that serves it (see openAt).
	raw bool
}

// ntOpen opens name relative to root (an absolute NT name when root is
// 0) with NtCreateFile: synchronous I/O, names compared without case, the
// handle not inherited by child processes.
func ntOpen(root windows.Handle, name string, access, disposition, options uint32) (windows.Handle, error) {
	u, err := ntString(name)
	if err != nil {
		return windows.InvalidHandle, err
	}
	oa := windows.OBJECT_ATTRIBUTES{RootDirectory: root, ObjectName: u, Attributes: windows.OBJ_CASE_INSENSITIVE}
	oa.Length = uint32(unsafe.Sizeof(oa))
	var h windows.Handle
	var iosb windows.IO_STATUS_BLOCK
	err = windows.NtCreateFile(&h, access|windows.SYNCHRONIZE, &oa, &iosb, nil, windows.FILE_ATTRIBUTE_NORMAL,
		shareAll, disposition, options|windows.FILE_SYNCHRONOUS_IO_NONALERT, 0, 0)
	if err != nil {
		return windows.InvalidHandle, ntError(err)
	}
	return h, nil
}

// ntString makes s a counted UTF-16 string. The conversion is the syscall
// package's, which keeps names that are not valid UTF-16 (decoded as
// WTF-8 by parseDirInfo) as they are.
func ntString(s string) (*windows.NTUnicodeString, error) {
	u, err := syscall.UTF16FromString(s)
	if err != nil {
		return nil, err
	}
	n := 2 * (len(u) - 1)
	if n+2 > 0xffff {
		return nil, syscall.ENAMETOOLONG
	}
	return &windows.NTUnicodeString{Length: uint16(n), MaximumLength: uint16(n + 2), Buffer: &u[0]}, nil
}

// ntError turns an NTSTATUS into the error the tools test for.
func ntError(err error) error {
	st, ok := err.(windows.NTStatus)
	if !ok {
		return err
	}
	switch st {
	case windows.STATUS_OBJECT_NAME_COLLISION:
		return windows.ERROR_ALREADY_EXISTS // matches fs.ErrExist
	case windows.STATUS_NOT_A_DIRECTORY:
		return syscall.ENOTDIR
	case windows.STATUS_FILE_IS_A_DIRECTORY:
		return syscall.EISDIR
	case windows.STATUS_NOT_SAME_DEVICE:
		return syscall.EXDEV
	case windows.STATUS_REPARSE_POINT_ENCOUNTERED, windows.STATUS_STOPPED_ON_SYMLINK:
		return ErrSwapped
	}
	return st.Errno()
}

// winInfo is what the file layer reads from an open handle.
type winInfo struct {
	attrs, tag uint32
	volume     uint32
	index      uint64 // the file index: with volume, the file's identity
	size       int64
	fileType   uint32
}

// fileAttributeTagInfo is FILE_ATTRIBUTE_TAG_INFO.
type fileAttributeTagInfo struct {
	FileAttributes uint32
	ReparseTag     uint32
}

func queryInfo(h windows.Handle) (winInfo, error) {
	var bh windows.ByHandleFileInformation
	if err := windows.GetFileInformationByHandle(h, &bh); err != nil {
		return winInfo{}, err
	}
	i := winInfo{
		attrs:  bh.FileAttributes,
		volume: bh.VolumeSerialNumber,
		index:  uint64(bh.FileIndexHigh)<<32 | uint64(bh.FileIndexLow),
		size:   int64(bh.FileSizeHigh)<<32 | int64(bh.FileSizeLow),
	}
	if i.attrs&windows.FILE_ATTRIBUTE_REPARSE_POINT != 0 {
		var ti fileAttributeTagInfo
		if err := windows.GetFileInformationByHandleEx(h, windows.FileAttributeTagInfo, (*byte)(unsafe.Pointer(&ti)), uint32(unsafe.Sizeof(ti))); err != nil {
			return winInfo{}, err
		}
		i.tag = ti.ReparseTag
	}
	t, err := windows.GetFileType(h)
	if err != nil {
		return winInfo{}, err
	}
	i.fileType = t
	return i, nil
}

// openAt opens name in d ("." is d itself) as spec says, never through a
// link: FILE_OPEN_REPARSE_POINT opens a link itself, which then fails
// with ErrSwapped unless spec.link. A reparse point that is not a link (a
// file a cloud-sync or deduplication filter serves, whose data a raw open
// would not show) is opened again, relative to the raw handle with an
// empty name (as ReOpenFile does), through its filter; the new handle
// must be the same file, or the open fails with ErrSwapped.
func (d *Dir) openAt(name string, spec openSpec) (windows.Handle, winInfo, error) {
	nt := ""
	if name != "." {
		if err := checkEntryName(name); err != nil {
			return windows.InvalidHandle, winInfo{}, &fs.PathError{Op: "open", Path: filepath.Join(d.Path, name), Err: err}
		}
		nt = name
	}
	h, err := ntOpen(d.h, nt, spec.access|windows.FILE_READ_ATTRIBUTES, spec.disposition, spec.options|windows.FILE_OPEN_REPARSE_POINT)
	if err != nil {
		return windows.InvalidHandle, winInfo{}, &fs.PathError{Op: "open", Path: filepath.Join(d.Path, name), Err: err}
	}
	info, err := queryInfo(h)
	switch {
	case err != nil:
	case isWinLink(info.attrs, info.tag) && !spec.link:
		err = ErrSwapped
	case info.attrs&windows.FILE_ATTRIBUTE_REPARSE_POINT != 0 && !isWinLink(info.attrs, info.tag) && !spec.raw:
		var through windows.Handle
		through, info, err = reopenThrough(h, info, spec)
		if err == nil {
			windows.CloseHandle(h)
			h = through
		}
	}
	if err != nil {
		windows.CloseHandle(h)
		return windows.InvalidHandle, winInfo{}, &fs.PathError{Op: "open", Path: filepath.Join(d.Path, name), Err: err}
	}
	return h, info, nil
}

// reopenThrough opens the file of raw again without
// FILE_OPEN_REPARSE_POINT, checking that it is still the same file.
func reopenThrough(raw windows.Handle, was winInfo, spec openSpec) (windows.Handle, winInfo, error) {
	h, err := ntOpen(raw, "", spec.access|windows.FILE_READ_ATTRIBUTES, windows.FILE_OPEN, spec.options&^windows.FILE_OPEN_REPARSE_POINT)
	if err != nil {
		return windows.InvalidHandle, winInfo{}, err
	}
	info, err := queryInfo(h)
	if err == nil && (info.volume != was.volume || info.index != was.index || isWinLink(info.attrs, info.tag)) {
		err = ErrSwapped
	}
	if err != nil {
		windows.CloseHandle(h)
		return windows.InvalidHandle, winInfo{}, err
	}
	return h, info, nil
}

// OpenDir opens the directory at path, an absolute clean path that had no
// links when it was checked. With create, missing directories are made
// (they inherit the access rules of their parent).
func OpenDir(path string, create bool) (*Dir, error) {
	parts, err := splitWinPath(path)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	h, err := ntOpen(0, parts.ntRoot, dirAccess, windows.FILE_OPEN, windows.FILE_DIRECTORY_FILE)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: parts.root, Err: err}
	}
	d := &Dir{h: h, Path: parts.root}
	for _, name := range parts.names {
		next, err := d.component(name, create)
		d.Close()
		if err != nil {
			return nil, err
		}
		d = next
	}
	d.Path = path
	return d, nil
}

// component opens directory name in d, making it with create.
func (d *Dir) component(name string, create bool) (*Dir, error) {
	disposition := uint32(windows.FILE_OPEN)
	if create {
		disposition = windows.FILE_OPEN_IF
	}
	spec := openSpec{access: dirAccess, disposition: disposition, options: windows.FILE_DIRECTORY_FILE}
	h, _, err := d.openAt(name, spec)
	if errors.Is(err, windows.ERROR_ACCESS_DENIED) {
		// Listing is denied; walking through may not be.
		spec.access = dirWalkAccess
		h, _, err = d.openAt(name, spec)
	}
	if errors.Is(err, syscall.ENOTDIR) {
		// A file, or a link to one: say which.
		if meta, lerr := d.Lstat(name); lerr == nil && meta.Mode&fs.ModeSymlink != 0 {
			err = &fs.PathError{Op: "open", Path: filepath.Join(d.Path, name), Err: ErrSwapped}
		}
	}
	if err != nil {
		return nil, err
	}
	return &Dir{h: h, Path: filepath.Join(d.Path, name)}, nil
}

// Close closes the directory.
func (d *Dir) Close() error { return windows.CloseHandle(d.h) }

// Sub opens directory name in d without following a link ("." opens d
// again).
func (d *Dir) Sub(name string) (*Dir, error) {
	return d.component(name, false)
}

// OpenRead opens name in d for reading, without following a link. Only a
// file on a disk opens: a pipe or a device does not (none can be a name
// in a directory of a disk or share, but the layer does not rely on it).
func (d *Dir) OpenRead(name string) (*os.File, error) {
	h, info, err := d.openAt(name, openSpec{access: windows.FILE_GENERIC_READ, disposition: windows.FILE_OPEN})
	if err != nil {
		return nil, err
	}
	p := filepath.Join(d.Path, name)
	if info.fileType != windows.FILE_TYPE_DISK {
		windows.CloseHandle(h)
		return nil, fmt.Errorf("%s is not a regular file or a directory", p)
	}
	return os.NewFile(uintptr(h), p), nil
}

// Lstat describes name in d without following a link.
func (d *Dir) Lstat(name string) (*Meta, error) {
	h, info, err := d.openAt(name, openSpec{disposition: windows.FILE_OPEN, link: true, raw: true})
	if err != nil {
		return nil, err
	}
	windows.CloseHandle(h)
	return &Meta{Mode: winEntryMode(info.attrs, info.tag), UID: os.Geteuid(), GID: os.Getegid(),
		Size: info.size, Dev: uint64(info.volume), Name: name}, nil
}

// Replace writes data to a new temporary file in d and renames it over
// name, so that readers see either the old content or the new. The
// temporary file gets old's read-only attribute and access rules (those
// of a new file in d when old is nil), and is renamed through the handle
// that wrote it (access rules taken from old may not let the agent open
// it again); on failure it is removed and name is left alone.
func (d *Dir) Replace(name string, data []byte, old *Meta) error {
	var h windows.Handle
	var tmpName string
	err := fs.ErrExist
	for i := 0; i < 100 && errors.Is(err, fs.ErrExist); i++ {
		tmpName = tempName(name)
		h, err = d.create(tmpName)
	}
	if err != nil {
		return fmt.Errorf("create a temporary file in %s: %s", d.Path, Problem(d.Path, err))
	}
	tmp := os.NewFile(uintptr(h), filepath.Join(d.Path, tmpName))
	defer tmp.Close()
	err = d.keepAccess(h, old)
	if err == nil {
		err = writeTemp(tmp, data, old)
	}
	if err != nil {
		_ = setDelete(h)
		return fmt.Errorf("write %s: %w", filepath.Join(d.Path, name), err)
	}
	if err := setRename(h, d.h, name, true); err != nil {
		_ = setDelete(h)
		return fmt.Errorf("replace %s: %w", filepath.Join(d.Path, name), err)
	}
	d.Sync()
	return nil
}

// StageAs writes data to a new file called tmpName in d, as replace does
// before its rename, failing with fs.ErrExist when the name is taken. On
// failure nothing is left behind.
func (d *Dir) StageAs(tmpName string, data []byte, old *Meta) error {
	h, err := d.create(tmpName)
	if err != nil {
		return err
	}
	tmp := os.NewFile(uintptr(h), filepath.Join(d.Path, tmpName))
	err = d.keepAccess(h, old)
	if err == nil {
		err = writeTemp(tmp, data, old)
	}
	if err != nil {
		_ = setDelete(h)
		tmp.Close()
		return fmt.Errorf("write %s: %w", filepath.Join(d.Path, tmpName), err)
	}
	if err := tmp.Close(); err != nil {
		_ = d.Remove(tmpName, false)
		return fmt.Errorf("write %s: %w", filepath.Join(d.Path, tmpName), err)
	}
	return nil
}

// create makes the new file name in d, for writing, failing with an error
// matching fs.ErrExist when the name is taken.
func (d *Dir) create(name string) (windows.Handle, error) {
	h, _, err := d.openAt(name, openSpec{
		access:      windows.FILE_GENERIC_WRITE | windows.WRITE_DAC | windows.DELETE,
		disposition: windows.FILE_CREATE,
		options:     windows.FILE_NON_DIRECTORY_FILE,
		raw:         true,
	})
	return h, err
}

// keepAccess gives the new file h the access rules (DACL) of old, the
// entry old.name of d, when they are its own: explicit entries, or a DACL
// protected from inheritance. A DACL that is all inherited from d is what
// h has already. Without this a replaced file would lose the rules that
// keep it private, as a Unix file would lose its mode. A file system that
// keeps no access rules (FAT) has none to keep.
func (d *Dir) keepAccess(h windows.Handle, old *Meta) error {
	if old == nil || old.Name == "" {
		return nil
	}
	var flags uint32
	if err := windows.GetVolumeInformationByHandle(d.h, nil, 0, nil, nil, &flags, nil, 0); err == nil && flags&windows.FILE_PERSISTENT_ACLS == 0 {
		return nil
	}
	src, _, err := d.openAt(old.Name, openSpec{access: windows.READ_CONTROL, disposition: windows.FILE_OPEN, link: true, raw: true})
	if err != nil {
		return fmt.Errorf("read the access rules of %s: %w", filepath.Join(d.Path, old.Name), err)
	}
	defer windows.CloseHandle(src)
	sd, err := windows.GetSecurityInfo(src, windows.SE_FILE_OBJECT, windows.DACL_SECURITY_INFORMATION)
	if err != nil {
		return fmt.Errorf("read the access rules of %s: %w", filepath.Join(d.Path, old.Name), err)
	}
	control, _, err := sd.Control()
	if err != nil {
		return fmt.Errorf("read the access rules of %s: %w", filepath.Join(d.Path, old.Name), err)
	}
	dacl, _, err := sd.DACL()
	if errors.Is(err, windows.ERROR_OBJECT_NOT_FOUND) {
		return nil // no DACL at all: nothing to keep
	}
	if err != nil {
		return fmt.Errorf("read the access rules of %s: %w", filepath.Join(d.Path, old.Name), err)
	}
	protected := control&windows.SE_DACL_PROTECTED != 0
	if !protected && !hasExplicitACE(dacl) {
		return nil
	}
	info := windows.SECURITY_INFORMATION(windows.DACL_SECURITY_INFORMATION | windows.UNPROTECTED_DACL_SECURITY_INFORMATION)
	if protected {
		info = windows.DACL_SECURITY_INFORMATION | windows.PROTECTED_DACL_SECURITY_INFORMATION
	}
	if err := windows.SetSecurityInfo(h, windows.SE_FILE_OBJECT, info, nil, nil, dacl, nil); err != nil {
		return fmt.Errorf("give the new content the access rules of %s: %w", filepath.Join(d.Path, old.Name), err)
	}
	return nil
}

// hasExplicitACE reports whether acl has an entry of its own rather than
// one inherited from the directory. A nil acl (a NULL DACL, which allows
// everyone everything) counts as its own.
func hasExplicitACE(acl *windows.ACL) bool {
	if acl == nil {
		return true
	}
	for i := range uint32(acl.AceCount) {
		var ace *windows.ACCESS_ALLOWED_ACE
		if windows.GetAce(acl, i, &ace) != nil || ace.Header.AceFlags&windows.INHERITED_ACE == 0 {
			return true
		}
	}
	return false
}

// fileRenameInformation is FILE_RENAME_INFORMATION (Flags is its
// ReplaceIfExists) and FILE_RENAME_INFORMATION_EX; with ReplaceIfExists
// false it is also FILE_LINK_INFORMATION. The layout is the one Go's own
// os.Root uses (internal/syscall/windows): the name is one directory
// entry, at most 255 characters.
type fileRenameInformation struct {
	Flags          uint32
	RootDirectory  windows.Handle
	FileNameLength uint32
	FileName       [windows.MAX_PATH]uint16
}

// newRenameInfo names toName in the directory to.
func newRenameInfo(to windows.Handle, toName string, flags uint32) (*fileRenameInformation, error) {
	if err := checkEntryName(toName); err != nil {
		return nil, err
	}
	u, err := syscall.UTF16FromString(toName)
	if err != nil {
		return nil, err
	}
	info := &fileRenameInformation{Flags: flags, RootDirectory: to, FileNameLength: uint32(2 * (len(u) - 1))}
	if len(u) > len(info.FileName) {
		return nil, syscall.ENAMETOOLONG
	}
	copy(info.FileName[:], u)
	return info, nil
}

// renameAt renames name in d to toName in to, the link itself for a link
// (see setRename).
func (d *Dir) renameAt(name string, to *Dir, toName string, replace bool) error {
	if err := checkEntryName(name); err != nil { // "." too, which openAt takes as d
		return err
	}
	h, _, err := d.openAt(name, openSpec{access: windows.DELETE, disposition: windows.FILE_OPEN, link: true, raw: true})
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	return setRename(h, to.h, toName, replace)
}

// setRename renames the file h (opened with DELETE access) to toName in
// the directory dir. With replace an entry at toName is replaced (a
// read-only file too, and one that is open); without it the rename fails
// with an error matching fs.ErrExist when toName exists, atomically:
// Windows has no other rename.
func setRename(h, dir windows.Handle, toName string, replace bool) error {
	flags := uint32(windows.FILE_RENAME_POSIX_SEMANTICS)
	if replace {
		flags |= windows.FILE_RENAME_REPLACE_IF_EXISTS | windows.FILE_RENAME_IGNORE_READONLY_ATTRIBUTE
	}
	info, err := newRenameInfo(dir, toName, flags)
	if err != nil {
		return err
	}
	var iosb windows.IO_STATUS_BLOCK
	err = windows.NtSetInformationFile(h, &iosb, (*byte)(unsafe.Pointer(info)), uint32(unsafe.Sizeof(*info)), fileRenameInformationEx)
	if unsupported(err) {
		// A Windows (before 10 1809) or a file system (FAT) without
		// FileRenameInformationEx or one of its flags: the plain rename,
		// ReplaceIfExists a BOOLEAN, which cannot replace a read-only
		// file.
		info.Flags = 0
		if replace {
			info.Flags = 1
		}
		err = windows.NtSetInformationFile(h, &iosb, (*byte)(unsafe.Pointer(info)), uint32(unsafe.Sizeof(*info)), windows.FileRenameInformation)
	}
	if err != nil {
		return ntError(err)
	}
	return nil
}

// unsupported reports whether an NTSTATUS says that an information class
// or one of its flags is not supported.
func unsupported(err error) bool {
	return err == windows.STATUS_INVALID_INFO_CLASS || err == windows.STATUS_INVALID_PARAMETER ||
		err == windows.STATUS_NOT_SUPPORTED || err == windows.STATUS_INVALID_DEVICE_REQUEST
}

// Rename renames from to to within d, replacing to.
func (d *Dir) Rename(from, to string) error {
	if err := d.renameAt(from, d, to, true); err != nil {
		return &fs.PathError{Op: "rename", Path: filepath.Join(d.Path, to), Err: err}
	}
	return nil
}

// RenameNew renames from to to within d without replacing anything: it
// fails with an error matching fs.ErrExist when to exists.
func (d *Dir) RenameNew(from, to string) error {
	return d.MoveTo(from, d, to, false)
}

// LinkNew gives the file from the name to in d, failing with fs.ErrExist
// when to exists, and removes the name from: on Windows a rename that
// never replaces.
func (d *Dir) LinkNew(from, to string) error {
	if err := d.renameAt(from, d, to, false); err != nil {
		if errors.Is(err, fs.ErrExist) {
			err = fs.ErrExist
		}
		return &fs.PathError{Op: "create", Path: filepath.Join(d.Path, to), Err: err}
	}
	return nil
}

// MoveTo renames name in d to toName in to, never replacing an entry
// that exists there: it then fails with an error that matches
// fs.ErrExist.
func (d *Dir) MoveTo(name string, to *Dir, toName string, isDir bool) error {
	if err := d.renameAt(name, to, toName, false); err != nil {
		return &os.LinkError{Op: "move", Old: filepath.Join(d.Path, name), New: filepath.Join(to.Path, toName), Err: err}
	}
	return nil
}

// Link gives the file name in d the second name to, failing when to
// exists. NoHardLinks tells a file system without hard links.
func (d *Dir) Link(name, to string) error {
	h, _, err := d.openAt(name, openSpec{access: windows.FILE_WRITE_ATTRIBUTES, disposition: windows.FILE_OPEN, raw: true})
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	info, err := newRenameInfo(d.h, to, 0)
	if err == nil {
		var iosb windows.IO_STATUS_BLOCK
		err = ntError(windows.NtSetInformationFile(h, &iosb, (*byte)(unsafe.Pointer(info)), uint32(unsafe.Sizeof(*info)), fileLinkInformation))
	}
	if err != nil {
		return &fs.PathError{Op: "link", Path: filepath.Join(d.Path, to), Err: err}
	}
	return nil
}

// NoHardLinks reports whether a link failed because the file system
// does not do hard links (FAT, exFAT, some shares).
func NoHardLinks(err error) bool {
	return errors.Is(err, windows.ERROR_INVALID_FUNCTION) || errors.Is(err, windows.ERROR_NOT_SUPPORTED) ||
		errors.Is(err, windows.ERROR_TOO_MANY_LINKS) || errors.Is(err, syscall.EXDEV)
}

// Remove deletes the entry name from d: the link itself for a link, and
// with dir an empty directory (see setDelete).
func (d *Dir) Remove(name string, dir bool) error {
	p := filepath.Join(d.Path, name)
	if err := checkEntryName(name); err != nil { // "." too, which openAt takes as d
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	h, info, err := d.openAt(name, openSpec{access: windows.DELETE, disposition: windows.FILE_OPEN, link: true, raw: true})
	if err != nil {
		return err
	}
	defer windows.CloseHandle(h)
	isDir := info.attrs&windows.FILE_ATTRIBUTE_DIRECTORY != 0 && !isWinLink(info.attrs, info.tag)
	switch {
	case dir && !isDir:
		return &fs.PathError{Op: "remove", Path: p, Err: syscall.ENOTDIR}
	case !dir && isDir:
		return &fs.PathError{Op: "remove", Path: p, Err: syscall.EISDIR}
	}
	if err := setDelete(h); err != nil {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	return nil
}

// fileDispositionInformationEx is FILE_DISPOSITION_INFORMATION_EX;
// fileDispositionInformation is FILE_DISPOSITION_INFORMATION (a BOOLEAN).
type (
	fileDispositionInformationEx struct{ Flags uint32 }
	fileDispositionInformation   struct{ DeleteFile bool }
)

// setDelete deletes the file h (opened with DELETE access). The name goes
// at once, even while another process has the file open (POSIX
// semantics), and a read-only file goes too, as on Unix.
func setDelete(h windows.Handle) error {
	var iosb windows.IO_STATUS_BLOCK
	ex := fileDispositionInformationEx{Flags: windows.FILE_DISPOSITION_DELETE | windows.FILE_DISPOSITION_POSIX_SEMANTICS | windows.FILE_DISPOSITION_IGNORE_READONLY_ATTRIBUTE}
	err := windows.NtSetInformationFile(h, &iosb, (*byte)(unsafe.Pointer(&ex)), uint32(unsafe.Sizeof(ex)), windows.FileDispositionInformationEx)
	if unsupported(err) {
		// A Windows (before 10 1809) or a file system (FAT) without
		// FileDispositionInformationEx or one of its flags: deleted when
		// the last handle closes, and not if it is read-only.
		plain := fileDispositionInformation{DeleteFile: true}
		err = windows.NtSetInformationFile(h, &iosb, (*byte)(unsafe.Pointer(&plain)), uint32(unsafe.Sizeof(plain)), windows.FileDispositionInformation)
	}
	if err != nil {
		return ntError(err)
	}
	return nil
}

// Sync makes a rename in d durable: it flushes the directory. Errors are
// ignored, as on Unix: not every file system flushes a directory, and the
// rename itself has succeeded.
func (d *Dir) Sync() {
	h, err := ntOpen(d.h, "", windows.FILE_WRITE_DATA, windows.FILE_OPEN, windows.FILE_DIRECTORY_FILE|windows.FILE_OPEN_REPARSE_POINT)
	if err != nil {
		return
	}
	_ = windows.FlushFileBuffers(h)
	windows.CloseHandle(h)
}

// ReadNames returns the names in d ("." and ".." left out), in the order
// the file system keeps them, at most max of them, and whether more
// remain. Each call reads the directory from its start.
func (d *Dir) ReadNames(max int) ([]string, bool, error) {
	buf := make([]byte, 64<<10) // the size Go's os package reads with
	class := uint32(windows.FileFullDirectoryRestartInfo)
	var names []string
	for len(names) <= max {
		err := windows.GetFileInformationByHandleEx(d.h, class, &buf[0], uint32(len(buf)))
		if errors.Is(err, windows.ERROR_NO_MORE_FILES) || class == windows.FileFullDirectoryRestartInfo && errors.Is(err, windows.ERROR_FILE_NOT_FOUND) {
			break // an empty root directory reports "not found"
		}
		if err != nil {
			return nil, false, &fs.PathError{Op: "readdir", Path: d.Path, Err: err}
		}
		batch, err := parseDirInfo(buf)
		if err != nil {
			return nil, false, &fs.PathError{Op: "readdir", Path: d.Path, Err: err}
		}
		names = append(names, batch...)
		class = windows.FileFullDirectoryInfo
	}
	if len(names) > max {
		return names[:max], true, nil
	}
	return names, false, nil
}

// Readlink returns the destination of the link name in d.
func (d *Dir) Readlink(name string) (string, error) {
	h, _, err := d.openAt(name, openSpec{disposition: windows.FILE_OPEN, link: true, raw: true})
	if err != nil {
		return "", err
	}
	defer windows.CloseHandle(h)
	buf := make([]byte, windows.MAXIMUM_REPARSE_DATA_BUFFER_SIZE)
	var n uint32
	if err := windows.DeviceIoControl(h, windows.FSCTL_GET_REPARSE_POINT, nil, 0, &buf[0], uint32(len(buf)), &n, nil); err != nil {
		return "", &fs.PathError{Op: "readlink", Path: filepath.Join(d.Path, name), Err: err}
	}
	target, err := parseReparseTarget(buf[:n])
	if err != nil {
		return "", &fs.PathError{Op: "readlink", Path: filepath.Join(d.Path, name), Err: err}
	}
	return target, nil
}

// DeviceOf returns the volume serial number of the file at path (links
// followed), as lstat reports it in Meta.Dev.
func DeviceOf(path string) (uint64, bool) {
	p, err := syscall.UTF16PtrFromString(path)
	if err != nil {
		return 0, false
	}
	h, err := windows.CreateFile(p, windows.FILE_READ_ATTRIBUTES, shareAll, nil, windows.OPEN_EXISTING, windows.FILE_FLAG_BACKUP_SEMANTICS, 0)
	if err != nil {
		return 0, false
	}
	defer windows.CloseHandle(h)
	var bh windows.ByHandleFileInformation
	if windows.GetFileInformationByHandle(h, &bh) != nil {
		return 0, false
	}
	return uint64(bh.VolumeSerialNumber), true
}

// OpenedRegular reports whether fi, the description of a file the layer
// opened, is a regular file. Go reports a reparse point that is not a
// link (a file a cloud-sync or compression filter serves) as irregular;
// the layer opened it through its filter, and its data is the file's.
func OpenedRegular(fi fs.FileInfo) bool {
	t := fi.Mode().Type()
	return t == 0 || t == fs.ModeIrregular
}

// RealName returns the name, as the directory holds it, of the entry
// name in dir: Windows also opens a file by its short (8.3) name
// (PROGRA~1) and without regard to case, and the path rules must judge
// the name the entry has. A name that does not exist is returned as it
// is; one with wildcards is not looked up (the rules refuse it).
func RealName(dir, name string) (string, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, `*?<>"`) {
		return name, nil
	}
	p, err := syscall.UTF16PtrFromString(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	var fd windows.Win32finddata
	h, err := windows.FindFirstFile(p, &fd)
	if errors.Is(err, fs.ErrNotExist) {
		return name, nil
	}
	if err != nil {
		return "", err
	}
	windows.FindClose(h)
	return syscall.UTF16ToString(fd.FileName[:]), nil
}

// LinkKind names what the layer refuses to go through, for messages.
const LinkKind = "a symbolic link or junction"
