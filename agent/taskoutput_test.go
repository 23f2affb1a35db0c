//go:build unix

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A task's command can replace its output file's name (the folder is
// the agent's, but the command runs as the agent's user): task_status
// then shows no tail rather than follow a link to the agent's
// credentials or wait forever on a named pipe.
func TestTaskTailRefusesSwappedOutput(t *testing.T) {
	tb := taskBox(t, "", nil)
	secret := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(secret, []byte("s3cret-tail\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := newGuard(nil, ownFiles{SecretFiles: []string{secret}, StateDir: tb.cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	tb.guard = g
	// A file the host policy might deny: the tail never follows a link.
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, []byte("s3cret-other\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, swap := range []struct {
		name string
		make func(out string) error
	}{
		{"link to the credentials", func(out string) error { return os.Symlink(secret, out) }},
		{"link to another file", func(out string) error { return os.Symlink(other, out) }},
		{"hard link to the credentials", func(out string) error { return os.Link(secret, out) }},
		{"named pipe", func(out string) error { return syscall.Mkfifo(out, 0o600) }},
	} {
		t.Run(swap.name, func(t *testing.T) {
			id := startTask(t, tb, "echo done", nil)
			_, v := waitTask(t, tb, id)
			if err := os.Remove(v.OutputFile); err != nil {
				t.Fatal(err)
			}
			if err := swap.make(v.OutputFile); err != nil {
				t.Fatal(err)
			}
			done := make(chan string, 1)
			go func() {
				r, _ := tbCall(t, context.Background(), tb, "task_status", map[string]any{"task_id": id})
				done <- resultTextOf(r)
			}()
			select {
			case text := <-done:
				if strings.Contains(text, "s3cret") {
					t.Errorf("task_status showed the credentials:\n%s", text)
				}
			case <-time.After(10 * time.Second):
				// Unblock the open so the test can end.
				if f, err := os.OpenFile(v.OutputFile, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatal("task_status hangs on the output file")
			}
		})
	}
}
