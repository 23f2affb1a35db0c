// Package statelock is the hold one process has on an agent's state
// directory. One agent process owns a state directory at a time: it holds
// an exclusive lock on <state_dir>/agent.lock for as long as it runs, so
// that a second agent started on the same directory (the same command run
// twice, two agents left on the default, two joins at once on a fresh
// machine) is refused with a clear error instead of writing the same
// files. fleet-agent join takes the lock before it makes a key and keeps
// it for the agent it then runs; the agent takes it at start otherwise.
//
// The lock is an flock (LockFileEx on Windows) on a descriptor opened
// close-on-exec, never through a symbolic link: the background tasks an
// agent starts, which outlive it, never hold it, and the kernel releases
// it when the process dies however it dies. The holder writes its process
// ID into the file so that whoever finds the directory locked is told who
// holds it.
//
// It is a leaf: the agent and its identity package both take the lock,
// and neither may import the other.
package statelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// FileName is the lock file in a state directory.
const FileName = "agent.lock"

// InUseError reports a state directory another process holds.
type InUseError struct {
	Dir string
	// PID is the process holding it, when it could be read (0 if not).
	PID int
}

func (e *InUseError) Error() string {
	holder := "another fleet-agent"
	if e.PID > 0 {
		holder += " (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("state directory %s is in use by %s: one agent runs (or joins) per state directory; "+
		"stop that one, or give this one its own --state_dir (a second agent on this machine also needs its own --name and credential)",
		e.Dir, holder)
}

// Lock is a state directory this process holds.
type Lock struct {
	dir  string
	once sync.Once
	f    *os.File
}

// Acquire creates dir (0700) if need be and locks it for this process
// without waiting: a directory another process holds is an *InUseError.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	f, err := openLockFile(filepath.Join(dir, FileName))
	if err != nil {
		return nil, fmt.Errorf("state directory lock: %w", err)
	}
	if err := lockFile(f); err != nil {
		pid := holderPID(f)
		f.Close()
		if errors.Is(err, errLocked) {
			return nil, &InUseError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("lock state directory %s: %w", dir, err)
	}
	// Tell whoever finds the directory locked who holds it.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{dir: dir, f: f}, nil
}

// Dir returns the state directory the lock holds.
func (l *Lock) Dir() string { return l.dir }

// Holds reports whether l is a lock on dir (the same directory, however
// the two paths are spelt).
func (l *Lock) Holds(dir string) bool {
	if filepath.Clean(l.dir) == filepath.Clean(dir) {
		return true
	}
	a, err1 := os.Stat(l.dir)
	b, err2 := os.Stat(dir)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// Release lets the directory go; later calls do nothing.
func (l *Lock) Release() { l.once.Do(func() { l.f.Close() }) }

// Holder tells whether a process holds the state directory dir, and its
// process ID when it wrote one (0 if not). It creates nothing: a
// directory without a lock file was never run from. Finding the lock
// free, it takes and drops it at once.
func Holder(dir string) (held bool, pid int, err error) {
	path := filepath.Join(dir, FileName)
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	f, err := openLockFile(path)
	if err != nil {
		return false, 0, fmt.Errorf("state directory lock: %w", err)
	}
	defer f.Close()
	if err := lockFile(f); err != nil {
		if errors.Is(err, errLocked) {
			return true, holderPID(f), nil
		}
		return false, 0, fmt.Errorf("state directory lock %s: %w", path, err)
	}
	return false, 0, nil
}

// holderPID reads the process ID the lock's holder wrote; 0 if none.
func holderPID(f *os.File) int {
	buf := make([]byte, 32)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
