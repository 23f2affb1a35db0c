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
	// --skills_dir): read-write, whatever the hardening.
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
ExecStart=%s
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

// EnvFile returns the environment file of the unit: the variables the
// agent reads its settings from (FLEET_POLICY, FLEET_NATS_URL), sorted,
// with a comment on how to change them.
func EnvFile(vars map[string]string) ([]byte, error) {
	var b strings.Builder
	b.WriteString(`# fleet-agent's environment, read by fleet-agent.service (written by
# fleet-agent install; after editing, systemctl restart fleet-agent).
# FLEET_POLICY is the host policy file; FLEET_NATS_URL overrides the NATS
# URLs the agent was given when it enrolled.
`)
	if _, ok := vars["FLEET_POLICY"]; !ok {
		b.WriteString("#FLEET_POLICY=/etc/fleetmcp/policy.yaml\n")
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		v := vars[k]
		if k == "" || strings.Trim(k, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != "" {
			return nil, fmt.Errorf("environment variable name %q", k)
		}
		if strings.ContainsAny(v, "\x00\n\r") {
			return nil, fmt.Errorf("%s: a value with a line break or NUL", k)
		}
		r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`, "`", "\\`")
		fmt.Fprintf(&b, "%s=\"%s\"\n", k, r.Replace(v))
	}
	return []byte(b.String()), nil
}
