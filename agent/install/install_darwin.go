//go:build darwin

package install

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/fleetmcp/fleetmcp/agent/service"
)

// Where the agent is installed on macOS (under Options.Prefix).
const (
	DarwinBinary   = "/usr/local/bin/fleet-agent"
	DarwinStateDir = "/Library/Application Support/fleetmcp-agent"
	// DarwinHomeDir is the agent's working directory and HOME, as
	// /var/lib/fleetmcp-agent-home is on Linux: launchd would start it
	// in /, where --skills_dir would become /.agents/skills.
	DarwinHomeDir = "/Library/Application Support/fleetmcp-agent-home"
	DarwinLog     = "/Library/Logs/fleetmcp-agent.log"
	darwinLabel   = "io.fleetmcp.agent"
	DarwinPlist   = "/Library/LaunchDaemons/" + darwinLabel + ".plist"
)

// install installs the agent as a launchd daemon running as --user,
// which must exist (macOS has no useradd: make it with sysadminctl, or
// pass --user root).
func install(ctx context.Context, o *Options) error {
	// Everything is checked before the token is spent.
	var problems []error
	if o.system() && o.machine.euid() != 0 {
		problems = append(problems, errNotRoot)
	}
	uid, gid := -1, -1
	if o.system() {
		u, err := o.machine.lookupUser(o.User)
		if err != nil {
			problems = append(problems, fmt.Errorf("the agent's user %s: %w; create it first (sysadminctl -addUser %s ...), or pass --user root", o.User, err, o.User))
		} else {
			uid, _ = strconv.Atoi(u.Uid)
			gid, _ = strconv.Atoi(u.Gid)
		}
		if _, err := o.machine.lookPath("launchctl"); err != nil && !o.NoStart {
			problems = append(problems, fmt.Errorf("launchctl: %w", err))
		}
	} else {
		o.say("user: not giving the files to %s: --prefix %s is not this machine's root", o.User, o.Prefix)
	}
	for _, f := range []string{DarwinBinary, DarwinPlist} {
		if err := checkWritable(o.path(f), false); err != nil {
			problems = append(problems, err)
		}
	}
	for _, d := range []string{DarwinStateDir, DarwinHomeDir} {
		if err := checkWritable(o.path(d), true); err != nil {
			problems = append(problems, err)
		}
	}
	if err := preflight(problems); err != nil {
		return err
	}
	return installDarwin(ctx, o, uid, gid)
}

// installDarwin enrols and writes, once the checks passed.
func installDarwin(ctx context.Context, o *Options, uid, gid int) error {
	stateDir := o.path(DarwinStateDir)
	changed, err := o.enrol(ctx, stateDir)
	if err != nil {
		return err
	}
	home := o.path(DarwinHomeDir)
	if _, err := ensureDir(home, 0o700); err != nil {
		return afterEnrolment(err)
	}
	if uid >= 0 {
		for _, d := range []string{stateDir, home} {
			if err := chownTree(d, uid, gid); err != nil {
				return afterEnrolment(fmt.Errorf("give %s to user %s: %w", d, o.User, err))
			}
		}
	}
	bin := o.path(DarwinBinary)
	c, err := copyIfChanged(o.Executable, bin, 0o755)
	if err != nil {
		return fmt.Errorf("install the binary: %w", err)
	}
	o.step("binary", bin, c)
	changed = changed || c
	env := []string{"HOME=" + DarwinHomeDir}
	for k, v := range o.Env {
		env = append(env, k+"="+v)
	}
	userName := o.User
	if userName == "root" {
		userName = ""
	}
	plist, err := service.LaunchdPlist(service.Definition{Name: darwinLabel, Executable: DarwinBinary,
		Args: append([]string{"--state_dir", DarwinStateDir}, o.Args...), Env: env, LogFile: DarwinLog, WorkingDir: DarwinHomeDir,
		User: userName, DrainTimeout: o.DrainTimeout})
	if err != nil {
		return err
	}
	plistPath := o.path(DarwinPlist)
	if c, err = writeIfChanged(plistPath, plist, 0o644); err != nil {
		return err
	}
	o.step("launchd", plistPath, c)
	changed = changed || c
	if o.NoStart || !o.system() {
		o.say("service: not loaded (--no_start or --prefix); load it with launchctl bootstrap system %s", DarwinPlist)
		return nil
	}
	loaded := o.Command(ctx, "launchctl", "print", "system/"+darwinLabel) == nil
	if loaded && !changed {
		o.say("service: %s loaded", darwinLabel)
		return nil
	}
	if loaded {
		if err := o.Command(ctx, "launchctl", "bootout", "system/"+darwinLabel); err != nil {
			return fmt.Errorf("unload the old service: %w", err)
		}
	}
	if err := o.Command(ctx, "launchctl", "bootstrap", "system", DarwinPlist); err != nil {
		return afterEnrolment(errors.Join(fmt.Errorf("load the service"), err))
	}
	o.say("service: %s loaded and running", darwinLabel)
	return nil
}
