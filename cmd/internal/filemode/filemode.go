// Package filemode refuses, when a daemon starts, the modes ssh refuses:
// a key, seed or credential others may read, and a state directory
// others may write (where they could swap the files the daemon trusts).
// Doctor commands report the same; the daemons do not run with it.
//
// It imports nothing of the module; on Windows, where modes do not say
// who may read a file, it checks nothing.
package filemode

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
)

// Rule is what a path may not allow.
type Rule struct {
	// Path is checked when it exists (a daemon makes what is missing
	// itself, private).
	Path string
	// Dir: a directory, refused when group or others may write it.
	// Otherwise a secret file, refused when its mode has any bit of
	// Deny.
	Dir  bool
	Deny fs.FileMode
}

// Private is the Deny of a file only its owner may read: a key or
// credential the daemon wrote itself.
const Private fs.FileMode = 0o077

// NotWorld is the Deny of a secret the operator provides (a TLS key,
// NATS creds), which a group of the daemon's may read: others may not
// read it, and only its owner may write it.
const NotWorld fs.FileMode = 0o027

// Check applies the rules; the error names every path refused and the
// chmod that fixes it.
func Check(rules ...Rule) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	var errs []error
	for _, r := range rules {
		if r.Path == "" {
			continue
		}
		fi, err := os.Stat(r.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		perm := fi.Mode().Perm()
		switch {
		case r.Dir && fi.IsDir() && perm&0o022 != 0:
			errs = append(errs, fmt.Errorf("%s has mode %04o: others may write into it and replace the files in it: chmod go-w %s", r.Path, perm, r.Path))
		case !r.Dir && !fi.IsDir() && perm&r.Deny != 0:
			errs = append(errs, fmt.Errorf("%s has mode %04o: %s: chmod %04o %s", r.Path, perm, who(perm&r.Deny), perm&^r.Deny, r.Path))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("refusing to start, as ssh refuses such keys (whoever read a key or credential may act with it until it is revoked):\n  %w", joinLines(errs))
}

func who(bits fs.FileMode) string {
	switch {
	case bits&0o004 != 0:
		return "anyone on this machine may read it"
	case bits&0o002 != 0:
		return "anyone on this machine may change it"
	case bits&0o040 != 0:
		return "its group may read it"
	default:
		return "others than its owner may change it"
	}
}

// joinedLines joins errors one per line.
type joinedLines []error

func (j joinedLines) Error() string {
	s := ""
	for i, e := range j {
		if i > 0 {
			s += "\n  "
		}
		s += e.Error()
	}
	return s
}

func (j joinedLines) Unwrap() []error { return j }

func joinLines(errs []error) error { return joinedLines(errs) }
