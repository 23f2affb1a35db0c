package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/doctor"
)

// errChecksFailed: doctor found something the agent cannot run with.
var errChecksFailed = errors.New("doctor: a check failed")

// runDoctor checks, without starting an agent, what the agent of these
// flags needs (agent/doctor), one line per check on stdout. It fails
// (exit 1) when a check fails.
func runDoctor(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-agent doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rf := addRunFlags(fs, getenv)
	timeout := fs.Duration("timeout", 10*time.Second, "how long each network check may take")
	setUsage(fs, doctorSynopsis)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration", *timeout)
	}
	home := cmp.Or(getenv("HOME"), getenv("USERPROFILE"))
	self, _ := os.Executable()
	rs := doctor.Run(ctx, doctor.Options{
		StateDir: *rf.stateDir, PolicyFile: *rf.policy, Timeout: *timeout, UID: os.Getuid(),
		ConfineCommands: *rf.confine, Cwd: cmp.Or(*rf.cwd, workingDir()),
		CheckPolicy: func(file string) ([]string, error) {
			return agent.CheckPolicy(agent.Config{PolicyFile: file, Cwd: *rf.cwd, Home: home, Shell: *rf.shell, GitGuard: self})
		},
		StateDirHolder: agent.StateDirHolder,
	})
	if doctor.Print(stdout, rs) {
		return errChecksFailed
	}
	return nil
}

// workingDir is the agent's default --cwd: the process's working
// directory ("" when unknown).
func workingDir() string {
	dir, _ := os.Getwd()
	return dir
}
