package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/agent/install"
	"github.com/fleetmcp/fleetmcp/cmd/internal/configfile"
)

// installOwnFlags are install's flags that are not the agent's: they are
// not passed on to the service.
var installOwnFlags = map[string]bool{
	"gateway": true, "token": true, "token_file": true, "ca_pin": true, "name": true,
	"prefix": true, "no_start": true, "user": true, "state_dir": true,
	// These go to the environment file.
	"policy": true, "nats": true,
	// Repeatable: passed one by one.
	"protect_path": true,
}

// runInstall installs the agent as a system service, enrolled with the
// gateway: join's flags, the agent's flags (written into the service
// definition) and --prefix, --no_start, --user.
func runInstall(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-agent install", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jf := addJoinFlags(fs, getenv)
	rf := addRunFlags(fs, getenv)
	prefix := fs.String("prefix", "/", "root of the file system to install into (another directory: files only, no user, no service started)")
	noStart := fs.Bool("no_start", false, "write the files, but do not enable or start the service")
	user := fs.String("user", install.DefaultUser, "the user the agent runs as, made when missing (Linux); its commands have its rights")
	installUsage(fs, getenv)
	cmdline, err := parse(fs, args)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["state_dir"] {
		return errors.New("--state_dir: install keeps the agent's state where the service expects it (/var/lib/fleetmcp-agent on Linux); drop the flag")
	}
	if _, err := newLogger(stderr, *rf.logLevel); err != nil {
		return err
	}
	if *rf.config != "" {
		// The service reads the same file: a change to it applies at
		// the next restart. It runs with the agent's flags only.
		if *rf.config, err = filepath.Abs(*rf.config); err != nil {
			return err
		}
		svc := flag.NewFlagSet("fleet-agent", flag.ContinueOnError)
		addRunFlags(svc, getenv)
		if err := configfile.Apply(svc, *rf.config, map[string]bool{}); err != nil {
			return fmt.Errorf("%w (the installed service reads this file with the agent's own flags: give install's and join's flags on the command line)", err)
		}
	}
	opts, err := jf.options(getenv, *rf.name, "", *rf.servers)
	if err != nil {
		return err
	}
	if err := checkPolicyFirst(rf, getenv); err != nil {
		return err
	}
	o := install.Options{Join: opts, Prefix: *prefix, User: *user, NoStart: *noStart, Out: stderr,
		DrainTimeout: *rf.drain, Env: map[string]string{}}
	// The agent's settings: the policy and NATS URLs in the environment
	// file (easy to change), the rest as flags of the service, paths
	// made absolute (the service starts elsewhere).
	if *rf.policy != "" {
		if o.Env["FLEET_POLICY"], err = filepath.Abs(*rf.policy); err != nil {
			return err
		}
	}
	if *rf.servers != "" {
		o.Env["FLEET_NATS_URL"] = *rf.servers
	}
	for _, d := range []*string{rf.cwd, rf.skillsDir, rf.fleetSkills} {
		if *d != "" {
			if *d, err = filepath.Abs(*d); err != nil {
				return err
			}
		}
	}
	// Settings from --config stay in the file the service reads.
	fs.Visit(func(f *flag.Flag) {
		if cmdline[f.Name] && !installOwnFlags[f.Name] {
			o.Args = append(o.Args, fmt.Sprintf("--%s=%s", f.Name, f.Value.String()))
		}
	})
	for _, p := range rf.protected {
		o.Args = append(o.Args, "--protect_path="+p)
	}
	return install.Install(ctx, o)
}
