package configfile

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Apply sets the flags the command line did not, refuses unknown keys by
// name and the flags that are the command line's only.
func TestApply(t *testing.T) {
	newFS := func() (*flag.FlagSet, *string, *string) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		a := fs.String("a", "defa", "")
		b := fs.String("b", "defb", "")
		fs.String("secret", "", "")
		fs.String("config", "", "")
		return fs, a, b
	}
	fs, a, b := newFS()
	if err := Apply(fs, write(t, "a: [x, y]\nb: file\n"), map[string]bool{"b": true}); err != nil {
		t.Fatal(err)
	}
	if *a != "x,y" || *b != "defb" {
		t.Errorf("a=%q b=%q: want the file's list joined, and the command line's b kept", *a, *b)
	}
	for _, tc := range []struct{ text, want string }{
		{"c: 1\n", `unknown key "c"`},
		{"secret: s\n", `"secret" is a command-line flag only`},
		{"config: other.yaml\n", `"config" is a command-line flag only`},
		{"a: [x, {y: z}]\n", "plain values"},
		{"a: &x 1\nb: *x\n", "aliases"},
	} {
		fs, _, _ := newFS()
		err := Apply(fs, write(t, tc.text), map[string]bool{}, "secret")
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "c.yaml") {
			t.Errorf("%q: err = %v, want one naming the file and %s", tc.text, err, tc.want)
		}
	}
	if _, err := Parse("big.yaml", make([]byte, MaxSize+1)); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("oversized file: %v", err)
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"listen: a\n", "cors_origins: [a, b]\n", "", "- x\n", "a: {b: c}\n", "a: &x 1\nb: *x\n", "a: b\n---\nc: d\n", "'': 1\n", "--listen: x\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		values, err := Parse("c.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "c.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for k := range values {
			if k == "" || strings.HasPrefix(k, "-") {
				t.Fatalf("key %q accepted", k)
			}
		}
	})
}
