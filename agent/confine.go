package agent

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/confine"
)

// How the agent confines the commands it runs (Config.ConfineCommands).
const (
	// ConfineAuto confines commands when the kernel can, and otherwise
	// runs them unconfined, saying so in the log, the announce and
	// doctor.
	ConfineAuto = "auto"
	// ConfineRequired refuses to run commands when they cannot be
	// confined.
	ConfineRequired = "required"
	// ConfineOff runs commands unconfined: they can read the agent's
	// identity. Unsafe; for diagnosis only.
	ConfineOff = "off"
)

// ConfineFlag, as its first argument, makes the agent's executable the
// helper that confines one command: see RunConfined.
const ConfineFlag = confine.Flag

// RunConfined runs the confinement helper when args, a program's
// arguments with its name first (os.Args), ask for it, and reports
// whether they did (confine.Run). Every program given as
// Config.ConfineHelper calls it first thing in main:
//
//	if code, ok := agent.RunConfined(os.Args); ok {
//		os.Exit(code)
//	}
func RunConfined(args []string) (int, bool) { return confine.Run(args) }

// commandJail starts commands through the confinement helper. The zero
// value (spec nil) runs them as they are.
type commandJail struct {
	spec   *confine.Spec
	helper string
	// state is what the announce and doctor show: "landlock abi N", or
	// "none: WHY" when commands run unconfined.
	state string
	// refuse, when set, is why no command may run (ConfineRequired
	// without the means).
	refuse error
}

// newCommandJail returns how commands run under mode, with the helper
// executable helper, kept from the paths in p.
func newCommandJail(mode, helper string, p confine.Paths) (*commandJail, error) {
	switch mode {
	case "", ConfineAuto, ConfineRequired:
	case ConfineOff:
		return &commandJail{state: "none: off (--confine_commands off); commands can read the agent's identity"}, nil
	default:
		return nil, fmt.Errorf("confine_commands %q: give auto, required or off", mode)
	}
	abi, why := confine.ABI()
	if abi > 0 && helper == "" {
		abi, why = 0, "the agent has no helper executable to confine commands with"
	}
	if abi == 0 {
		j := &commandJail{state: "none: " + why}
		if mode == ConfineRequired {
			j.refuse = fmt.Errorf("commands must be confined (confine_commands required) and cannot be: %s; run the agent on Linux 5.13 or later with Landlock, or set confine_commands to auto", why)
		}
		return j, nil
	}
	helper, err := filepath.Abs(helper)
	if err != nil {
		return nil, fmt.Errorf("confine helper: %w", err)
	}
	spec := &confine.Spec{Paths: p, ABI: abi}
	// The plan must hold now: a protected path that cannot be resolved
	// would otherwise fail every command later.
	if _, err := confine.Plan(p); err != nil {
		return nil, err
	}
	return &commandJail{spec: spec, helper: helper, state: fmt.Sprintf("landlock abi %d", abi)}, nil
}

// confined reports whether commands run confined.
func (j *commandJail) confined() bool { return j != nil && j.spec != nil }

// wrap returns argv run through the helper, allowed to read the files
// readFiles (which may lie in a protected directory).
func (j *commandJail) wrap(argv []string, readFiles ...string) ([]string, error) {
	if j == nil {
		return argv, nil
	}
	if j.refuse != nil {
		return nil, j.refuse
	}
	if j.spec == nil {
		return argv, nil
	}
	s := *j.spec
	s.ReadFiles = append(s.ReadFiles[:len(s.ReadFiles):len(s.ReadFiles)], readFiles...)
	return s.Command(j.helper, argv)
}

// wrapInvocation is wrap for a shell invocation: PowerShell's script and
// parameters files, named in its environment, are the files it reads.
func (j *commandJail) wrapInvocation(inv shellInvocation) (shellInvocation, error) {
	var files []string
	for _, kv := range inv.env {
		name, value, _ := strings.Cut(kv, "=")
		if name == psScriptVar || name == psParamsVar {
			files = append(files, value)
		}
	}
	argv, err := j.wrap(inv.argv, files...)
	if err != nil {
		return inv, err
	}
	inv.argv = argv
	return inv, nil
}

// logConfinement says at start how commands run.
func (a *Agent) logConfinement() {
	j := a.tb.jail
	switch {
	case j.refuse != nil:
		a.log.Error("this host runs no command", "err", j.refuse)
	case j.confined() && inDir(a.cfg.StateDir, a.cfg.Cwd):
		a.log.Warn("commands are confined, but the state directory lies in the working directory: commands cannot make new files at its top; give --state_dir outside --cwd",
			"confinement", j.state, "state_dir", a.cfg.StateDir, "cwd", a.cfg.Cwd)
	case j.confined():
		a.log.Info("commands are confined: they cannot reach the state directory", "confinement", j.state)
	default:
		a.log.Warn("commands are NOT confined: any command the host policy allows can read the agent's identity; see policy/README.md", "confinement", j.state)
	}
}
