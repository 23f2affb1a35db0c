//go:build linux

package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
)

// Where the agent is installed on Linux (under Options.Prefix).
const (
	LinuxBinary   = "/usr/local/bin/fleet-agent"
	LinuxStateDir = "/var/lib/fleetmcp-agent"
	LinuxHomeDir  = "/var/lib/fleetmcp-agent-home"
	LinuxEnvFile  = "/etc/fleetmcp/agent.env"
	LinuxUnit     = "/etc/systemd/system/fleet-agent.service"
	linuxService  = "fleet-agent"
	// The fleet-agent package's binary and unit (deb, rpm): install
	// enrols beside them and uses them.
	PackagedBinary = "/usr/bin/fleet-agent"
	PackagedUnit   = "/usr/lib/systemd/system/fleet-agent.service"
	// systemdBooted exists when systemd runs the machine (sd_booted(3)).
	systemdBooted = "/run/systemd/system"
)

// linuxPlan is what the checks before the enrolment decided.
type linuxPlan struct {
	// packaged: the fleet-agent package is installed; its binary, unit
	// and environment file are used as they are.
	packaged bool
	// removeOld: units and binary of an earlier install that would
	// shadow the package's, removed.
	removeOld []string
	// makeUser: the agent's user is made after the enrolment.
	makeUser bool
	owner    *owner
	env      []byte
}

// install installs the agent as a systemd service: it checks everything
// first (planLinux), then enrols, then writes.
func install(ctx context.Context, o *Options) error {
	p, err := o.planLinux()
	if err != nil {
		return err
	}
	stateDir := o.path(LinuxStateDir)
	changed, err := o.enrol(ctx, stateDir)
	if err != nil {
		return err
	}
	c, err := o.writeLinux(ctx, p, stateDir)
	if err != nil {
		return afterEnrolment(err)
	}
	if err := o.systemctl(ctx, changed || c); err != nil {
		return afterEnrolment(err)
	}
	return nil
}

// planLinux checks, before the token is spent, everything the install
// needs: root, systemd, the user, the paths it writes; and whether the
// package is installed. It changes nothing.
func (o *Options) planLinux() (*linuxPlan, error) {
	p := &linuxPlan{packaged: isFile(o.path(PackagedUnit)) && isFile(o.path(PackagedBinary))}
	var problems []error
	if o.system() && o.machine.euid() != 0 {
		problems = append(problems, errNotRoot)
	}
	if o.system() && !o.NoStart {
		if fi, err := os.Stat(o.path(systemdBooted)); err != nil || !fi.IsDir() {
			problems = append(problems, errors.New("systemd does not run this machine (no /run/systemd/system): install sets up a systemd service"))
		} else if _, err := o.machine.lookPath("systemctl"); err != nil {
			problems = append(problems, fmt.Errorf("systemctl: %w", err))
		}
	}
	if p.packaged {
		problems = append(problems, o.planPackaged(p)...)
	} else {
		env, err := EnvFile(o.Env)
		if err != nil {
			problems = append(problems, fmt.Errorf("environment file: %w", err))
		}
		p.env = env
		u := Unit{User: o.User, Executable: LinuxBinary, Args: o.Args, DrainTimeout: o.DrainTimeout}
		if _, err := u.Render(); err != nil {
			problems = append(problems, fmt.Errorf("systemd unit: %w", err))
		}
		for _, f := range []string{LinuxBinary, LinuxEnvFile, LinuxUnit} {
			if err := checkWritable(o.path(f), false); err != nil {
				problems = append(problems, err)
			}
		}
	}
	if err := checkWritable(o.path(LinuxStateDir), true); err != nil {
		problems = append(problems, err)
	}
	if o.system() {
		u, err := o.machine.lookupUser(o.User)
		var unknown user.UnknownUserError
		switch {
		case errors.As(err, &unknown) && p.packaged:
			problems = append(problems, fmt.Errorf("the fleet-agent package is installed but its user %s is missing: reinstall the package", o.User))
		case errors.As(err, &unknown):
			if _, err := o.machine.lookPath("useradd"); err != nil {
				problems = append(problems, fmt.Errorf("the agent's user %s does not exist and cannot be made (useradd: %v): make it, or pass --user", o.User, err))
			}
			p.makeUser = true
		case err != nil:
			problems = append(problems, fmt.Errorf("the agent's user %s: %w", o.User, err))
		default:
			if p.owner, err = userOwner(u); err != nil {
				problems = append(problems, err)
			}
		}
	}
	if err := preflight(problems); err != nil {
		return nil, err
	}
	return p, nil
}

// planPackaged checks an install beside the fleet-agent package: its unit
// runs the agent as its user, with the settings of its environment file
// (a conffile install does not rewrite), so install takes none of its
// own; an earlier install's unit and binary, which would shadow the
// package's, are removed.
func (o *Options) planPackaged(p *linuxPlan) []error {
	var problems []error
	if o.User != DefaultUser {
		problems = append(problems, fmt.Errorf("--user %s: the fleet-agent package's unit runs the agent as %s; drop --user (or change the user in a drop-in: systemctl edit fleet-agent)", o.User, DefaultUser))
	}
	if len(o.Args) > 0 || len(o.Env) > 0 {
		problems = append(problems, fmt.Errorf("the fleet-agent package is installed: its settings are in %s (kept on upgrade), which install does not rewrite; "+
			"put the agent's flags into FLEET_AGENT_FLAGS there, and run install without them", LinuxEnvFile))
	}
	unit := o.path(LinuxUnit)
	if data, err := os.ReadFile(unit); err == nil {
		if !bytes.HasPrefix(data, []byte(installHeader)) {
			problems = append(problems, fmt.Errorf("%s shadows the package's unit, and install did not write it: remove it (or move it to a drop-in)", LinuxUnit))
		} else {
			p.removeOld = append(p.removeOld, unit)
			if isFile(o.path(LinuxBinary)) {
				p.removeOld = append(p.removeOld, o.path(LinuxBinary))
			}
		}
	}
	return problems
}

// writeLinux makes the user, gives it the state directory and writes the
// binary, the environment file and the unit (beside the package: removes
// an earlier install's). It reports whether it changed a file the
// service reads.
func (o *Options) writeLinux(ctx context.Context, p *linuxPlan, stateDir string) (bool, error) {
	if !o.system() {
		o.say("user: not creating %s nor giving it the files: --prefix %s is not this machine's root", o.User, o.Prefix)
	}
	if p.owner != nil {
		o.say("user: %s exists", o.User)
	}
	if p.makeUser {
		u, err := o.makeUser(ctx)
		if err != nil {
			return false, err
		}
		if p.owner, err = userOwner(u); err != nil {
			return false, err
		}
	}
	if p.owner != nil {
		if err := chownTree(stateDir, p.owner.uid, p.owner.gid); err != nil {
			return false, fmt.Errorf("give %s to user %s: %w", stateDir, o.User, err)
		}
		o.say("state: %s owned by %s, mode 0700", stateDir, o.User)
	}
	if p.packaged {
		changed := false
		for _, f := range p.removeOld {
			if err := os.Remove(f); err != nil {
				return false, fmt.Errorf("remove %s of an earlier install, which shadows the package's: %w", f, err)
			}
			o.say("earlier install: %s removed (the package's is used)", f)
			changed = true
		}
		o.say("package: fleet-agent is installed: its binary %s, unit %s and settings %s are used as they are", PackagedBinary, PackagedUnit, LinuxEnvFile)
		return changed, nil
	}
	bin := o.path(LinuxBinary)
	changed, err := copyIfChanged(o.Executable, bin, 0o755)
	if err != nil {
		return false, fmt.Errorf("install the binary: %w", err)
	}
	o.step("binary", bin, changed)
	// Root's, 0600, as the package's: systemd reads it as root, and the
	// agent's user has no business reading or changing its own
	// settings.
	envPath := o.path(LinuxEnvFile)
	c, err := writeIfChanged(envPath, p.env, 0o600)
	if err != nil {
		return false, err
	}
	o.step("environment", envPath, c)
	changed = changed || c
	u := Unit{User: o.User, Executable: LinuxBinary, Args: o.Args, DrainTimeout: o.DrainTimeout}
	text, err := u.Render()
	if err != nil {
		return false, fmt.Errorf("systemd unit: %w", err)
	}
	unitPath := o.path(LinuxUnit)
	if c, err = writeIfChanged(unitPath, text, 0o644); err != nil {
		return false, err
	}
	o.step("unit", unitPath, c)
	return changed || c, nil
}

// systemctl enables and starts the service; one whose files changed is
// restarted.
func (o *Options) systemctl(ctx context.Context, changed bool) error {
	if o.NoStart {
		o.say("service: not started (--no_start); start it with systemctl daemon-reload && systemctl enable --now %s", linuxService)
		return nil
	}
	if !o.system() {
		o.say("service: not started: --prefix %s is not this machine's root", o.Prefix)
		return nil
	}
	steps := [][]string{{"enable", "--now", linuxService}}
	if changed {
		steps = [][]string{{"daemon-reload"}, {"enable", linuxService}, {"restart", linuxService}}
	}
	for _, s := range steps {
		if err := o.Command(ctx, "systemctl", s...); err != nil {
			return fmt.Errorf("start the service: %w (journalctl -u %s says why)", err, linuxService)
		}
	}
	o.say("service: %s enabled and running", linuxService)
	return nil
}

type owner struct{ uid, gid int }

// makeUser makes the agent's user: a system user without a login, with
// a group of its name and the home of the package's user.
func (o *Options) makeUser(ctx context.Context) (*user.User, error) {
	if err := o.Command(ctx, "useradd", "--system", "--user-group", "--home-dir", LinuxHomeDir, "--no-create-home", "--shell", "/usr/sbin/nologin", o.User); err != nil {
		return nil, fmt.Errorf("create the agent's user: %w", err)
	}
	o.say("user: %s created (a system user without a login)", o.User)
	u, err := o.machine.lookupUser(o.User)
	if err != nil {
		return nil, fmt.Errorf("the agent's user %s: %w", o.User, err)
	}
	return u, nil
}

func userOwner(u *user.User) (*owner, error) {
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("the agent's user %s: %w", u.Username, err)
	}
	return &owner{uid: uid, gid: gid}, nil
}

// isFile reports whether path is a regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
