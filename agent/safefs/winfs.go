package safefs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/policy"
)

// This file holds the decisions of the Windows file layer that are plain
// Go: how a path splits into a root and names, which names may be opened,
// what mode an entry has, how the kernel's directory and reparse-point
// records read, how links resolve. It is compiled and tested on every
// system; safefs_windows.go only makes the system calls.

// winParts is an absolute Windows path taken apart.
type winParts struct {
	root   string   // as Windows writes it: `C:\`, `\\srv\share\`, `\\?\Volume{...}\`
	ntRoot string   // the same root in the NT namespace: `\??\C:\`, `\??\UNC\srv\share\`
	names  []string // the names below the root, in order
}

// splitWinPath takes p, an absolute Windows path (either separator), apart.
// It accepts a drive (C:\...), a UNC share (\\server\share\...) and the
// device forms of both and of a volume (\\?\C:\, \\?\UNC\server\share\,
// \\?\Volume{GUID}\, also with \\.\ or \??\). Anything else is refused: a
// drive-relative (C:x) or rooted (\x) path, a device path naming anything
// but a disk (\\.\pipe\..., \\.\PhysicalDrive0, \\?\GLOBALROOT\...). The
// names are not checked (see checkEntryName), except that "." and ".."
// are refused: the file layer opens clean paths only.
func splitWinPath(p string) (winParts, error) {
	w, rest, err := splitWinRoot(p)
	if err != nil {
		return w, err
	}
	for name := range strings.SplitSeq(rest, `\`) {
		switch name {
		case "":
			continue
		case ".", "..":
			return w, fmt.Errorf("%s is not a clean path: it has %q in it", p, name)
		}
		w.names = append(w.names, name)
	}
	return w, nil
}

// splitWinRoot returns the root of p (see splitWinPath) and the rest of
// it, with "\" separators.
func splitWinRoot(p string) (w winParts, rest string, err error) {
	s := strings.ReplaceAll(p, "/", `\`)
	switch {
	case hasDevicePrefix(s):
		dev := s[4:]
		switch {
		case len(dev) >= 4 && strings.EqualFold(dev[:4], `UNC\`):
			server, share, r, err := splitShare(dev[4:], p)
			if err != nil {
				return w, "", err
			}
			w.root, w.ntRoot, rest = `\\?\UNC\`+server+`\`+share+`\`, `\??\UNC\`+server+`\`+share+`\`, r
		case isDriveSpec(dev):
			drive := strings.ToUpper(dev[:2])
			w.root, w.ntRoot, rest = `\\?\`+drive+`\`, `\??\`+drive+`\`, strings.TrimPrefix(dev[2:], `\`)
		case isVolumeGUID(dev):
			vol := dev[:volumeGUIDLen]
			w.root, w.ntRoot, rest = `\\?\`+vol+`\`, `\??\`+vol+`\`, strings.TrimPrefix(dev[volumeGUIDLen:], `\`)
		default:
			return w, "", fmt.Errorf("%s is a device path that names no drive, share or volume (\\\\?\\C:\\, \\\\?\\UNC\\server\\share\\, \\\\?\\Volume{...}\\); the file tools open files on disks only", p)
		}
	case strings.HasPrefix(s, `\\`):
		server, share, r, err := splitShare(s[2:], p)
		if err != nil {
			return w, "", err
		}
		w.root, w.ntRoot, rest = `\\`+server+`\`+share+`\`, `\??\UNC\`+server+`\`+share+`\`, r
	case len(s) >= 3 && isDriveSpec(s):
		drive := strings.ToUpper(s[:2])
		w.root, w.ntRoot, rest = drive+`\`, `\??\`+drive+`\`, s[3:]
	default:
		if msg := WinRelativeProblem(p); msg != "" {
			return w, "", errors.New(msg)
		}
		return w, "", fmt.Errorf("%s is not an absolute Windows path (C:\\... or \\\\server\\share\\...)", p)
	}
	return w, rest, nil
}

// hasDevicePrefix reports whether s (with "\" separators) starts with
// \\?\, \\.\ or \??\.
func hasDevicePrefix(s string) bool {
	return strings.HasPrefix(s, `\\?\`) || strings.HasPrefix(s, `\\.\`) || strings.HasPrefix(s, `\??\`)
}

// isDriveSpec reports whether s starts with a drive, "C:", followed by a
// separator or nothing.
func isDriveSpec(s string) bool {
	return len(s) >= 2 && isLetter(s[0]) && s[1] == ':' && (len(s) == 2 || s[2] == '\\')
}

func isLetter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

// volumeGUIDLen is the length of "Volume{xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx}".
const volumeGUIDLen = len("Volume{}") + 36

// isVolumeGUID reports whether s starts with Volume{GUID} followed by a
// separator or nothing.
func isVolumeGUID(s string) bool {
	n := volumeGUIDLen
	if len(s) < n || !strings.EqualFold(s[:7], "Volume{") || s[n-1] != '}' || len(s) > n && s[n] != '\\' {
		return false
	}
	for i, c := range []byte(s[7 : n-1]) {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !strings.ContainsRune("0123456789abcdefABCDEF", rune(c)) {
				return false
			}
		}
	}
	return true
}

// splitShare splits "server\share\rest" (p is the whole path, for
// messages).
func splitShare(s, p string) (server, share, rest string, err error) {
	server, rest, _ = strings.Cut(s, `\`)
	share, rest, _ = strings.Cut(rest, `\`)
	if server == "" || share == "" || strings.ContainsAny(server+share, `*?"<>|:`) {
		return "", "", "", fmt.Errorf("%s: a UNC path needs a server and a share (\\\\server\\share\\...)", p)
	}
	return server, share, rest, nil
}

// WinRelativeProblem says why p, a path a tool was given on a Windows
// host, cannot be placed: it is rooted without a drive (\x, which names
// the current drive's root) or names a drive without a separator (C:x,
// which is relative to that drive's current directory). It returns ""
// for other paths.
func WinRelativeProblem(p string) string {
	s := strings.ReplaceAll(p, "/", `\`)
	switch {
	case strings.HasPrefix(s, `\`) && !strings.HasPrefix(s, `\\`) && !strings.HasPrefix(s, `\??\`):
		return fmt.Sprintf("%s has no drive: write the drive too (C:\\...), or a path relative to the working directory", p)
	case len(s) >= 2 && isLetter(s[0]) && s[1] == ':' && (len(s) == 2 || s[2] != '\\'):
		return fmt.Sprintf("%s names a drive without a separator after it, which Windows reads relative to that drive's current directory: write %s\\%s", p, s[:2], s[2:])
	}
	return ""
}

// checkEntryName refuses a name the Windows file layer will not open or
// create: not a single name ("", ".", "..", or one with a separator),
// or one Windows reads as something other than its text (see
// policy.CheckWindowsName): the layer opens names exactly as they are
// written in the directory, so a stream (a.txt:s) or a name such as
// "nul" or "x." would reach a file Windows programs cannot.
func checkEntryName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("%q is not a file name", name)
	case strings.ContainsAny(name, `\/`):
		return fmt.Errorf("%q is not a single file name", name)
	case len(utf16.Encode([]rune(name))) > 255:
		return fmt.Errorf("%q is longer than the 255 characters a Windows file name may have", name)
	}
	return policy.CheckWindowsName(name)
}

// CheckName reports why name cannot be the name of one directory entry
// on Windows (nil: it can): not a single name, longer than 255 UTF-16
// units, or one Windows reads as something other than its text.
func CheckName(name string) error { return checkEntryName(name) }

// Attribute and reparse-tag values of Windows (winnt.h), for the plain-Go
// decisions below; safefs_windows.go checks them against
// golang.org/x/sys/windows at compile time.
const (
	winAttrReadonly   = 0x1
	winAttrDirectory  = 0x10
	winAttrReparse    = 0x400
	winTagMountPoint  = 0xA0000003
	winTagSymlink     = 0xA000000C
	winTagAFUnix      = 0x80000023
	winNameSurrogate  = 0x20000000 // IsReparseTagNameSurrogate: the point stands for another name
	winSymlinkRelFlag = 0x1        // SYMLINK_FLAG_RELATIVE
)

// isWinLink reports whether an entry with these attributes and reparse
// tag is a link: a reparse point that stands for another name (a symbolic
// link, a junction or volume mount point, a WSL symbolic link). The file
// layer refuses to go through one, as it refuses symbolic links on Unix.
func isWinLink(attrs, tag uint32) bool {
	return attrs&winAttrReparse != 0 && tag&winNameSurrogate != 0
}

// winEntryMode is the mode the tools see for an entry with these
// attributes and reparse tag. A link is a symbolic link whatever it points
// to (its directory attribute is ignored: it is never entered); other
// reparse points (files a cloud-sync, deduplication or compression filter
// serves) are the files and directories they appear as, except an AF_UNIX
// socket. Permissions are 0666 (0444 read-only), plus 0111 for a
// directory, as Go's os package reports them.
func winEntryMode(attrs, tag uint32) fs.FileMode {
	perm := fs.FileMode(0o666)
	if attrs&winAttrReadonly != 0 {
		perm = 0o444
	}
	switch {
	case isWinLink(attrs, tag):
		return fs.ModeSymlink | perm
	case attrs&winAttrReparse != 0 && tag == winTagAFUnix:
		return fs.ModeSocket | perm
	case attrs&winAttrDirectory != 0:
		return fs.ModeDir | perm | 0o111
	}
	return perm
}

// fileFullDirInfo offsets (FILE_FULL_DIR_INFO, as GetFileInformationByHandleEx
// returns it for FileFullDirectoryInfo).
const (
	dirInfoNext       = 0  // NextEntryOffset uint32
	dirInfoNameLength = 60 // FileNameLength uint32, in bytes
	dirInfoName       = 68 // FileName [...]uint16
)

// parseDirInfo returns the names in buf, a chain of FILE_FULL_DIR_INFO
// records, leaving out "." and "..". Names are decoded as WTF-8, so a name
// that is not valid UTF-16 survives the round trip to the system (and is
// then refused by checkEntryName).
func parseDirInfo(buf []byte) ([]string, error) {
	var names []string
	for off := 0; ; {
		if off < 0 || len(buf)-off < dirInfoName {
			return nil, fmt.Errorf("directory record at %d overruns the %d-byte buffer", off, len(buf))
		}
		rec := buf[off:]
		next := int(binary.LittleEndian.Uint32(rec[dirInfoNext:]))
		n := int(binary.LittleEndian.Uint32(rec[dirInfoNameLength:]))
		if n%2 != 0 || n > len(rec)-dirInfoName || next != 0 && next < dirInfoName+n {
			return nil, fmt.Errorf("directory record at %d is malformed (name length %d, next %d)", off, n, next)
		}
		u := make([]uint16, n/2)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(rec[dirInfoName+2*i:])
		}
		if name := decodeWTF16(u); name != "." && name != ".." {
			names = append(names, name)
		}
		if next == 0 {
			return names, nil
		}
		off += next
	}
}

// decodeWTF16 decodes UTF-16 that may hold unpaired surrogates, encoding
// each of them as WTF-8 (the three bytes UTF-8 would give the code point),
// as Go's syscall package does on Windows, so that encoding the result
// again gives the same units.
func decodeWTF16(u []uint16) string {
	var b []byte
	for i := 0; i < len(u); i++ {
		r := rune(u[i])
		switch {
		case utf16.IsSurrogate(r) && r < 0xdc00 && i+1 < len(u) && 0xdc00 <= u[i+1] && u[i+1] < 0xe000:
			r = utf16.DecodeRune(r, rune(u[i+1]))
			i++
		case utf16.IsSurrogate(r):
			b = append(b, byte(0xe0|r>>12), byte(0x80|r>>6&0x3f), byte(0x80|r&0x3f))
			continue
		}
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// parseReparseTarget returns where the reparse point in buf (a
// REPARSE_DATA_BUFFER, as FSCTL_GET_REPARSE_POINT returns it) leads: the
// substitute name of a symbolic link or junction in the form os.Readlink
// gives on Windows (C:\x, \\server\share\x, \\?\Volume{...}\x, or as
// written for a relative link).
func parseReparseTarget(buf []byte) (string, error) {
	if len(buf) < 8 {
		return "", errors.New("reparse data too short")
	}
	tag := binary.LittleEndian.Uint32(buf)
	size := int(binary.LittleEndian.Uint16(buf[4:]))
	if size > len(buf)-8 {
		return "", fmt.Errorf("reparse data of %d bytes overruns the %d-byte buffer", size, len(buf))
	}
	data := buf[8 : 8+size]
	var pathStart int
	var relative bool
	switch tag {
	case winTagSymlink:
		pathStart = 12
		if len(data) >= 12 {
			relative = binary.LittleEndian.Uint32(data[8:])&winSymlinkRelFlag != 0
		}
	case winTagMountPoint:
		pathStart = 8
	default:
		return "", fmt.Errorf("a reparse point with tag %#x, not a symbolic link or junction", tag)
	}
	if len(data) < pathStart {
		return "", errors.New("reparse data too short")
	}
	off, n := int(binary.LittleEndian.Uint16(data)), int(binary.LittleEndian.Uint16(data[2:]))
	names := data[pathStart:]
	if off%2 != 0 || n%2 != 0 || off+n > len(names) {
		return "", fmt.Errorf("reparse data names %d bytes at %d of %d", n, off, len(names))
	}
	u := make([]uint16, n/2)
	for i := range u {
		u[i] = binary.LittleEndian.Uint16(names[off+2*i:])
	}
	s := decodeWTF16(u)
	if relative {
		return s, nil
	}
	return ntToDOS(s), nil
}

// ntToDOS turns an NT-namespace path a link holds into the form Windows
// programs write: \??\C:\x is C:\x, \??\UNC\srv\share is \\srv\share, and
// any other \??\ path (a volume) is \\?\....
func ntToDOS(s string) string {
	rest, ok := strings.CutPrefix(s, `\??\`)
	switch {
	case !ok:
		return s
	case isDriveSpec(rest):
		return rest
	case len(rest) >= 4 && strings.EqualFold(rest[:4], `UNC\`):
		return `\\` + rest[4:]
	}
	return `\\?\` + rest
}

// lockOffset is the byte of the host's directory lock file that stands
// for the directory with this volume serial number and file ID: every
// agent on the host maps a directory to the same byte, and two
// directories share one only by a 62-bit hash collision (which costs a
// wait, never a missed lock).
func lockOffset(volume uint64, id [16]byte) int64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], volume)
	h.Write(b[:])
	h.Write(id[:])
	return int64(h.Sum64() >> 2)
}

// winLinkReader tells whether the Windows path p is a link: dest is where
// a symbolic link or junction at p leads (as os.Readlink gives it) and
// isLink is false for anything else; err matches fs.ErrNotExist when p
// does not exist.
type winLinkReader func(p string) (dest string, isLink bool, err error)

// winMaxLinkHops bounds the links winRealPath follows, as Windows does
// (63 reparse points in one path).
const winMaxLinkHops = 63

// winRealPath is RealPath on Windows: it follows every symbolic link and
// junction in path, an absolute clean Windows path, the way Windows does
// (a relative destination is read from the directory that holds the link;
// ".." in it applies to where that directory really is), and appends the
// part after a missing component, ".." in it taken textually, as RealPath
// does. A destination that cannot be placed (a raw NT path, a
// drive-relative path) is refused.
func winRealPath(path string, readLink winLinkReader) (string, error) {
	parts, rest, err := splitWinRoot(path)
	if err != nil {
		return "", err
	}
	root, resolved := parts.root, parts.root
	queue, hops := strings.Split(rest, `\`), 0
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			resolved = winParent(resolved, root)
			continue
		}
		next := winJoin(resolved, name)
		dest, isLink, err := readLink(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return winLexical(next, root, queue), nil
		case err != nil:
			return "", err
		case !isLink:
			resolved = next
			continue
		}
		if hops++; hops > winMaxLinkHops {
			return "", fmt.Errorf("%s: more than %d links on the way", path, winMaxLinkHops)
		}
		target := strings.ReplaceAll(dest, "/", `\`)
		switch {
		case hasDevicePrefix(target) || strings.HasPrefix(target, `\\`) || isDriveSpec(target):
			p, rest, err := splitWinRoot(target)
			if err != nil {
				return "", fmt.Errorf("%s is a link to %s, which the path rules cannot follow: %w", next, dest, err)
			}
			root, resolved = p.root, p.root
			queue = append(strings.Split(rest, `\`), queue...)
		case strings.HasPrefix(target, `\`):
			resolved = root // the root of the drive or share the link is on
			queue = append(strings.Split(target, `\`), queue...)
		case WinRelativeProblem(target) != "":
			return "", fmt.Errorf("%s is a link to %s, which the path rules cannot follow: %s", next, dest, WinRelativeProblem(target))
		default:
			queue = append(strings.Split(target, `\`), queue...)
		}
	}
	return resolved, nil
}

// winLexical appends names to dir, ".." taking away the name before it
// (never the root).
func winLexical(dir, root string, names []string) string {
	for _, n := range names {
		switch n {
		case "", ".":
		case "..":
			dir = winParent(dir, root)
		default:
			dir = winJoin(dir, n)
		}
	}
	return dir
}

// winJoin joins name to dir, a Windows path ending in its root's "\" or
// in a name.
func winJoin(dir, name string) string {
	if strings.HasSuffix(dir, `\`) {
		return dir + name
	}
	return dir + `\` + name
}

// winParent is the directory above p, never above root.
func winParent(p, root string) string {
	if len(p) <= len(root) {
		return root
	}
	return p[:max(strings.LastIndexByte(p, '\\'), len(root))]
}

// CutName returns name cut to at most n bytes without splitting a UTF-8
// sequence, for the hidden files named after it.
func CutName(name string, n int) string {
	if len(name) <= n {
		return name
	}
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}
