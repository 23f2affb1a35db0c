//go:build linux

package install

import (
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
	LinuxEnvFile  = "/etc/fleetmcp/agent.env"
	LinuxUnit     = "/etc/systemd/system/fleet-agent.service"
	linuxService  = "fleet-agent"
)

// install installs the agent as a systemd service.
func install(ctx context.Context, o *Options) error {
	if o.system() && os.Geteuid() != 0 {
		return errNotRoot
	}
	// The environment file's settings are checked before anything is
	// made or the token spent.
	env, err := EnvFile(o.Env)
	if err != nil {
		return fmt.Errorf("environment file: %w", err)
	}
	owner, err := o.linuxUser(ctx)
	if err != nil {
		return err
	}
	stateDir := o.path(LinuxStateDir)
	changed, err := o.enrol(ctx, stateDir)
	if err != nil {
		return err
	}
	if owner != nil {
		if err := chownTree(stateDir, owner.uid, owner.gid); err != nil {
			return fmt.Errorf("give %s to user %s: %w", stateDir, o.User, err)
		}
		o.say("state: %s owned by %s, mode 0700", stateDir, o.User)
	}
	bin := o.path(LinuxBinary)
	c, err := copyIfChanged(o.Executable, bin, 0o755)
	if err != nil {
		return fmt.Errorf("install the binary: %w", err)
	}
	o.step("binary", bin, c)
	changed = changed || c
	// Root's, 0600, as the package's: systemd reads it as root, and the
	// agent's user has no business reading or changing its own
	// settings.
	envPath := o.path(LinuxEnvFile)
	if c, err = writeIfChanged(envPath, env, 0o600); err != nil {
		return err
	}
	o.step("environment", envPath, c)
	changed = changed || c
	unit := Unit{User: o.User, Executable: LinuxBinary, StateDir: LinuxStateDir, EnvFile: LinuxEnvFile,
		Args: o.Args, WorkDirs: o.WorkDirs, DrainTimeout: o.DrainTimeout}
	text, err := unit.Render()
	if err != nil {
		return fmt.Errorf("systemd unit: %w", err)
	}
	unitPath := o.path(LinuxUnit)
	if c, err = writeIfChanged(unitPath, text, 0o644); err != nil {
		return err
	}
	o.step("unit", unitPath, c)
	changed = changed || c
	return o.systemctl(ctx, changed)
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
			return fmt.Errorf("start the service: %w", err)
		}
	}
	o.say("service: %s enabled and running", linuxService)
	return nil
}

type owner struct{ uid, gid int }

// linuxUser returns the agent's user, made when missing; nil under a
// prefix, where no user is made.
func (o *Options) linuxUser(ctx context.Context) (*owner, error) {
	if !o.system() {
		o.say("user: not creating %s nor giving it the files: --prefix %s is not this machine's root", o.User, o.Prefix)
		return nil, nil
	}
	u, err := user.Lookup(o.User)
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		if err := o.Command(ctx, "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", o.User); err != nil {
			return nil, fmt.Errorf("create the agent's user: %w", err)
		}
		o.say("user: %s created (a system user without a login)", o.User)
		u, err = user.Lookup(o.User)
	} else if err == nil {
		o.say("user: %s exists", o.User)
	}
	if err != nil {
		return nil, fmt.Errorf("the agent's user %s: %w", o.User, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("the agent's user %s: %w", o.User, err)
	}
	return &owner{uid: uid, gid: gid}, nil
}
