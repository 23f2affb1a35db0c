package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// DefaultUser is the user the agent runs as unless --user says otherwise
// (on Windows: LocalSystem).
const DefaultUser = "fleetmcp-agent"

// Options are what fleet-agent install is given.
type Options struct {
	// Join enrols the machine (its StateDir is the install's).
	Join identity.JoinOptions
	// Prefix is the root of the file system installed into: "/" for the
	// machine itself. Under another prefix no user is made and no files
	// change owner.
	Prefix string
	// User runs the agent; made (a system user without a login) when
	// missing, on Linux.
	User string
	// NoStart leaves the service manager alone: files only.
	NoStart bool
	// Executable is the fleet-agent binary installed (default: the
	// running one).
	Executable string
	// Args are the agent's flags beyond --state_dir (the run flags given
	// to install, paths absolute), and Env the settings the host changes
	// (FLEET_POLICY, FLEET_NATS_URL: the variables the agent reads them
	// from; on Linux they go into the environment file's
	// FLEET_AGENT_FLAGS, as --policy and --nats).
	Args []string
	Env  map[string]string
	// DrainTimeout is the agent's --drain_timeout (how long a stop may
	// take).
	DrainTimeout time.Duration
	// Out receives what install did, a line per step.
	Out io.Writer
	// Command runs a system command (useradd, systemctl, launchctl);
	// default: the command itself, its output to Out.
	Command func(ctx context.Context, name string, args ...string) error

	// machine is what install asks of the system (default: this
	// machine's answers); tests replace it.
	machine *machine
}

// machine is what install asks of the system before it changes it.
type machine struct {
	// asRoot treats Prefix as the machine's root: a user is looked up
	// and made, files change owner, the service manager is used. Only
	// tests set it, with a Prefix that is not "/".
	asRoot     bool
	euid       func() int
	lookupUser func(name string) (*user.User, error)
	lookPath   func(name string) (string, error)
}

func (m *machine) fill() {
	if m.euid == nil {
		m.euid = os.Geteuid
	}
	if m.lookupUser == nil {
		m.lookupUser = user.Lookup
	}
	if m.lookPath == nil {
		m.lookPath = exec.LookPath
	}
}

// validate checks the options and fills in defaults.
func (o *Options) validate() error {
	if o.Prefix == "" {
		o.Prefix = "/"
	}
	if !filepath.IsAbs(o.Prefix) {
		return fmt.Errorf("--prefix %q: want an absolute path", o.Prefix)
	}
	o.Prefix = filepath.Clean(o.Prefix)
	if o.User == "" || strings.Trim(strings.ToLower(o.User), "abcdefghijklmnopqrstuvwxyz0123456789_-.") != "" || strings.HasPrefix(o.User, "-") || len(o.User) > 32 {
		return fmt.Errorf("--user %q: want a user name (letters, digits, '_', '-', '.')", o.User)
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the fleet-agent binary to install: %w", err)
		}
		o.Executable = exe
	}
	if o.Command == nil {
		o.Command = func(ctx context.Context, name string, args ...string) error {
			cmd := exec.CommandContext(ctx, name, args...)
			cmd.Stdout, cmd.Stderr = o.Out, o.Out
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
			}
			return nil
		}
	}
	if o.machine == nil {
		o.machine = &machine{}
	}
	o.machine.fill()
	// The enrolment's options are checked before anything is written.
	return identity.CheckJoinOptions(&o.Join)
}

// path returns the system path p under the prefix.
func (o *Options) path(p string) string { return filepath.Join(o.Prefix, p) }

// system reports whether the install is into the machine itself.
func (o *Options) system() bool {
	return o.Prefix == string(filepath.Separator) || o.machine != nil && o.machine.asRoot
}

// say reports one step.
func (o *Options) say(format string, args ...any) { fmt.Fprintf(o.Out, format+"\n", args...) }

// step reports a file written or found as it should be.
func (o *Options) step(what, path string, changed bool) {
	if changed {
		o.say("%s: %s written", what, path)
	} else {
		o.say("%s: %s unchanged", what, path)
	}
}

// Install installs the agent as a service of this machine (see the
// package comment), enrolling it first: a bad token or a gateway that
// fails its CA pin stops the install before the binary or the service
// definition are touched.
func Install(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	return install(ctx, &o)
}

// enrol makes the state directory (0700) and enrols the machine into it,
// or keeps the identity it holds; it reports whether it enrolled now.
func (o *Options) enrol(ctx context.Context, stateDir string) (bool, error) {
	if err := os.MkdirAll(filepath.Dir(stateDir), 0o755); err != nil {
		return false, err
	}
	if _, err := ensureDir(stateDir, 0o700); err != nil {
		return false, err
	}
	join := o.Join
	join.StateDir = stateDir
	join.Say = func(msg string) { o.say("identity: %s", msg) }
	id, enrolled, err := identity.Join(ctx, join)
	if err != nil {
		return false, err
	}
	if enrolled {
		o.say("identity: enrolled as %q with %s; kept in %s", id.Enrolment.Host, id.Enrolment.GatewayURL, stateDir)
	} else {
		o.say("identity: enrolled already as %q with %s; kept", id.Enrolment.Host, id.Enrolment.GatewayURL)
	}
	return enrolled, nil
}

// errNotRoot explains a failure to write system files.
var errNotRoot = errors.New("fleet-agent install writes system files: run it as root (sudo), or give --prefix to install into a directory")

// PreflightError is what install found, before it enrolled the machine,
// that stops it: nothing was changed and the join token was not used.
type PreflightError struct {
	Problems []error
}

func (e *PreflightError) Error() string {
	var b strings.Builder
	b.WriteString("fleet-agent install checked this machine before enrolling it, and stopped: nothing was changed, the join token was not used")
	for _, p := range e.Problems {
		b.WriteString("\n  - ")
		b.WriteString(p.Error())
	}
	b.WriteString("\nFix that and run install again; or write the files without the service manager (--no_start) and start the agent yourself; " +
		"or run the agent without installing it: fleet-agent join (the same flags) under your own supervisor")
	return b.String()
}

// preflight returns problems as a *PreflightError (nil when none).
func preflight(problems []error) error {
	if len(problems) == 0 {
		return nil
	}
	return &PreflightError{Problems: problems}
}

// afterEnrolment explains a failure once the machine is enrolled: the
// token is spent, and install run again does not use it again.
func afterEnrolment(err error) error {
	return fmt.Errorf("%w\nThe machine is enrolled (its identity is kept): fix that and run the same install again, which does not use the token again", err)
}

// checkWritable reports a problem when the file path could not be
// written: it is not a regular file, or the nearest directory that exists
// on its way is not a directory or not writable.
func checkWritable(path string, dir bool) error {
	if fi, err := os.Lstat(path); err == nil {
		switch {
		case dir && !fi.IsDir():
			return fmt.Errorf("%s is not a directory: move it away", path)
		case !dir && !fi.Mode().IsRegular():
			return fmt.Errorf("%s is not a regular file (%v): move it away", path, fi.Mode().Type())
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for p := filepath.Dir(path); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) && p != filepath.Dir(p) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s cannot be made: %s is not a directory", path, p)
		}
		if !dirWritable(p) {
			return fmt.Errorf("%s cannot be written: %s is not writable", path, p)
		}
		return nil
	}
}
