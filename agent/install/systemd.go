package install

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Unit describes the systemd service of an installed agent.
type Unit struct {
	// User runs the agent (and every command it runs).
	User string
	// Executable, StateDir and EnvFile are the paths on the installed
	// system (not under the install's prefix).
	Executable, StateDir, EnvFile string
	// Args are the agent's flags beyond --state_dir.
	Args []string
	// WorkDirs are the directories the agent works in (--cwd,
	// --skills_dir, --fleet_skills_dir): read-write, whatever the
	// hardening.
	WorkDirs []string
	// DrainTimeout is the agent's --drain_timeout.
	DrainTimeout time.Duration
}

// homeDirs are the directories ProtectHome= covers.
var homeDirs = []string{"/home", "/root", "/run/user"}

// Render returns the unit file.
func (u *Unit) Render() ([]byte, error) {
	exec, err := systemdCommand(append([]string{u.Executable, "--state_dir", u.StateDir}, u.Args...))
	if err != nil {
		return nil, err
	}
	if strings.ContainsAny(u.User+u.EnvFile, "\n\r") {
		return nil, errors.New("a user or path with a line break")
	}
	stateName, ok := strings.CutPrefix(u.StateDir, "/var/lib/")
	if !ok || stateName == "" || strings.Contains(stateName, "/") {
		return nil, fmt.Errorf("state directory %s is not directly under /var/lib (StateDirectory=)", u.StateDir)
	}
	var b strings.Builder
	b.WriteString(`# fleetmcp agent, written by fleet-agent install (run it again to change
# this file; edits here are overwritten). The agent dials out to NATS only
# and runs the fleet's tool calls (files, bash) with the rights of its user.
[Unit]
Description=fleetmcp agent
After=network-online.target
Wants=network-online.target

[Service]
`)
	fmt.Fprintf(&b, "User=%s\n", u.User)
	fmt.Fprintf(&b, "EnvironmentFile=-%s\n", u.EnvFile)
	fmt.Fprintf(&b, `# The identity (key, credential, enrolment) lives in the state directory;
# systemd keeps it owned by the agent's user, and private.
StateDirectory=%s
StateDirectoryMode=0700
# FLEET_AGENT_FLAGS (the policy, the NATS URLs) comes from the
# environment file.
ExecStart=%s $FLEET_AGENT_FLAGS
`, stateName, exec)
	fmt.Fprintf(&b, `# SIGTERM drains: in-flight calls get up to --drain_timeout to finish.
KillSignal=SIGTERM
TimeoutStopSec=%d
# Background tasks (bash with background: true) must outlive a restart:
# the next agent re-attaches to them. KillMode=mixed or control-group would
# kill them at every restart.
KillMode=process
Restart=always
RestartSec=5
RestartPreventExitStatus=77
`, int((u.DrainTimeout + 15*time.Second).Seconds()))
	if u.User == "root" {
		b.WriteString(`# Run as root, the agent administers this machine: no sandboxing, which
# would take away what it is for. Choose a user of its own to limit it.
`)
	} else {
		u.hardening(&b)
	}
	b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	return []byte(b.String()), nil
}

// hardening writes the sandboxing of an agent that runs as a user of its
// own. The agent's job is to run commands on this machine, so nothing
// that commands legitimately use is taken away: the network, /tmp shared
// with the machine (PrivateTmp would also lose background tasks' files at
// a restart), the user's writable directories, other processes. What is
// taken away is what an unprivileged user has no business with anyway, so
// it costs nothing and closes doors a bug in some setuid program might
// open.
func (u *Unit) hardening(b *strings.Builder) {
	b.WriteString(`# Hardening. The agent's user gains no privileges through setuid programs
# (sudo, su): grant the agent more by running it as a user with the rights
# it needs, not through sudo rules, or remove NoNewPrivileges.
NoNewPrivileges=yes
RestrictSUIDSGID=yes
# /usr, /boot and /etc are read-only (the user cannot write them anyway);
# the rest of the file system is as the user's rights make it.
ProtectSystem=full
`)
	if u.worksInHome() {
		b.WriteString("# ProtectHome is off: the agent works under a home directory (--cwd, --skills_dir).\n")
	} else {
		b.WriteString("# Home directories are read-only to the agent's commands (it works elsewhere;\n# set --cwd under /home and install again to lift this).\nProtectHome=read-only\n")
	}
	b.WriteString(`# Kernel settings, modules, control groups and the clock stay the
# system's.
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
ProtectClock=yes
LockPersonality=yes
RestrictRealtime=yes
`)
}

// worksInHome reports whether a work directory is under a home
// directory.
func (u *Unit) worksInHome() bool {
	for _, d := range u.WorkDirs {
		for _, h := range homeDirs {
			if d == h || strings.HasPrefix(d, h+"/") {
				return true
			}
		}
	}
	return false
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
