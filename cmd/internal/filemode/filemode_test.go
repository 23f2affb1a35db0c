//go:build unix

package filemode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "agent.nk")
	if err := os.WriteFile(key, []byte("SU..."), 0o600); err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(dir, "tls.key")
	if err := os.WriteFile(shared, []byte("key"), 0o640); err != nil {
		t.Fatal(err)
	}
	rules := []Rule{{Path: dir, Dir: true}, {Path: key, Deny: Private}, {Path: shared, Deny: NotWorld}, {Path: filepath.Join(dir, "missing"), Deny: Private}, {Path: ""}}
	if err := Check(rules...); err != nil {
		t.Fatalf("private files refused: %v", err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode
		want []string
	}{
		{key, 0o644, []string{key, "mode 0644", "anyone on this machine may read it", "chmod 0600 " + key}},
		{key, 0o640, []string{"its group may read it", "chmod 0600 " + key}},
		{shared, 0o644, []string{"anyone on this machine may read it", "chmod 0640 " + shared}},
		{shared, 0o660, []string{"others than its owner may change it", "chmod 0640 " + shared}},
		{dir, 0o777, []string{dir, "mode 0777", "others may write into it", "chmod go-w " + dir}},
		{dir, 0o720, []string{"chmod go-w " + dir}},
	} {
		if err := os.Chmod(tc.path, tc.mode); err != nil {
			t.Fatal(err)
		}
		err := Check(rules...)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s mode %04o: %v; want it to say %q", tc.path, tc.mode, err, w)
			}
		}
		restore := map[string]os.FileMode{key: 0o600, shared: 0o640, dir: 0o700}
		if err := os.Chmod(tc.path, restore[tc.path]); err != nil {
			t.Fatal(err)
		}
	}
	// A group-readable directory is the operator's choice; the modes of
	// files are refused, not of directories given as files.
	if err := os.Chmod(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := Check(rules...); err != nil {
		t.Errorf("a group-readable directory: %v", err)
	}
}
