package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"

	"github.com/fleetmcp/fleetmcp/protocol"
)

var skillPushCmd = &command{
	group: "skills", name: "push", args: "DIR",
	summary: "push a skill folder (SKILL.md and its files) as a new version; prints its bundle id",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		name := fs.String("name", "", "the skill's name (default: the folder's name); SKILL.md's name must be the same")
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 1); err != nil {
				return err
			}
			req, m, err := readSkillDir(args[0], *name)
			if err != nil {
				return err
			}
			var resp protocol.SkillPushResponse
			if printed, err := c.ask(ctx, http.MethodPost, protocol.AdminSkillsPath, req, &resp); err != nil || printed {
				return err
			}
			if resp.BundleID != m.BundleID() {
				return fmt.Errorf("the gateway stored the push as %s, but the folder's bundle id is %s: is fleetctl as new as the gateway?", resp.BundleID, m.BundleID())
			}
			what := "a new version"
			if !resp.Created {
				what = "already pushed (the same files): the same version, pushed " + formatTime(resp.PushedAt)
			}
			fmt.Fprintf(c.stdout, "Skill %s: %s (%d files, %d bytes), %s.\n", resp.Skill, resp.BundleID, resp.Files, resp.Bytes, what)
			fmt.Fprintf(c.stdout, "Roll it out with: fleetctl skills rollout %s --selector SELECTOR\n", resp.Skill)
			return nil
		}
	},
}

// readSkillDir reads a skill folder into a push request, checking it as
// the gateway and the agents will: regular files only (no links,
// devices or pipes), paths a bundle may hold, within the limits. It
// returns the bundle's manifest too, so the answer can be checked.
func readSkillDir(dir, name string) (*protocol.SkillPushRequest, *protocol.Manifest, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("skill folder: %w", err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("skill folder %s is not a folder: give the folder that holds SKILL.md", dir)
	}
	// The folder named may be a link to it (links inside it are refused).
	if dir, err = filepath.EvalSymlinks(dir); err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("skill folder: %w", err)
	}
	if name == "" {
		name = filepath.Base(dir)
	}
	if err := protocol.ValidateSkillName(name); err != nil {
		return nil, nil, usagef("skill name %q (the folder's name, or --name): %v", name, err)
	}
	paths, err := listSkillFiles(dir)
	if err != nil {
		return nil, nil, err
	}
	req := &protocol.SkillPushRequest{Name: name}
	m := &protocol.Manifest{Name: name}
	var total int64
	for _, rel := range paths {
		data, mode, err := readBundleFile(filepath.Join(dir, filepath.FromSlash(rel)), protocol.MaxBundleBytes-total)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", rel, err)
		}
		total += int64(len(data))
		sum := sha256.Sum256(data)
		req.Files = append(req.Files, protocol.SkillPushFile{Path: rel, Mode: mode, Data: data})
		m.Files = append(m.Files, protocol.BundleFile{Path: rel, Size: int64(len(data)), Mode: mode, SHA256: hex.EncodeToString(sum[:])})
	}
	if err := m.Validate(); err != nil {
		return nil, nil, fmt.Errorf("skill folder %s: %w", dir, err)
	}
	return req, m, nil
}

// listSkillFiles returns the slash-separated paths of the regular files
// under dir, sorted, and refuses anything else but folders.
func listSkillFiles(dir string) ([]string, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if err := protocol.CheckBundlePath(rel); err != nil {
			return err
		}
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			return fmt.Errorf("%s is a link; a skill bundle holds regular files only: copy the file into the folder", rel)
		case !t.IsRegular():
			return fmt.Errorf("%s is a %s, not a regular file; a skill bundle holds regular files only", rel, fileKind(t))
		}
		if len(paths) == protocol.MaxBundleFiles {
			return fmt.Errorf("the folder holds more than %d files, the limit of a bundle", protocol.MaxBundleFiles)
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("skill folder %s: %w", dir, err)
	}
	sort.Strings(paths)
	return paths, nil
}

func fileKind(t fs.FileMode) string {
	switch {
	case t&fs.ModeNamedPipe != 0:
		return "named pipe"
	case t&fs.ModeSocket != 0:
		return "socket"
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// readBundleFile reads a regular file of at most limit bytes, and says
// its bundle mode: 0755 for a script (it starts with "#!"), else 0644. The file
// opened must be the one listed (not swapped for a link or a pipe since).
func readBundleFile(path string, limit int64) ([]byte, uint32, error) {
	before, err := os.Lstat(path)
	if err != nil {
		return nil, 0, err
	}
	if !before.Mode().IsRegular() {
		return nil, 0, errors.New("changed while being read: no longer a regular file")
	}
	if before.Size() > limit {
		return nil, 0, fmt.Errorf("too large: the bundle would be over %d MiB", protocol.MaxBundleBytes>>20)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	after, err := f.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !os.SameFile(before, after) {
		return nil, 0, errors.New("changed while being read: replaced by another file")
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, 0, err
	}
	if int64(len(data)) > limit {
		return nil, 0, fmt.Errorf("too large: the bundle would be over %d MiB", protocol.MaxBundleBytes>>20)
	}
	// The rule skill_push applies, so that a folder is the same version
	// whichever way it is pushed.
	mode := uint32(0o644)
	if bytes.HasPrefix(data, []byte("#!")) {
		mode = 0o755
	}
	return data, mode, nil
}
