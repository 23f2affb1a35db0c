package confine

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
)

// Access is what a rule lets commands do beneath a path.
type Access int

const (
	// List lets commands list the directory's names and nothing else:
	// the right of the directories on the way to a protected path.
	List Access = iota + 1
	// ReadFile lets commands read one file (never a directory).
	ReadFile
	// ReadExec lets commands read, list and execute, never change.
	ReadExec
	// Full lets commands do anything the kernel can restrict.
	Full
)

func (a Access) String() string {
	switch a {
	case List:
		return "list"
	case ReadFile:
		return "read-file"
	case ReadExec:
		return "read-exec"
	case Full:
		return "full"
	}
	return fmt.Sprintf("access(%d)", int(a))
}

// Rule grants Access beneath Path, a directory or (Dir false) a file.
type Rule struct {
	Path   string
	Access Access
	Dir    bool
}

// Paths are what a plan keeps commands from.
type Paths struct {
	// Protected are files and directories commands may neither read nor
	// write, nor anything in them.
	Protected []string
	// ReadOnly are files and directories commands may read and run but
	// not change; one may lie inside a protected directory (the rest of
	// that directory stays out of reach).
	ReadOnly []string
	// ReadFiles are single files commands may read, typically files the
	// agent writes for one command inside a protected directory.
	ReadFiles []string
}

type mark int

const (
	markProtected mark = iota + 1
	markReadOnly
)

// Plan returns the rules that keep commands out of p.Protected and from
// changing p.ReadOnly while leaving them everything else: List on every
// directory above a protected or read-only path, and on each other entry
// of those directories Full, ReadExec (inside a read-only path) or
// nothing (inside a protected one). Paths are made absolute and their
// symbolic links resolved (a path that does not exist yet is protected
// by name: its parent grants only List, so it stays out of reach when it
// is created). Entries are listed now: one made later in a directory
// above a protected path is out of reach for commands started before it
// existed.
func Plan(p Paths) ([]Rule, error) {
	marks := map[string]mark{}
	for _, set := range []struct {
		paths []string
		m     mark
	}{{p.Protected, markProtected}, {p.ReadOnly, markReadOnly}} {
		for _, path := range set.paths {
			r, err := resolve(path)
			if err != nil {
				return nil, err
			}
			// Protected wins over read-only for the same path.
			if old, ok := marks[r]; !ok || old == markReadOnly {
				marks[r] = set.m
			}
		}
	}
	if len(marks) == 0 {
		return []Rule{{Path: string(filepath.Separator), Access: Full, Dir: true}}, nil
	}
	ancestors := map[string]bool{}
	for path := range marks {
		for a := filepath.Dir(path); ; a = filepath.Dir(a) {
			ancestors[a] = true
			if a == filepath.Dir(a) {
				break
			}
		}
	}
	var rules []Rule
	for _, a := range slices.Sorted(maps.Keys(ancestors)) {
		rules = append(rules, Rule{Path: a, Access: List, Dir: true})
		entries, err := os.ReadDir(a)
		if err != nil {
			// A directory the agent's user may not list (mode 0711)
			// gives its entries no rule: commands lose what they could
			// only reach by knowing its names, and gain nothing.
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				continue
			}
			return nil, fmt.Errorf("confine: list %s: %w", a, err)
		}
		for _, e := range entries {
			child := filepath.Join(a, e.Name())
			if ancestors[child] {
				continue
			}
			if r, ok := childRule(child, e, modeOf(child, marks)); ok {
				rules = append(rules, r)
			}
		}
	}
	files, err := readFileRules(p.ReadFiles)
	if err != nil {
		return nil, err
	}
	return append(rules, files...), nil
}

// childRule is the rule of an entry of a directory above a marked path,
// under mode m (0: no mark above it).
func childRule(path string, e fs.DirEntry, m mark) (Rule, bool) {
	access := Full
	switch m {
	case markProtected:
		return Rule{}, false
	case markReadOnly:
		access = ReadExec
	}
	// The kernel puts a rule on the inode a path leads to, following a
	// symbolic link: a link here could lead into a protected directory.
	// It gets no rule; what it leads to has its own.
	if e.Type()&fs.ModeSymlink != 0 {
		return Rule{}, false
	}
	// Devices, pipes and sockets take file rights, as files do.
	return Rule{Path: path, Access: access, Dir: e.IsDir()}, true
}

// readFileRules returns ReadFile rules for files, which must be regular
// files, named by their resolved paths.
func readFileRules(files []string) ([]Rule, error) {
	var rules []Rule
	for _, f := range files {
		r, err := resolve(f)
		if err != nil {
			return nil, err
		}
		fi, err := os.Stat(r)
		if err != nil {
			return nil, fmt.Errorf("confine: a file commands may read: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("confine: %s is not a regular file; only files can be granted one by one", r)
		}
		rules = append(rules, Rule{Path: r, Access: ReadFile})
	}
	return rules, nil
}

// modeOf returns the mark of the closest marked path at or above path.
func modeOf(path string, marks map[string]mark) mark {
	for p := path; ; p = filepath.Dir(p) {
		if m, ok := marks[p]; ok {
			return m
		}
		if p == filepath.Dir(p) {
			return 0
		}
	}
}

// resolve returns path absolute, clean and with the symbolic links of
// its longest existing prefix resolved.
func resolve(path string) (string, error) {
	if path == "" {
		return "", errors.New("confine: empty path; give an absolute path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("confine: %s: %w", path, err)
	}
	var rest []string
	for p := abs; ; p = filepath.Dir(p) {
		r, err := filepath.EvalSymlinks(p)
		if err == nil {
			slices.Reverse(rest)
			return filepath.Join(append([]string{r}, rest...)...), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("confine: resolve %s: %w", path, err)
		}
		if p == filepath.Dir(p) {
			return abs, nil
		}
		rest = append(rest, filepath.Base(p))
	}
}
