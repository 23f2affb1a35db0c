package safefs

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Locks serialise the mutations of files. Within the process each file
// has its own lock. Against other processes — another fleet agent on the
// same host, say — each file's directory is locked with flock (a byte
// range of a shared lock file on Windows), held only while a mutation
// runs in it, so that two processes cannot both pass a compare-and-swap
// check before either renames. It is safe for concurrent use.
type Locks struct {
	key   func(path string) string
	files pathLocks
	dirs  dirLocks
}

// NewLocks returns locks that tell files apart by key(path): the path as
// the system compares names (with case folded where the file system
// folds it).
func NewLocks(key func(path string) string) *Locks { return &Locks{key: key} }

// Key is the name under which Lock locks path: path with the links in its
// directory followed, as key compares it. Paths that reach one file
// through different directory links have one key.
func (l *Locks) Key(path string) string { return l.key(lockPath(path)) }

// Lock locks the files at paths, whose last elements are not symbolic
// links, for a mutation of all of them, and returns the function that
// ends it. File locks are taken first, then directory locks, each in
// sorted order, so that mutations of several files cannot deadlock, here
// or across processes. A directory that does not exist yet is not locked
// (there is nothing in it to check). A directory some other process keeps
// locked for longer than DirLockWait fails with ErrDirLocked.
func (l *Locks) Lock(paths ...string) (unlock func(), err error) {
	keys := make([]string, len(paths))
	dirs := map[string]string{} // the key of each directory: the directory
	for i, p := range paths {
		keys[i] = l.Key(p)
		dirs[filepath.Dir(keys[i])] = filepath.Dir(lockPath(p))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var undo []func()
	release := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, k := range keys {
		undo = append(undo, l.files.lock(k))
	}
	for _, k := range slices.Sorted(maps.Keys(dirs)) {
		u, err := l.dirs.lock(k, dirs[k])
		if err != nil {
			release()
			return nil, err
		}
		undo = append(undo, u)
	}
	return release, nil
}

// Held returns the number of files and directories locked or waited for.
func (l *Locks) Held() int {
	l.dirs.mu.Lock()
	dirs := len(l.dirs.m)
	l.dirs.mu.Unlock()
	return l.files.size() + dirs
}

// DirLockWait bounds how long a mutation waits for another process's lock
// on a directory.
const DirLockWait = 10 * time.Second

// ErrDirLocked reports a directory another process keeps locked.
var ErrDirLocked = errors.New("another process has held a lock on this directory for more than 10 s (another fleet agent on this host would hold it for milliseconds); nothing was changed, try again")

// dirLocks holds this agent's flock on each directory it is changing
// files in. The flock is shared by all of the agent's mutations in the
// directory (their files have their own locks) and released when the
// last of them ends.
type dirLocks struct {
	mu sync.Mutex
	m  map[string]*dirLock
}

type dirLock struct {
	ready   chan struct{} // closed once release and err are set
	release func()        // nil when there was nothing to lock
	err     error
	refs    int // guarded by dirLocks.mu
}

// lock locks dir, known as key (its pathKey), against other processes
// and returns the function that unlocks it.
func (l *dirLocks) lock(key, dir string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*dirLock{}
	}
	e := l.m[key]
	if e == nil {
		e = &dirLock{ready: make(chan struct{})}
		l.m[key] = e
		e.refs++
		l.mu.Unlock()
		e.release, e.err = flockDir(dir, DirLockWait)
		if errors.Is(e.err, fs.ErrNotExist) {
			e.release, e.err = nil, nil // nothing there to protect yet
		}
		close(e.ready)
	} else {
		e.refs++
		l.mu.Unlock()
		<-e.ready
	}
	release := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.refs--; e.refs == 0 {
			delete(l.m, key)
			if e.release != nil {
				e.release()
			}
		}
	}
	if e.err != nil {
		err := fmt.Errorf("%s: %w", dir, e.err)
		release()
		return nil, err
	}
	return release, nil
}

// lockPath is path with the links in its directory followed.
func lockPath(path string) string {
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(dir, filepath.Base(path))
	}
	return path
}

// pathLocks serialises mutations of one file. Entries exist only while
// someone holds or waits for them, so the map stays small.
type pathLocks struct {
	mu sync.Mutex
	m  map[string]*pathLock
}

type pathLock struct {
	mu   sync.Mutex
	refs int // holders plus waiters; guarded by pathLocks.mu
}

// lock locks path and returns the function that unlocks it.
func (l *pathLocks) lock(path string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*pathLock)
	}
	e := l.m[path]
	if e == nil {
		e = new(pathLock)
		l.m[path] = e
	}
	e.refs++
	l.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, path)
		}
		l.mu.Unlock()
	}
}

// size returns the number of paths locked or waited for.
func (l *pathLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
