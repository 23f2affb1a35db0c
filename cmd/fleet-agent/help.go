package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
)

// The synopses -h prints before the flags, and "fleet-agent help".

const rootSynopsis = `fleet-agent joins this machine to a fleetmcp fleet: it dials the gateway's
NATS servers (outbound only), announces the machine and runs the tool calls
the gateway routes to it, held to the host policy.

Usage:
  fleet-agent [flags]           run with the identity in --state_dir
  fleet-agent join [flags]      enrol with a gateway, then run: --gateway URL --ca_pin PIN --token_file - (or
                                --nats URL with a NATS join token); the command fleetctl token create prints
  fleet-agent install [flags]   install as a system service, enrolled (as root; same flags as join)
  fleet-agent doctor [flags]    check the state directory, identity, policy, gateway and NATS (exit 1 on a failure)
  fleet-agent help [COMMAND]    this text, or a command's
  fleet-agent --version         the version, commit, build date and Go version

"fleet-agent COMMAND -h" describes a command and its flags.

Flags:
`

const joinSynopsis = `Usage: fleet-agent join --gateway https://GATEWAY:8443 --ca_pin sha256:... [--name NAME] --token_file - [agent flags]
       fleet-agent join --nats tls://GATEWAY:4222 --ca_pin sha256:... [--name NAME] --token_file - [agent flags]

Enrol this machine with the gateway (its key is made here and never leaves
it; the gateway's CA pin is checked before the token is sent), then run the
agent as a plain start does. The join token comes from --token_file FILE,
standard input (--token_file -, asked for on a terminal) or FLEET_JOIN_TOKEN.
Run again on an enrolled machine, it sends nothing and just runs.

Flags:
`

const installSynopsis = `Usage: fleet-agent install --gateway https://GATEWAY:8443 --ca_pin sha256:... [--name NAME] --token_file - [flags]

As root: enrol this machine, and install the agent as a system service
(systemd, launchd or the Windows service manager) that runs as --user with
its state in %s. The agent's flags given here are written into
the service; --policy and --nats into its environment file.

Flags:
`

const doctorSynopsis = `Usage: fleet-agent doctor [flags]

Check, without starting an agent, what the agent of these flags needs: the
state directory and its permissions, the identity and credential, the host
policy, the gateway and NATS. One line per check; exit 1 when one fails.

Flags:
`

// setUsage makes fs's -h print synopsis, then the flags.
func setUsage(fs *flag.FlagSet, synopsis string) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), synopsis)
		fs.PrintDefaults()
	}
}

// runHelp prints the usage of fleet-agent or of one command to w.
func runHelp(args []string, getenv func(string) string, w io.Writer) error {
	fs := flag.NewFlagSet("fleet-agent", flag.ContinueOnError)
	fs.SetOutput(w)
	switch {
	case len(args) == 0:
		setUsage(fs, rootSynopsis)
		addRunFlags(fs, getenv)
		fs.Bool("version", false, "print the version, commit, build date and Go version, then exit")
	case len(args) == 1 && args[0] == "join":
		setUsage(fs, joinSynopsis)
		addJoinFlags(fs, getenv)
		addRunFlags(fs, getenv)
	case len(args) == 1 && args[0] == "install":
		// The whole install flag set is install's own.
		return asHelp(runInstall(context.Background(), []string{"-h"}, getenv, w))
	case len(args) == 1 && args[0] == "doctor":
		return asHelp(runDoctor(context.Background(), []string{"-h"}, getenv, w, w))
	default:
		return fmt.Errorf("help %s: fleet-agent has the commands join, install and doctor (see fleet-agent help)", strings.Join(args, " "))
	}
	fs.Usage()
	return nil
}

// asHelp turns the ErrHelp of a command's -h into success.
func asHelp(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// serviceStateDir is where fleet-agent install keeps the service's state
// on this system (as agent/install does).
func serviceStateDir(getenv func(string) string) string {
	switch runtime.GOOS {
	case "linux":
		return "/var/lib/fleetmcp-agent"
	case "darwin":
		return "/Library/Application Support/fleetmcp-agent"
	case "windows":
		return filepath.Join(cmp.Or(getenv("ProgramData"), `C:\ProgramData`), "fleetmcp-agent")
	}
	return "the service's state directory"
}

// installUsage shows install's real state directory as --state_dir's
// default (install chooses it; the flag is refused), and its synopsis.
func installUsage(fs *flag.FlagSet, getenv func(string) string) {
	dir := serviceStateDir(getenv)
	if f := fs.Lookup("state_dir"); f != nil {
		f.DefValue = dir
		f.Usage = "where the service keeps the agent's files: install chooses it, the flag is refused"
	}
	setUsage(fs, fmt.Sprintf(installSynopsis, dir))
}
