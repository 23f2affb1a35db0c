package service

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Definition describes the agent as a service, whatever the system.
type Definition struct {
	// Name is the service's name: a launchd label in reverse-DNS form
	// ("io.fleetmcp.agent") or a Windows service name ("fleet-agent").
	// Letters, digits, ".", "-" and "_".
	Name string
	// DisplayName and Description are shown by the system's tools
	// (Windows only).
	DisplayName, Description string
	// Executable is the absolute path of fleet-agent.
	Executable string
	// Args are its arguments (flags such as --nats and --name).
	Args []string
	// WorkingDir is where it starts (launchd; Windows services start in
	// System32, so pass --cwd).
	WorkingDir string
	// Env adds environment variables, "NAME=value" (launchd; on Windows
	// use flags or the service's registry environment).
	Env []string
	// LogFile receives standard output and error (launchd).
	LogFile string
	// User runs the service ("" root on macOS, LocalSystem on Windows).
	User string
	// DrainTimeout is the agent's --drain_timeout: the system waits this
	// long, plus a margin, for the agent to stop before killing it.
	DrainTimeout time.Duration
}

// stopMargin is what the system waits beyond the drain timeout: calls
// still running then are cancelled, and abandoned 5 s later.
const stopMargin = 15 * time.Second

func (d *Definition) validate() error {
	var errs []error
	if d.Name == "" || strings.Trim(d.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != "" || len(d.Name) > 128 {
		errs = append(errs, fmt.Errorf("service name %q: use 1 to 128 letters, digits, '.', '-' and '_'", d.Name))
	}
	if !isAbs(d.Executable) {
		errs = append(errs, fmt.Errorf("executable %q: give an absolute path", d.Executable))
	}
	if d.WorkingDir != "" && !isAbs(d.WorkingDir) {
		errs = append(errs, fmt.Errorf("working directory %q: give an absolute path", d.WorkingDir))
	}
	for _, kv := range d.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			errs = append(errs, fmt.Errorf("environment entry %q: use NAME=value", kv))
		}
	}
	if d.DrainTimeout < 0 {
		errs = append(errs, errors.New("drain timeout must not be negative"))
	}
	for _, a := range append([]string{d.Name, d.Executable, d.WorkingDir, d.LogFile, d.User}, append(d.Args, d.Env...)...) {
		if strings.ContainsRune(a, 0) {
			errs = append(errs, fmt.Errorf("%q contains a NUL byte", a))
		}
	}
	return errors.Join(errs...)
}

// isAbs accepts absolute paths of either system, since definitions are
// made (and tested) on any.
func isAbs(p string) bool {
	return filepath.IsAbs(p) || strings.HasPrefix(p, "/") ||
		len(p) >= 3 && p[1] == ':' && (p[2] == '\\' || p[2] == '/')
}

// LaunchdPlist returns the launchd property list for d, to be written to
// /Library/LaunchDaemons/<Name>.plist (mode 0644, owned by root) and
// loaded with "launchctl bootstrap system <file>". The agent starts at
// boot and is restarted whenever it exits; on stop launchd sends SIGTERM,
// on which the agent drains, and waits DrainTimeout plus a margin.
// AbandonProcessGroup keeps background tasks running across a restart of
// the agent, as KillMode=process does with systemd.
func LaunchdPlist(d Definition) ([]byte, error) {
	if err := d.validate(); err != nil {
		return nil, fmt.Errorf("launchd plist: %w", err)
	}
	var b bytes.Buffer
	b.WriteString(xml.Header)
	b.WriteString(`<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">` + "\n")
	b.WriteString("<plist version=\"1.0\">\n<dict>\n")
	key := func(k string) { fmt.Fprintf(&b, "\t<key>%s</key>\n", esc(k)) }
	str := func(k, v string) {
		if v != "" {
			key(k)
			fmt.Fprintf(&b, "\t<string>%s</string>\n", esc(v))
		}
	}
	boolean := func(k string, v bool) {
		key(k)
		fmt.Fprintf(&b, "\t<%t/>\n", v)
	}
	str("Label", d.Name)
	key("ProgramArguments")
	b.WriteString("\t<array>\n")
	for _, a := range append([]string{d.Executable}, d.Args...) {
		fmt.Fprintf(&b, "\t\t<string>%s</string>\n", esc(a))
	}
	b.WriteString("\t</array>\n")
	str("WorkingDirectory", d.WorkingDir)
	str("UserName", d.User)
	if len(d.Env) > 0 {
		key("EnvironmentVariables")
		b.WriteString("\t<dict>\n")
		env := slices.Clone(d.Env)
		slices.Sort(env)
		for _, kv := range env {
			k, v, _ := strings.Cut(kv, "=")
			fmt.Fprintf(&b, "\t\t<key>%s</key>\n\t\t<string>%s</string>\n", esc(k), esc(v))
		}
		b.WriteString("\t</dict>\n")
	}
	boolean("RunAtLoad", true)
	boolean("KeepAlive", true)
	key("ThrottleInterval")
	b.WriteString("\t<integer>5</integer>\n")
	key("ExitTimeOut")
	fmt.Fprintf(&b, "\t<integer>%d</integer>\n", int((d.DrainTimeout + stopMargin).Seconds()))
	boolean("AbandonProcessGroup", true)
	str("ProcessType", "Background")
	str("StandardOutPath", d.LogFile)
	str("StandardErrorPath", d.LogFile)
	b.WriteString("</dict>\n</plist>\n")
	return b.Bytes(), nil
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// WindowsConfig is how the agent is registered with the Windows service
// control manager: the fields of mgr.Config and the arguments given to
// mgr.CreateService, and the recovery actions to set.
type WindowsConfig struct {
	Name, DisplayName, Description string
	// Executable and Args: mgr.CreateService(Name, Executable, config,
	// Args...) quotes them into the service's command line (CommandLine
	// shows the result).
	Executable string
	Args       []string
	// CommandLine is the service's BinaryPathName as Windows parses it.
	CommandLine string
	// StartAutomatic with DelayedAutoStart: the agent starts after boot
	// once the network is more likely to be up; it reconnects anyway.
	StartAutomatic, DelayedAutoStart bool
	// ServiceStartName is the account ("" LocalSystem).
	ServiceStartName string
	// RestartDelays are the recovery actions: restart after each delay,
	// the last one repeated, the failure count reset after ResetPeriod.
	RestartDelays []time.Duration
	ResetPeriod   time.Duration
	// StopWaitHint is how long the agent asks the service control
	// manager to wait while it drains.
	StopWaitHint time.Duration
}

// WindowsService returns the Windows service configuration for d. The
// service runs the agent under the service control manager (RunIfService
// in the agent's main), where a stop or a system shutdown drains it.
func WindowsService(d Definition) (WindowsConfig, error) {
	if err := d.validate(); err != nil {
		return WindowsConfig{}, fmt.Errorf("windows service: %w", err)
	}
	c := WindowsConfig{
		Name: d.Name, DisplayName: d.DisplayName, Description: d.Description,
		Executable: d.Executable, Args: slices.Clone(d.Args),
		CommandLine:    CommandLine(append([]string{d.Executable}, d.Args...)),
		StartAutomatic: true, DelayedAutoStart: true,
		ServiceStartName: d.User,
		RestartDelays:    []time.Duration{5 * time.Second, 10 * time.Second, 30 * time.Second},
		ResetPeriod:      24 * time.Hour,
		StopWaitHint:     d.DrainTimeout + stopMargin,
	}
	if c.DisplayName == "" {
		c.DisplayName = "fleetmcp agent (" + d.Name + ")"
	}
	if c.Description == "" {
		c.Description = "Joins this machine to a fleetmcp fleet: dials NATS and runs the tool calls the gateway routes to it."
	}
	return c, nil
}

// CommandLine quotes args into one Windows command line that the C
// runtime's (and Go's) argument parser splits back into args: the rules
// of syscall.EscapeArg, written out so that they are tested everywhere.
func CommandLine(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = escapeArg(a)
	}
	return strings.Join(quoted, " ")
}

func escapeArg(s string) string {
	if s == "" {
		return `""`
	}
	if !strings.ContainsAny(s, " \t\"") {
		return s
	}
	var b strings.Builder
	b.WriteByte('"')
	slashes := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			slashes++
		case '"':
			b.WriteString(strings.Repeat(`\`, slashes+1))
			slashes = 0
		default:
			slashes = 0
		}
		b.WriteByte(s[i])
	}
	b.WriteString(strings.Repeat(`\`, slashes))
	b.WriteByte('"')
	return b.String()
}
