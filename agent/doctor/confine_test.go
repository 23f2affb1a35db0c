package doctor

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckConfinement(t *testing.T) {
	landlock := func() (int, string) { return 7, "" }
	none := func() (int, string) { return 0, "kernel has no Landlock" }
	root := t.TempDir()
	state, ws := filepath.Join(root, "state"), filepath.Join(root, "ws")
	for _, c := range []struct {
		name, mode, cwd string
		abi             func() (int, string)
		want            Status
		detail, fix     string
	}{
		{"confined", "auto", ws, landlock, OK, "landlock abi 7: commands cannot read or change " + state, ""},
		{"what it costs", "auto", ws, landlock, OK, ", " + filepath.Dir(root) + ", " + root + " (existing ones stay usable", ""},
		{"required and confined", "required", ws, landlock, OK, "landlock abi 7", ""},
		{"state in the working directory", "auto", root, landlock, Warn, "lies in the working directory", "--state_dir outside its --cwd"},
		{"no landlock", "auto", ws, none, Warn, "none: kernel has no Landlock; any command", "Linux 5.13"},
		{"no landlock, required", "required", ws, none, Fail, "will run no command", "--confine_commands auto"},
		{"off", "off", ws, landlock, Warn, "can read this host's identity", "drop --confine_commands off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := checkConfinement(c.mode, state, c.cwd, c.abi)
			if r.Check != "confinement" || r.Status != c.want || !strings.Contains(r.Detail, c.detail) || !strings.Contains(r.Fix, c.fix) {
				t.Errorf("got %v %q (fix %q), want %v with %q (fix %q)", r.Status, r.Detail, r.Fix, c.want, c.detail, c.fix)
			}
		})
	}
}

func TestAboveDirs(t *testing.T) {
	for dir, want := range map[string]string{
		"/var/lib/fleetmcp-agent":                "/ /var /var/lib",
		"/home/ann/.local/state/fleetmcp-agent/": "/ /home /home/ann /home/ann/.local /home/ann/.local/state",
		"/srv":                                   "/",
		"/":                                      "/",
		"relative/state":                         "",
		"":                                       "",
	} {
		if got := strings.Join(aboveDirs(dir), " "); got != want {
			t.Errorf("aboveDirs(%q) = %q, want %q", dir, got, want)
		}
	}
}
