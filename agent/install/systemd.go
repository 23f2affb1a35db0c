package install

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// packagedUnit is the unit of the fleet-agent package
// (deploy/systemd/fleet-agent.service, of which this is a copy kept equal
// by TestPackagedUnitIsTheDeployOne). The unit install writes is made from
// it: one definition, one sandbox, one working directory.
//
//go:embed fleet-agent.service
var packagedUnit []byte

// The packaged unit's paths and user, which install's unit changes.
const (
	packagedExecStart = "/usr/bin/fleet-agent --state_dir /var/lib/fleetmcp-agent $FLEET_AGENT_FLAGS"
	packagedStateDir  = "/var/lib/fleetmcp-agent"
)

// installHeader starts every unit install writes: a unit without it is
// not install's to replace or remove.
const installHeader = "# fleetmcp agent, written by fleet-agent install"

// Unit describes the systemd service of an installed agent: the packaged
// unit with another executable, user, flags or drain timeout.
type Unit struct {
	// User runs the agent (and every command it runs).
	User string
	// Executable is the path of fleet-agent on the installed system (not
	// under the install's prefix).
	Executable string
	// Args are the agent's flags beyond --state_dir.
	Args []string
	// DrainTimeout is the agent's --drain_timeout.
	DrainTimeout time.Duration
}

// Render returns the unit file: the packaged unit, whose state and home
// directories, working directory, environment file, restart rules and
// sandbox it keeps, with a header saying who wrote it, and the user, the
// ExecStart and the stop timeout install was given.
func (u *Unit) Render() ([]byte, error) {
	if strings.ContainsAny(u.User, "\n\r") {
		return nil, errors.New("a user with a line break")
	}
	exec, err := systemdCommand(append([]string{u.Executable, "--state_dir", packagedStateDir}, u.Args...))
	if err != nil {
		return nil, err
	}
	body, ok := bytes.CutPrefix(packagedUnit, packagedHeader(packagedUnit))
	if !ok {
		return nil, errors.New("the packaged unit has no header")
	}
	lines := strings.SplitAfter(string(body), "\n")
	replace := map[string]string{
		"User=" + DefaultUser:            "User=" + u.User,
		"Group=" + DefaultUser:           "",
		"ExecStart=" + packagedExecStart: "ExecStart=" + exec + " $FLEET_AGENT_FLAGS",
		"TimeoutStopSec=45":              fmt.Sprintf("TimeoutStopSec=%d", int((u.DrainTimeout + 15*time.Second).Seconds())),
	}
	if u.User == DefaultUser {
		// The package's user has a group of its name.
		replace["Group="+DefaultUser] = "Group=" + DefaultUser
	}
	found := map[string]int{}
	var b strings.Builder
	b.WriteString(installHeader + ` from the unit of the
# fleet-agent package (run install again to change it; edits here are
# overwritten: put yours in a drop-in, systemctl edit fleet-agent). Only
# User, ExecStart and TimeoutStopSec differ from the package's; its
# comments below say what the rest is for.
`)
	for _, l := range lines {
		key := strings.TrimSuffix(l, "\n")
		if r, ok := replace[key]; ok {
			found[key]++
			if r == "" {
				continue
			}
			l = r + "\n"
		}
		b.WriteString(l)
	}
	for k := range replace {
		if found[k] != 1 {
			return nil, fmt.Errorf("the packaged unit has %q %d times, not once: install cannot make its unit from it", k, found[k])
		}
	}
	return []byte(b.String()), nil
}

// packagedHeader returns the comment lines the packaged unit starts with.
func packagedHeader(unit []byte) []byte {
	i := bytes.Index(unit, []byte("\n[Unit]\n"))
	if i < 0 {
		return nil
	}
	return unit[:i+1]
}

// systemdCommand quotes args for ExecStart=: an argument that is not
// plain is double-quoted with C escapes; "%" (a specifier) and "$" (a
// variable) are doubled. The executable must be an absolute path (a
// leading "-", "@", "+", "!" or ":" would change its meaning).
func systemdCommand(args []string) (string, error) {
	if len(args) == 0 || !strings.HasPrefix(args[0], "/") {
		return "", fmt.Errorf("executable %q: want an absolute path", args)
	}
	const plain = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,@+-"
	quote := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\t", `\t`)
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "\x00\n\r") {
			return "", fmt.Errorf("argument %q: a line break or NUL cannot be passed through a systemd unit", a)
		}
		if a != "" && strings.Trim(a, plain) == "" {
			out[i] = a
			continue
		}
		a = strings.ReplaceAll(strings.ReplaceAll(a, "%", "%%"), "$", "$$")
		out[i] = `"` + quote.Replace(a) + `"`
	}
	return strings.Join(out, " "), nil
}

// envFlags are the settings install keeps in the environment file, by
// the variable the agent also reads them from, and the flag the
// environment file passes them as.
var envFlags = map[string]string{"FLEET_POLICY": "--policy", "FLEET_NATS_URL": "--nats"}

// EnvFile returns the environment file of the unit, in the format of the
// package's (deploy/systemd/fleet-agent.env): FLEET_AGENT_FLAGS, the
// agent flags that are the host's to change (the policy, the NATS URLs),
// which the unit's ExecStart expands and systemd splits at whitespace.
// vars are those settings by variable (FLEET_POLICY, FLEET_NATS_URL); a
// value systemd would split, or one with a line break, is refused.
func EnvFile(vars map[string]string) ([]byte, error) {
	var flags []string
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		flag, ok := envFlags[k]
		if !ok {
			return nil, fmt.Errorf("environment variable %q: the environment file holds only %s", k, strings.Join(slices.Sorted(maps.Keys(envFlags)), " and "))
		}
		v := vars[k]
		if v == "" || strings.ContainsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == 0 }) {
			return nil, fmt.Errorf("%s %q: systemd splits FLEET_AGENT_FLAGS at whitespace; give a value without spaces (move the file to a path without them)", flag, v)
		}
		flags = append(flags, flag, v)
	}
	var b strings.Builder
	b.WriteString(`# /etc/fleetmcp/agent.env — read by fleet-agent.service (by systemd, as
# root: keep it 0600). Written by fleet-agent install, which keeps the
# agent's other flags in the unit; after editing, systemctl restart
# fleet-agent.
#
# Flags of fleet-agent (see fleet-agent -h), split on whitespace. The
# host's name, labels and NATS URLs come from its enrolment; there is no
# flag for labels: the gateway's operator sets them. --nats overrides the
# NATS URLs the agent got when it enrolled.
`)
	if len(flags) == 0 {
		b.WriteString("#FLEET_AGENT_FLAGS=--policy /etc/fleetmcp/policy.yaml\n")
		return []byte(b.String()), nil
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`")
	fmt.Fprintf(&b, "FLEET_AGENT_FLAGS=\"%s\"\n", r.Replace(strings.Join(flags, " ")))
	return []byte(b.String()), nil
}
