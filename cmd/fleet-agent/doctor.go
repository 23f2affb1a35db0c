package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/doctor"
	"github.com/fleetmcp/fleetmcp/agent/install"
)

// errChecksFailed: doctor found something the agent cannot run with.
var errChecksFailed = errors.New("doctor: a check failed")

// runDoctor checks, without starting an agent, what the agent of these
// flags needs (agent/doctor), one line per check on stdout. It fails
// (exit 1) when a check fails.
func runDoctor(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flags := func() (*flag.FlagSet, *runFlags, *time.Duration, *string) {
		fs := flag.NewFlagSet("fleet-agent doctor", flag.ContinueOnError)
		fs.SetOutput(stderr)
		rf := addRunFlags(fs, getenv)
		timeout := fs.Duration("timeout", 10*time.Second, "how long each network check may take")
		unit := fs.String("unit", "", "read the agent's flags from this systemd unit, its drop-ins and its EnvironmentFile, as the service runs it; flags given here win "+
			"(default: the installed fleet-agent.service when no --state_dir or --config is given; off: none)")
		setUsage(fs, doctorSynopsis)
		return fs, rf, timeout, unit
	}
	fs, rf, timeout, unit := flags()
	given, err := parse(fs, args)
	if err != nil {
		return err
	}
	var service []doctor.Result
	if u := serviceUnit(*unit, given); u != "" {
		sa, err := install.ReadServiceArgs("/", u)
		if err != nil {
			return fmt.Errorf("--unit: %w (pass --unit off and the agent's flags instead)", err)
		}
		// The service's flags first, those given here after them: the
		// last of a flag wins.
		fs, rf, timeout, _ = flags()
		if _, err := parse(fs, append(slices.Clone(sa.Args), args...)); err != nil {
			return fmt.Errorf("the flags of %s: %w", u, err)
		}
		service = append(service, serviceResult(sa))
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration", *timeout)
	}
	home := cmp.Or(getenv("HOME"), getenv("USERPROFILE"))
	self, _ := os.Executable()
	rs := doctor.Run(ctx, doctor.Options{
		StateDir: *rf.stateDir, PolicyFile: *rf.policy, NATSURLs: splitList(*rf.servers), Timeout: *timeout, UID: os.Getuid(),
		ConfineCommands: *rf.confine, Cwd: cmp.Or(*rf.cwd, workingDir()),
		CheckPolicy: func(file string) ([]string, error) {
			return agent.CheckPolicy(agent.Config{PolicyFile: file, Cwd: *rf.cwd, Home: home, Shell: *rf.shell, GitGuard: self})
		},
		StateDirHolder: agent.StateDirHolder,
	})
	if *rf.servers != "" {
		service = append(service, doctor.Result{Check: "nats urls", Status: doctor.OK, Detail: "from --nats (FLEET_NATS_URL), not the enrolment: " + *rf.servers})
	}
	if doctor.Print(stdout, append(service, rs...)) {
		return errChecksFailed
	}
	return nil
}

// serviceUnit is the unit whose flags doctor reads: --unit's, or the
// installed one when the command line names no state directory or
// configuration of its own ("" for none).
func serviceUnit(unit string, given map[string]bool) string {
	switch {
	case unit == "off":
		return ""
	case unit != "":
		return unit
	case given["state_dir"] || given["config"] || runtime.GOOS != "linux":
		return ""
	}
	for _, u := range install.UnitPaths {
		if fi, err := os.Stat(u); err == nil && fi.Mode().IsRegular() {
			return u
		}
	}
	return ""
}

// serviceResult says whose flags doctor checks.
func serviceResult(sa *install.ServiceArgs) doctor.Result {
	files := append(append([]string{sa.Unit}, sa.DropIns...), sa.EnvFiles...)
	r := doctor.Result{Check: "service", Status: doctor.OK, Detail: "the flags of " + strings.Join(files, ", ") + ": " + strings.Join(sa.Args, " ")}
	if len(sa.Unread) > 0 {
		r.Status = doctor.Warn
		r.Detail += " (not read: " + errors.Join(sa.Unread...).Error() + ")"
		r.Fix = "run doctor as root to read the service's environment file (sudo fleet-agent doctor)"
	}
	return r
}

// workingDir is the agent's default --cwd: the process's working
// directory ("" when unknown).
func workingDir() string {
	dir, _ := os.Getwd()
	return dir
}
