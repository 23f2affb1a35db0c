package doctor

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/confine"
)

// Confinement modes, as --confine_commands takes them.
const (
	confineRequired = "required"
	confineOff      = "off"
)

// checkConfinement: the commands the agent runs can be kept out of its
// state directory (package confine), as mode asks. abi reports the
// kernel's Landlock ABI (confine.ABI). cwd is the agent's working
// directory: a state directory inside it leaves commands unable to make
// new entries at its top.
func checkConfinement(mode, stateDir, cwd string, abi func() (int, string)) Result {
	r := Result{Check: "confinement"}
	if mode == confineOff {
		return warn(r, "off (--confine_commands off): any command the host policy allows can read this host's identity",
			"drop --confine_commands off (the default, auto, confines commands when the kernel can)")
	}
	v, why := abi()
	if v == 0 {
		if mode == confineRequired {
			return fail(r, "commands cannot be confined ("+why+") and --confine_commands is required: the agent will run no command",
				"run the agent on Linux 5.13 or later with Landlock enabled, or set --confine_commands auto and run commands as a user of their own (policy/README.md)")
		}
		return warn(r, "none: "+why+"; any command the host policy allows can read this host's identity",
			"run the agent on Linux 5.13 or later with Landlock enabled, or give it a user of its own and keep its commands from that user's files (policy/README.md)")
	}
	detail := fmt.Sprintf("landlock abi %d: commands cannot read or change %s", v, stateDir)
	if cwd != "" && stateDir != "" && inside(stateDir, cwd) {
		return warn(r, detail+", but it lies in the working directory "+cwd+", where commands can then make nothing new at the top",
			"give the agent a --state_dir outside its --cwd, such as /var/lib/fleetmcp-agent")
	}
	if above := aboveDirs(stateDir); len(above) > 0 {
		detail += "; nor make new entries directly in " + strings.Join(above, ", ") + " (existing ones stay usable; policy/README.md)"
	}
	return ok(r, detail)
}

// aboveDirs lists the directories from / down to dir's parent: those in
// which confined commands can list and use what exists but make nothing
// new (package confine).
func aboveDirs(dir string) []string {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil
	}
	var out []string
	for d := filepath.Dir(filepath.Clean(dir)); ; d = filepath.Dir(d) {
		out = append(out, d)
		if filepath.Dir(d) == d {
			break
		}
	}
	slices.Reverse(out)
	return out
}

// inside reports whether path lies in dir (both made absolute).
func inside(path, dir string) bool {
	path, err1 := filepath.Abs(path)
	dir, err2 := filepath.Abs(dir)
	if err1 != nil || err2 != nil {
		return false
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// kernelABI is the default of Options.ConfineABI.
func kernelABI() (int, string) { return confine.ABI() }
