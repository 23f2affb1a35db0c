package safefs

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"
)

// These tests run the Windows file layer's decisions (winfs.go) on every
// system: the system calls around them run only on Windows.

func TestSplitWinPath(t *testing.T) {
	for _, tt := range []struct {
		in, root, nt string
		names        []string
	}{
		{`C:\Users\bob\a.txt`, `C:\`, `\??\C:\`, []string{"Users", "bob", "a.txt"}},
		{`c:/users//bob/`, `C:\`, `\??\C:\`, []string{"users", "bob"}},
		{`C:\`, `C:\`, `\??\C:\`, nil},
		{`\\srv\share\docs\x`, `\\srv\share\`, `\??\UNC\srv\share\`, []string{"docs", "x"}},
		{`\\srv\share`, `\\srv\share\`, `\??\UNC\srv\share\`, nil},
		{`//srv/c$/x`, `\\srv\c$\`, `\??\UNC\srv\c$\`, []string{"x"}},
		{`\\?\C:\Windows`, `\\?\C:\`, `\??\C:\`, []string{"Windows"}},
		{`\\.\d:\x`, `\\?\D:\`, `\??\D:\`, []string{"x"}},
		{`\??\C:\x`, `\\?\C:\`, `\??\C:\`, []string{"x"}},
		{`\\?\C:`, `\\?\C:\`, `\??\C:\`, nil},
		{`\\?\unc\srv\share\x`, `\\?\UNC\srv\share\`, `\??\UNC\srv\share\`, []string{"x"}},
		{`\\?\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\data`, `\\?\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\`,
			`\??\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\`, []string{"data"}},
	} {
		w, err := splitWinPath(tt.in)
		if err != nil {
			t.Errorf("splitWinPath(%q): %v", tt.in, err)
			continue
		}
		if w.root != tt.root || w.ntRoot != tt.nt || !slices.Equal(w.names, tt.names) {
			t.Errorf("splitWinPath(%q) = %q %q %q, want %q %q %q", tt.in, w.root, w.ntRoot, w.names, tt.root, tt.nt, tt.names)
		}
	}
	for in, why := range map[string]string{
		`relative\x`:              "not an absolute Windows path",
		`\rooted`:                 "has no drive",
		`C:relative`:              "without a separator",
		`C:`:                      "without a separator",
		`\\server`:                "server and a share",
		`\\server\`:               "server and a share",
		`\\srv\sh*re\x`:           "server and a share",
		`\\.\pipe\name`:           "names no drive, share or volume",
		`\\.\PhysicalDrive0`:      "names no drive, share or volume",
		`\\?\GLOBALROOT\Device\x`: "names no drive, share or volume",
		`\\?\Volume{0a1b2c3d}\x`:  "names no drive, share or volume",
		`\\?\UNC\srv`:             "server and a share",
		`C:\a\..\b`:               "not a clean path",
		`C:\a\.\b`:                "not a clean path",
	} {
		if w, err := splitWinPath(in); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("splitWinPath(%q) = %+v, %v; want an error saying %q", in, w, err, why)
		}
	}
}

func TestWinRelativeProblem(t *testing.T) {
	for _, p := range []string{`\x`, `/x`, `\`, `C:x`, `c:`, `D:..\x`} {
		if WinRelativeProblem(p) == "" {
			t.Errorf("WinRelativeProblem(%q) = \"\", want a problem", p)
		}
	}
	for _, p := range []string{`C:\x`, `c:/x`, `\\srv\share\x`, `//srv/share`, `\\?\C:\x`, `\??\C:\x`, `x`, `.\x`, `..\x`, `~\x`} {
		if msg := WinRelativeProblem(p); msg != "" {
			t.Errorf("WinRelativeProblem(%q) = %q, want none", p, msg)
		}
	}
}

// TestCheckEntryName: the layer opens names exactly as the directory
// holds them, so it refuses every name Windows programs read differently:
// a stream would reach hidden data, "nul" or "x." a file no other program
// can open.
func TestCheckEntryName(t *testing.T) {
	for _, name := range []string{"a.txt", ".hidden", "Ünïcode ✓", "a b", "console.txt", "nul-ish", "x.tmp-123", strings.Repeat("é", 255)} {
		if err := checkEntryName(name); err != nil {
			t.Errorf("checkEntryName(%q): %v", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", `a\b`, "a/b", "a.txt:stream", "a.txt::$DATA", "x.", "x ", "NUL", "nul.txt", "COM1",
		"CONOUT$", "a*b", "a?b", `a"b`, "a<b", "a>b", "a|b", "a\x00b", "a\x1fb", "\xed\xa0\x80", strings.Repeat("a", 256),
		strings.Repeat("𝄞", 128)} { // 256 UTF-16 units
		if err := checkEntryName(name); err == nil {
			t.Errorf("checkEntryName(%q) = nil, want a refusal", name)
		}
	}
}

func TestWinEntryMode(t *testing.T) {
	const cloudTag, dedupTag = 0x9000001A, 0x80000013
	for _, tt := range []struct {
		attrs, tag uint32
		want       fs.FileMode
	}{
		{0x20, 0, 0o666},                                            // archive: a plain file
		{winAttrReadonly, 0, 0o444},                                 // read-only
		{winAttrDirectory, 0, fs.ModeDir | 0o777},                   // a directory
		{winAttrDirectory | winAttrReadonly, 0, fs.ModeDir | 0o555}, // Explorer marks customised folders so
		{winAttrReparse, winTagSymlink, fs.ModeSymlink | 0o666},
		{winAttrReparse | winAttrDirectory, winTagSymlink, fs.ModeSymlink | 0o666},    // a directory symbolic link is a link
		{winAttrReparse | winAttrDirectory, winTagMountPoint, fs.ModeSymlink | 0o666}, // so is a junction
		{winAttrReparse | winAttrDirectory, 0xA000001D, fs.ModeSymlink | 0o666},       // and any other name surrogate (WSL links)
		{winAttrReparse, winTagAFUnix, fs.ModeSocket | 0o666},
		{winAttrReparse, cloudTag, 0o666},                                 // a cloud file is a file
		{winAttrReparse | winAttrDirectory, cloudTag, fs.ModeDir | 0o777}, // a cloud folder a folder
		{winAttrReparse, dedupTag, 0o666},
		{0, winTagSymlink, 0o666}, // a tag without the reparse attribute means nothing
	} {
		if got := winEntryMode(tt.attrs, tt.tag); got != tt.want {
			t.Errorf("winEntryMode(%#x, %#x) = %v, want %v", tt.attrs, tt.tag, got, tt.want)
		}
	}
}

// dirRecord encodes one FILE_FULL_DIR_INFO record; next 0 ends the chain.
func dirRecord(name []uint16, next int) []byte {
	b := make([]byte, max(dirInfoName+2*len(name), next))
	binary.LittleEndian.PutUint32(b[dirInfoNext:], uint32(next))
	binary.LittleEndian.PutUint32(b[dirInfoNameLength:], uint32(2*len(name)))
	for i, u := range name {
		binary.LittleEndian.PutUint16(b[dirInfoName+2*i:], u)
	}
	return b
}

// dirRecords encodes names as a chain of records, each aligned to 8 bytes
// as the kernel lays them out.
func dirRecords(names ...[]uint16) []byte {
	var buf []byte
	for i, n := range names {
		next := 0
		if i < len(names)-1 {
			next = (dirInfoName + 2*len(n) + 7) &^ 7
		}
		buf = append(buf, dirRecord(n, next)...)
	}
	return append(buf, make([]byte, 64)...) // the rest of the buffer
}

func TestParseDirInfo(t *testing.T) {
	u := func(s string) []uint16 { return utf16.Encode([]rune(s)) }
	buf := dirRecords(u("."), u(".."), u("a.txt"), u("Ünï ✓"), u("𝄞 music"), []uint16{'x', 0xd800, 'y'}, u("last"))
	got, err := parseDirInfo(buf)
	want := []string{"a.txt", "Ünï ✓", "𝄞 music", "x\xed\xa0\x80y", "last"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("parseDirInfo = %q, %v; want %q", got, err, want)
	}
	if checkEntryName(got[3]) == nil {
		t.Errorf("a name that is not UTF-16 (%q) passes checkEntryName", got[3])
	}
	bad := map[string][]byte{
		"short":         make([]byte, dirInfoName-1),
		"name overruns": dirRecord(u("abc"), 0)[:dirInfoName+4],
		"odd length":    func() []byte { b := dirRecord(u("abc"), 0); b[dirInfoNameLength] = 5; return b }(),
		"next overlaps": dirRecord(u("abcdef"), dirInfoName+2),
		"next overruns": append(dirRecord(u("a"), 4096), make([]byte, 8)...)[:dirInfoName+8],
	}
	for what, b := range bad {
		if names, err := parseDirInfo(b); err == nil {
			t.Errorf("%s: parseDirInfo = %q, want an error", what, names)
		}
	}
}

func FuzzParseDirInfo(f *testing.F) {
	f.Add(dirRecords([]uint16{'a'}, []uint16{'.'}, []uint16{0xdc00}))
	f.Add(dirRecord([]uint16{'x', 'y'}, 0))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, buf []byte) {
		names, err := parseDirInfo(buf)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "." || n == ".." {
				t.Errorf("parseDirInfo returned %q", n)
			}
			if 3*len(buf) < len(n) {
				t.Errorf("name %q is longer than its buffer could hold", n)
			}
		}
	})
}

func TestDecodeWTF16(t *testing.T) {
	for _, tt := range []struct {
		in   []uint16
		want string
	}{
		{utf16.Encode([]rune("plain ✓ 𝄞")), "plain ✓ 𝄞"},
		{[]uint16{0xd800}, "\xed\xa0\x80"},
		{[]uint16{0xdc00, 'a'}, "\xed\xb0\x80a"},
		{[]uint16{0xdbff, 0xdfff}, "\U0010ffff"},
		{[]uint16{0xd800, 0xd800, 0xdc00}, "\xed\xa0\x80𐀀"},
		{nil, ""},
	} {
		if got := decodeWTF16(tt.in); got != tt.want {
			t.Errorf("decodeWTF16(%x) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// reparse encodes a REPARSE_DATA_BUFFER for tag with substitute name sub
// and print name print.
func reparse(tag uint32, sub, print string, flags uint32) []byte {
	s, p := utf16.Encode([]rune(sub)), utf16.Encode([]rune(print))
	var data []byte
	le := binary.LittleEndian
	data = le.AppendUint16(data, 0)
	data = le.AppendUint16(data, uint16(2*len(s)))
	data = le.AppendUint16(data, uint16(2*len(s)))
	data = le.AppendUint16(data, uint16(2*len(p)))
	if tag == winTagSymlink {
		data = le.AppendUint32(data, flags)
	}
	for _, u := range append(s, p...) {
		data = le.AppendUint16(data, u)
	}
	buf := le.AppendUint32(nil, tag)
	buf = le.AppendUint16(buf, uint16(len(data)))
	buf = le.AppendUint16(buf, 0)
	return append(buf, data...)
}

func TestParseReparseTarget(t *testing.T) {
	for _, tt := range []struct {
		buf  []byte
		want string
	}{
		{reparse(winTagSymlink, `\??\C:\secret\x`, `C:\secret\x`, 0), `C:\secret\x`},
		{reparse(winTagSymlink, `..\other`, `..\other`, winSymlinkRelFlag), `..\other`},
		{reparse(winTagSymlink, `\??\UNC\srv\share\d`, `\\srv\share\d`, 0), `\\srv\share\d`},
		{reparse(winTagMountPoint, `\??\D:\data\`, `D:\data\`, 0), `D:\data\`},
		{reparse(winTagMountPoint, `\??\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\`, ``, 0), `\\?\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\`},
		{reparse(winTagSymlink, `\Device\HarddiskVolume2\x`, `x`, 0), `\Device\HarddiskVolume2\x`},
	} {
		if got, err := parseReparseTarget(tt.buf); err != nil || got != tt.want {
			t.Errorf("parseReparseTarget(%q) = %q, %v; want %q", tt.buf, got, err, tt.want)
		}
	}
	good := reparse(winTagSymlink, `\??\C:\x`, `C:\x`, 0)
	for what, b := range map[string][]byte{
		"empty":           nil,
		"other tag":       reparse(0x9000001A, `x`, `x`, 0),
		"cut":             good[:len(good)-2],
		"header only":     good[:8],
		"name overruns":   func() []byte { b := slices.Clone(good); b[10] = 200; return b }(),
		"odd name length": func() []byte { b := slices.Clone(good); b[10] = 3; return b }(),
	} {
		if got, err := parseReparseTarget(b); err == nil {
			t.Errorf("%s: parseReparseTarget = %q, want an error", what, got)
		}
	}
}

func FuzzParseReparseTarget(f *testing.F) {
	f.Add(reparse(winTagSymlink, `\??\C:\x`, `C:\x`, 0))
	f.Add(reparse(winTagSymlink, `a\b`, `a\b`, winSymlinkRelFlag))
	f.Add(reparse(winTagMountPoint, `\??\Volume{x}\`, ``, 0))
	f.Fuzz(func(t *testing.T, buf []byte) {
		got, err := parseReparseTarget(buf)
		if err == nil && len(got) > 3*len(buf) {
			t.Errorf("target %q is longer than its buffer could hold", got)
		}
	})
}

func TestLockOffset(t *testing.T) {
	seen := map[int64]bool{}
	for vol := range uint64(4) {
		for i := range 256 {
			var id [16]byte
			id[i%16] = byte(i)
			id[15] ^= byte(i / 16)
			off := lockOffset(vol, id)
			if off < 0 || off >= 1<<62 {
				t.Fatalf("lockOffset(%d, %x) = %d, outside [0, 2^62)", vol, id, off)
			}
			if off != lockOffset(vol, id) {
				t.Fatal("lockOffset is not deterministic")
			}
			seen[off] = true
		}
	}
	if len(seen) < 4*241 { // the ids above repeat a few times
		t.Errorf("only %d distinct offsets", len(seen))
	}
}

// fakeWinFS is a Windows file tree for winRealPath: links maps a path
// (upper case) to its destination, dirs lists the directories and files
// that exist; the roots always do.
type fakeWinFS struct {
	links map[string]string
	exist map[string]bool
	reads int
}

func (f *fakeWinFS) readLink(p string) (string, bool, error) {
	f.reads++
	k := strings.ToUpper(p)
	if d, ok := strings.CutPrefix(k, `\\?\`); ok && isDriveSpec(d) {
		k = d // the device form of a drive path names the same file
	}
	if d, ok := f.links[k]; ok {
		return d, true, nil
	}
	if f.exist[k] {
		return "", false, nil
	}
	if strings.Contains(k, "BROKEN") {
		return "", false, errors.New("access denied")
	}
	return "", false, fs.ErrNotExist
}

func TestWinRealPath(t *testing.T) {
	vol := `\\?\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\`
	f := &fakeWinFS{links: map[string]string{
		`C:\WORK\J`:           `C:\secret`,       // a junction
		`C:\SECRET\UP`:        `..\top`,          // relative, read from where the link really is
		`C:\WORK\REL`:         `sub\..\..\other`, // relative with ".." after a directory
		`C:\WORK\ROOTED`:      `\rooted\x`,       // the root of the link's drive
		`\\SRV\SHARE\R`:       `\top`,            // the root of the link's share
		`C:\WORK\UNC`:         `\\srv\share\d`,
		`C:\WORK\MNT`:         vol,
		`C:\WORK\LOOP`:        `loop2`,
		`C:\WORK\LOOP2`:       `loop`,
		`C:\WORK\CHAIN`:       `j\up`,
		`C:\WORK\DRIVEREL`:    `D:x`,
		`C:\WORK\RAW`:         `\??\pipe\x`,
		`C:\WORK\DEV`:         `\\?\C:\dev\x`,
		`C:\WORK\FWD`:         `C:/fwd/slashes`,
		`C:\WORK\INTOMISSING`: `nothere\..\..\esc`,
	}, exist: map[string]bool{}}
	for _, p := range []string{`C:\WORK`, `C:\WORK\SUB`, `C:\SECRET`, `C:\TOP`, `C:\ROOTED`, `C:\ROOTED\X`, `\\SRV\SHARE\TOP`,
		`\\SRV\SHARE\D`, vol[:len(vol)-1], `C:\OTHER`, `C:\SECRET\F`, `C:\FWD`, `C:\FWD\SLASHES`} {
		f.exist[strings.ToUpper(p)] = true
	}
	for in, want := range map[string]string{
		`C:\work\sub\file`:           `C:\work\sub\file`,
		`c:\work`:                    `C:\work`,
		`C:\work\j\f`:                `C:\secret\f`,
		`C:\work\j\up\new.txt`:       `C:\top\new.txt`,
		`C:\work\chain`:              `C:\top`,
		`C:\work\rel`:                `C:\other`,
		`C:\work\rooted`:             `C:\rooted\x`,
		`\\srv\share\r\f`:            `\\srv\share\top\f`,
		`C:\work\unc\f`:              `\\srv\share\d\f`,
		`C:\work\mnt\data`:           vol + `data`,
		`C:\work\dev`:                `\\?\C:\dev\x`,
		`C:\work\fwd`:                `C:\fwd\slashes`,
		`C:\work\intomissing`:        `C:\esc`,
		`C:\missing\a\b`:             `C:\missing\a\b`,
		`\\?\C:\work\j\f`:            `C:\secret\f`,
		`C:\work\j\up\..\..\..\..\x`: `C:\x`,
	} {
		got, err := winRealPath(in, f.readLink)
		if err != nil || got != want {
			t.Errorf("winRealPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		`C:\work\loop`:     "more than 63 links",
		`C:\work\driverel`: "cannot follow",
		`C:\work\raw\x`:    "cannot follow",
		`C:\broken\x`:      "access denied",
		`\x`:               "has no drive",
	} {
		if got, err := winRealPath(in, f.readLink); err == nil || !strings.Contains(err.Error(), why) {
			t.Errorf("winRealPath(%q) = %q, %v; want an error saying %q", in, got, err, why)
		}
	}
}

// TestReadWinLink runs RealPath's link reader for Windows on this
// system's links.
func TestReadWinLink(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "l")
	if err := os.Symlink("f", link); err != nil {
		t.Skip("no symbolic links here:", err)
	}
	if dest, ok, err := readWinLink(link); err != nil || !ok || dest != "f" {
		t.Errorf("readWinLink(link) = %q, %v, %v", dest, ok, err)
	}
	if _, ok, err := readWinLink(file); err != nil || ok {
		t.Errorf("readWinLink(file) = %v, %v", ok, err)
	}
	if _, _, err := readWinLink(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("readWinLink(missing): %v", err)
	}
}

// TestTempNamesStayNames: the hidden names made after a long name are
// cut without splitting a character, so that they are names Windows can
// hold (and valid UTF-8 everywhere).
func TestTempNamesStayNames(t *testing.T) {
	long := strings.Repeat("a", 99) + "ééé.txt"
	if n := tempName(long); !utf8.ValidString(n) || checkEntryName(n) != nil {
		t.Errorf("hidden name %q: valid UTF-8 %v, %v", n, utf8.ValidString(n), checkEntryName(n))
	}
	if got := CutName("ab€", 3); got != "ab" {
		t.Errorf(`CutName("ab€", 3) = %q`, got)
	}
	if got := CutName("abc", 3); got != "abc" {
		t.Errorf(`CutName("abc", 3) = %q`, got)
	}
}

func FuzzSplitWinPath(f *testing.F) {
	for _, s := range []string{`C:\a\b`, `\\srv\share\x`, `\\?\UNC\s\h\x`, `\\?\Volume{0a1b2c3d-0000-1111-2222-33334444aaaa}\d`, `\\.\pipe\x`, `C:x`, `C:\a\..\b`, "C:\\\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		w, err := splitWinPath(p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(w.ntRoot, `\??\`) || !strings.HasSuffix(w.root, `\`) || !strings.HasSuffix(w.ntRoot, `\`) {
			t.Fatalf("splitWinPath(%q): roots %q, %q", p, w.root, w.ntRoot)
		}
		for _, n := range w.names {
			if n == "" || n == "." || n == ".." || strings.ContainsAny(n, `\/`) {
				t.Fatalf("splitWinPath(%q): name %q", p, n)
			}
		}
		again, err := splitWinPath(w.root + strings.Join(w.names, `\`))
		if err != nil || again.root != w.root || again.ntRoot != w.ntRoot || !slices.Equal(again.names, w.names) {
			t.Fatalf("splitWinPath(%q) = %+v, but its parts joined split to %+v, %v", p, w, again, err)
		}
	})
}
