package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// watch keeps the catalog current until ctx ends, calling changed after
// every rebuild that changed it. Where the system reports changes to the
// skill folders it waits for those; elsewhere, or if that fails, it polls
// the folders' modification times every pollEvery. It returns when ctx
// ends, with every goroutine it started stopped.
func (c *catalog) watch(ctx context.Context, changed func()) {
	if !c.pollOnly {
		err := c.watchNative(ctx, changed)
		if err == nil || ctx.Err() != nil {
			return
		}
		c.log.Warn("skills: cannot watch the skills folder for changes; polling it instead",
			"dir", c.root, "every", c.pollEvery, "err", err)
	}
	c.poll(ctx, changed)
}

// refresh rebuilds the catalog and calls changed if it changed.
func (c *catalog) refresh(changed func()) {
	if c.rescan() {
		c.log.Info("skills: catalog changed", "dir", c.root, "skills", len(c.list()))
		changed()
	}
}

// poll rebuilds the catalog whenever the fingerprint of its folders
// changes, looking every pollEvery.
func (c *catalog) poll(ctx context.Context, changed func()) {
	last := c.fingerprint()
	c.refresh(changed)
	tick := time.NewTicker(c.pollEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if fp := c.fingerprint(); fp != last {
			last = fp
			c.refresh(changed)
		}
	}
}

// fingerprint summarises what a rebuild depends on: the root's and each
// skill folder's modification time, and each SKILL.md's size and
// modification time.
func (c *catalog) fingerprint() string {
	var b strings.Builder
	fi, err := os.Stat(c.root)
	if err != nil {
		return "missing"
	}
	fmt.Fprintf(&b, "%d\n", fi.ModTime().UnixNano())
	entries, _ := os.ReadDir(c.root)
	for _, e := range entries {
		dir := filepath.Join(c.root, e.Name())
		if fi, err := os.Stat(dir); err == nil {
			fmt.Fprintf(&b, "%s %d", e.Name(), fi.ModTime().UnixNano())
		}
		if fi, err := os.Stat(filepath.Join(dir, skillFile)); err == nil {
			fmt.Fprintf(&b, " %d %d %v", fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
		}
		b.WriteByte('\n')
	}
	return b.String()
}
