package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// skillEvents are the inotify events that can change the catalog.
const skillEvents = unix.IN_CREATE | unix.IN_DELETE | unix.IN_MODIFY | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// watchNative watches the root and each skill folder with inotify,
// rebuilding the catalog debounce after a burst of events. A missing root
// is looked for every pollEvery. It returns nil when ctx ends and an
// error if inotify cannot be used.
func (c *catalog) watchNative(ctx context.Context, changed func()) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	// A non-blocking descriptor goes through the runtime's poller, so
	// closing the file ends a pending read.
	f := os.NewFile(uintptr(fd), "inotify")
	w := &inotifyWatch{fd: fd, wds: make(map[string]int)}
	events, readErr := make(chan struct{}, 1), make(chan error, 1)
	var reader sync.WaitGroup
	reader.Go(func() { readErr <- readInotify(f, events) })
	defer func() {
		f.Close()
		reader.Wait()
	}()
	if err := w.sync(c); err != nil {
		return err
	}
	c.refresh(changed)
	return c.inotifyLoop(ctx, w, events, readErr, changed)
}

// inotifyLoop rebuilds the catalog after events until ctx ends.
func (c *catalog) inotifyLoop(ctx context.Context, w *inotifyWatch, events <-chan struct{}, readErr <-chan error, changed func()) error {
	tick := time.NewTicker(c.pollEvery)
	defer tick.Stop()
	var settle <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-readErr:
			return fmt.Errorf("inotify: %w", err)
		case <-events:
			if settle == nil {
				settle = time.After(c.debounce)
			}
			continue
		case <-settle:
			settle = nil
		case <-tick.C:
			if w.watching(c.root) {
				continue
			}
		}
		if err := w.sync(c); err != nil {
			return err
		}
		c.refresh(changed)
	}
}

// readInotify reads events from f until it fails, signalling events for
// each batch read.
func readInotify(f *os.File, events chan<- struct{}) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return err
		}
		if n > 0 {
			select {
			case events <- struct{}{}:
			default: // a rebuild is already due
			}
		}
	}
}

// inotifyWatch is the set of folders watched; only the watching goroutine
// uses it.
type inotifyWatch struct {
	fd  int
	wds map[string]int // watch descriptors by path
}

func (w *inotifyWatch) watching(path string) bool {
	_, ok := w.wds[path]
	return ok
}

// sync watches the root and each skill folder the policy allows, and
// stops watching folders that are gone. It fails only when inotify
// cannot watch what is there (such as when the watch limit is reached).
func (w *inotifyWatch) sync(c *catalog) error {
	want := make(map[string]bool)
	if fi, err := os.Stat(c.root); err == nil && fi.IsDir() {
		want[c.root] = true
		entries, _ := os.ReadDir(c.root)
		for _, e := range entries {
			dir := filepath.Join(c.root, e.Name())
			if fi, err := os.Stat(dir); err == nil && fi.IsDir() && c.allows(e.Name()) {
				want[dir] = true
			}
		}
	}
	for path, wd := range w.wds {
		if !want[path] {
			_, _ = unix.InotifyRmWatch(w.fd, uint32(wd)) // fails if already gone
			delete(w.wds, path)
		}
	}
	for path := range want {
		wd, err := unix.InotifyAddWatch(w.fd, path, skillEvents)
		switch {
		case err == nil:
			w.wds[path] = wd
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			// Gone since it was listed: the events say so.
		default:
			return fmt.Errorf("inotify watch %s: %w", path, err)
		}
	}
	return nil
}
