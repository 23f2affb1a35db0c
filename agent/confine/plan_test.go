package confine

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tree makes a small file tree in a temporary directory and returns its
// resolved root:
//
//	state/identity/agent.nk, state/skills/s1/run.sh, state/tasks/
//	ws/a.txt, ws/skills/s2/run.sh, other.txt, link -> state
func tree(t *testing.T) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state/identity/agent.nk", "state/skills/s1/run.sh", "ws/a.txt", "ws/skills/s2/run.sh", "other.txt"} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "state", "tasks"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("state", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	return root
}

func TestPlan(t *testing.T) {
	cases := []struct {
		name string
		// paths relative to the tree's root
		protected, readOnly, readFiles []string
		// want: every rule at or under the root, as "path access [file]"
		want    []string
		wantErr string
	}{
		{
			name:      "protected directory",
			protected: []string{"state"},
			want:      []string{". list", "link?", "other.txt full file", "ws full"},
		},
		{
			name:      "protected through a symbolic link",
			protected: []string{"link/identity"},
			want:      []string{". list", "other.txt full file", "state list", "state/skills full", "state/tasks full", "ws full"},
		},
		{
			name:      "read-only inside protected",
			protected: []string{"state"},
			readOnly:  []string{"state/skills"},
			want:      []string{". list", "other.txt full file", "state list", "state/skills read-exec", "ws full"},
		},
		{
			name:      "read-only outside protected",
			protected: []string{"state"},
			readOnly:  []string{"ws/skills"},
			want:      []string{". list", "other.txt full file", "ws list", "ws/a.txt full file", "ws/skills read-exec"},
		},
		{
			name:      "protected inside read-only",
			readOnly:  []string{"state"},
			protected: []string{"state/identity"},
			want:      []string{". list", "other.txt full file", "state list", "state/skills read-exec", "state/tasks read-exec", "ws full"},
		},
		{
			name:      "protected file",
			protected: []string{"state/identity/agent.nk"},
			want:      []string{". list", "other.txt full file", "state list", "state/identity list", "state/skills full", "state/tasks full", "ws full"},
		},
		{
			name:      "protected path not made yet",
			protected: []string{"ws/later/state"},
			want:      []string{". list", "other.txt full file", "state full", "ws list", "ws/a.txt full file", "ws/later list", "ws/skills full"},
		},
		{
			name:      "same path protected and read-only",
			protected: []string{"state"},
			readOnly:  []string{"state"},
			want:      []string{". list", "other.txt full file", "ws full"},
		},
		{
			name:      "one file readable inside protected",
			protected: []string{"state"},
			readFiles: []string{"state/identity/agent.nk"},
			want:      []string{". list", "other.txt full file", "state/identity/agent.nk read-file file", "ws full"},
		},
		{
			name:      "readable file is a directory",
			protected: []string{"state"},
			readFiles: []string{"state/tasks"},
			wantErr:   "not a regular file",
		},
		{
			name:      "readable file missing",
			protected: []string{"state"},
			readFiles: []string{"state/none.ps1"},
			wantErr:   "no such file",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root := tree(t)
			abs := func(ps []string) []string {
				var out []string
				for _, p := range ps {
					out = append(out, filepath.Join(root, p))
				}
				return out
			}
			rules, err := Plan(Paths{Protected: abs(c.protected), ReadOnly: abs(c.readOnly), ReadFiles: abs(c.readFiles)})
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Plan: %v, want an error with %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, r := range rules {
				rel, err := filepath.Rel(root, r.Path)
				if err != nil || strings.HasPrefix(rel, "..") {
					// Above the root: only the directories on the way
					// down get a rule there, and only List.
					if strings.HasPrefix(root, r.Path) && r.Access != List {
						t.Errorf("rule %v on an ancestor of the tree, want list", r)
					}
					continue
				}
				s := rel + " " + r.Access.String()
				if !r.Dir {
					s += " file"
				}
				got = append(got, s)
			}
			want := slices.DeleteFunc(slices.Clone(c.want), func(s string) bool { return strings.HasSuffix(s, "?") })
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("rules under the tree:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestPlanNothingProtected(t *testing.T) {
	rules, err := Plan(Paths{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 || rules[0].Path != "/" || rules[0].Access != Full {
		t.Fatalf("Plan of nothing = %v, want full access to /", rules)
	}
}

func TestParseSpec(t *testing.T) {
	good := Spec{Paths: Paths{Protected: []string{"/var/lib/a"}, ReadOnly: []string{"/var/lib/a/skills"}}, ABI: 3}
	text, err := good.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseSpec(text)
	if err != nil || !slices.Equal(got.Protected, good.Protected) || !slices.Equal(got.ReadOnly, good.ReadOnly) || got.ABI != 3 {
		t.Fatalf("ParseSpec(Encode(%v)) = %v, %v", good, got, err)
	}
	for _, bad := range []struct{ text, want string }{
		{`{"protected":["/a"],"abi":0}`, "ABI 0"},
		{`{"protected":[],"abi":1}`, "protects no path"},
		{`{"protected":["rel"],"abi":1}`, "not an absolute path"},
		{`{"protected":["/a"],"abi":1,"more":1}`, "unknown field"},
		{`{"protected":["/a"],"abi":1} {}`, "after its JSON"},
		{`[`, "not the JSON object"},
		{strings.Repeat(" ", maxSpec+1), "more than"},
	} {
		if _, err := ParseSpec(bad.text); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseSpec(%.40q) = %v, want an error with %q", bad.text, err, bad.want)
		}
	}
}

func FuzzParseSpec(f *testing.F) {
	f.Add(`{"protected":["/var/lib/fleet"],"read_only":["/var/lib/fleet/skills"],"read_files":["/var/lib/fleet/run/x.ps1"],"abi":7}`)
	f.Add(`{"protected":["/a"],"abi":1}`)
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseSpec(text)
		if err != nil {
			return
		}
		if s.ABI < 1 || len(s.Protected) == 0 {
			t.Fatalf("ParseSpec accepted %q as %v", text, s)
		}
		again, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseSpec(again); err != nil {
			t.Fatalf("ParseSpec(Encode(ParseSpec(%q))): %v", text, err)
		}
	})
}
