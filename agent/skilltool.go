package agent

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// maxSkillFiles bounds the bundled files the skill tool lists.
const maxSkillFiles = 500

// skillArgs are the arguments of the skill tool.
type skillArgs struct {
	hostArg
	Name string `json:"name"`
}

// skill returns a skill's SKILL.md, whole, followed by its folder's
// absolute path and the paths of the files bundled with it.
func (t *toolbox) skill(ctx context.Context, tc *toolCall) *protocol.Result {
	var a skillArgs
	if r := decodeArgs(tc, "skill", &a); r != nil {
		return r
	}
	c := t.cfg.Skills
	s, ok := c.lookup(a.Name)
	switch {
	case a.Name == "":
		return toolFailure(tc, "name is empty; give the name of a skill (skills here: %s)", c.names())
	case !ok:
		return toolFailure(tc, "no skill %s on host %s; skills here: %s", a.Name, c.hostName(), c.names())
	case s.Problem != "":
		return toolFailure(tc, "skill %s on host %s is invalid: %s (%s)", s.Name, c.hostName(), s.Problem, s.Path)
	}
	data, err := readSkillFile(s.Path)
	if err != nil {
		return toolFailure(tc, "skill %s on host %s: %s", s.Name, c.hostName(), fsProblem(s.Path, err))
	}
	dir := filepath.Dir(s.Path)
	files, more, err := skillFiles(ctx, dir)
	if ctx.Err() != nil {
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "skill "+s.Name+": cancelled")
	}
	if err != nil {
		return toolFailure(tc, "skill %s: list its files: %s", s.Name, fsProblem(dir, err))
	}
	return toolText(tc, skillText(s.Name, dir, data, files, more))
}

// skillText lays out the skill tool's answer.
func skillText(name, dir string, data []byte, files []string, more bool) string {
	var b strings.Builder
	b.Write(data)
	if len(data) > 0 && data[len(data)-1] != '\n' {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "\n[skill %s: folder %s]\n", name, dir)
	if len(files) == 0 {
		b.WriteString("Bundled files: none\n")
		return b.String()
	}
	b.WriteString("Bundled files (paths relative to the folder; read them with the read tool):\n")
	for _, f := range files {
		b.WriteString(f)
		b.WriteByte('\n')
	}
	if more {
		fmt.Fprintf(&b, "[more files not listed: the list stops at %d]\n", maxSkillFiles)
	}
	return b.String()
}

// skillFiles returns the slash-separated paths, relative to dir, of the
// files under dir other than its SKILL.md, sorted: at most maxSkillFiles
// of them, and whether there are more. Links to regular files count as
// files; links to folders are not followed, and unreadable folders are
// skipped.
func skillFiles(ctx context.Context, dir string) (files []string, more bool, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case err != nil && path == dir:
			return err
		case err != nil && d != nil && d.IsDir():
			return fs.SkipDir
		case err != nil || d.IsDir():
			return nil
		}
		rel, _ := filepath.Rel(dir, path)
		if rel == skillFile || !isFile(path, d) {
			return nil
		}
		if len(files) == maxSkillFiles {
			more = true
			return fs.SkipAll
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	slices.Sort(files)
	return files, more, err
}

// isFile reports whether the entry d at path is a regular file or a link
// to one.
func isFile(path string, d fs.DirEntry) bool {
	if d.Type().IsRegular() {
		return true
	}
	if d.Type()&fs.ModeSymlink == 0 {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// names lists the catalog's skills for a message.
func (c *catalog) names() string {
	skills := c.list()
	if len(skills) == 0 {
		return "(none)"
	}
	names := make([]string, len(skills))
	for i, s := range skills {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

// hostName names the catalog's host for a message.
func (c *catalog) hostName() string {
	if c == nil || c.host == "" {
		return "(this host)"
	}
	return c.host
}
