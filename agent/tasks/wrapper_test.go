package tasks

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTaskWrapper: the wrapper Windows tasks run under records the exit
// status of its command in the exit file, in the format the task store
// reads, and exits with it; a command that cannot start is 127.
func TestTaskWrapper(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run as the wrapped command")
	}
	dir := t.TempDir()
	for _, tt := range []struct {
		argv []string
		code int
		out  string
	}{
		{[]string{sh, "-c", "echo out; echo err >&2; exit 7"}, 7, "out\nerr\n"},
		{[]string{sh, "-c", "true"}, 0, ""},
		{[]string{sh, "-c", "kill -9 $$"}, 137, ""},
		{[]string{filepath.Join(dir, "missing")}, 127, "fleet-agent task wrapper: "},
	} {
		exitFile := filepath.Join(dir, "exit")
		os.Remove(exitFile)
		var out bytes.Buffer
		code := runWrapped(exitFile, tt.argv, nil, &out, &out)
		if code != tt.code || !strings.HasPrefix(out.String(), tt.out) {
			t.Errorf("%q: code %d, output %q; want %d, %q", tt.argv, code, out.String(), tt.code, tt.out)
		}
		data, err := os.ReadFile(exitFile)
		if got, perr := parseExitCode(data); err != nil || perr != nil || got != tt.code {
			t.Errorf("%q: exit file %q (%v, %v), want %d", tt.argv, data, err, perr, tt.code)
		}
	}
	if names, _ := filepath.Glob(filepath.Join(dir, ".exit-*")); len(names) != 0 {
		t.Errorf("temporary files left: %v", names)
	}
	if _, ok := RunWrapper([]string{"fleet-agent", "--name", "x"}); ok {
		t.Error("RunWrapper took ordinary arguments")
	}
	if code, ok := RunWrapper([]string{"fleet-agent", WrapperFlag, "x"}); !ok || code != 2 {
		t.Errorf("RunWrapper with no command: %d %v", code, ok)
	}
}
