//go:build windows

package install

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/windows"
	"golang.org/x/sys/windows/svc"
	"golang.org/x/sys/windows/svc/mgr"

	"github.com/fleetmcp/fleetmcp/agent/service"
)

// windowsService is the name the agent is registered under.
const windowsService = "fleet-agent"

// windowsPaths returns where the agent is installed: the binary under
// Program Files, the state under ProgramData.
func windowsPaths(o *Options) (bin, stateDir string) {
	pf := os.Getenv("ProgramFiles")
	if pf == "" {
		pf = `C:\Program Files`
	}
	pd := os.Getenv("ProgramData")
	if pd == "" {
		pd = `C:\ProgramData`
	}
	if !o.system() {
		pf, pd = o.path("Program Files"), o.path("ProgramData")
	}
	return filepath.Join(pf, "fleetmcp", "fleet-agent.exe"), filepath.Join(pd, "fleetmcp-agent")
}

// stateDACL gives the state directory to SYSTEM and the Administrators
// alone, not inherited from ProgramData (which every user may read).
const stateDACL = "D:P(A;OICI;FA;;;SY)(A;OICI;FA;;;BA)"

// install registers the agent as a Windows service running as
// LocalSystem (or --user, an account without a password such as
// "NT AUTHORITY\LocalService"), started automatically after boot.
func install(ctx context.Context, o *Options) error {
	bin, stateDir := windowsPaths(o)
	// The service control manager is asked before the token is spent.
	if o.system() && !o.NoStart {
		m, err := mgr.Connect()
		if err != nil {
			return preflight([]error{fmt.Errorf("the service control manager: %w (run as an administrator)", err)})
		}
		m.Disconnect()
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	if o.system() {
		if err := protect(stateDir); err != nil {
			return fmt.Errorf("make %s private: %w", stateDir, err)
		}
	}
	enrolled, err := o.enrol(ctx, stateDir)
	if err != nil {
		return err
	}
	if o.system() {
		// Windows does not replace the executable of a running process:
		// a service that runs an older binary is stopped first.
		if same, err := sameContent(o.Executable, bin); err == nil && !same {
			if err := stopInstalled(); err != nil {
				return err
			}
		}
	}
	c, err := copyIfChanged(o.Executable, bin, 0o755)
	if err != nil {
		return fmt.Errorf("install the binary: %w", err)
	}
	o.step("binary", bin, c)
	user := o.User
	if user == DefaultUser {
		user = "" // LocalSystem
	}
	args := append([]string{"--state_dir", stateDir}, o.Args...)
	// Services start in System32, where --skills_dir would become
	// System32\.agents\skills: without a --cwd the agent works in a
	// directory of its own beside its state.
	if !slices.ContainsFunc(o.Args, func(a string) bool { return a == "--cwd" || strings.HasPrefix(a, "--cwd=") }) {
		work := filepath.Join(filepath.Dir(stateDir), "fleetmcp-agent-home")
		if err := os.MkdirAll(work, 0o700); err != nil {
			return afterEnrolment(err)
		}
		args = append(args, "--cwd", work)
	}
	for _, k := range slices.Sorted(maps.Keys(o.Env)) {
		switch v := o.Env[k]; k {
		case "FLEET_POLICY":
			args = append(args, "--policy", v)
		case "FLEET_NATS_URL":
			args = append(args, "--nats", v)
		}
	}
	def, err := service.WindowsService(service.Definition{Name: windowsService, Executable: bin, Args: args, User: user, DrainTimeout: o.DrainTimeout})
	if err != nil {
		return err
	}
	if o.NoStart || !o.system() {
		o.say("service: not registered (--no_start or --prefix); command line: %s", def.CommandLine)
		return nil
	}
	if err := register(def, enrolled || c); err != nil {
		return afterEnrolment(err)
	}
	return nil
}

// dirWritable: Windows access rules are checked by the write itself.
func dirWritable(string) bool { return true }

// register creates or updates the service and starts it (restarting it
// when its files changed).
func register(def service.WindowsConfig, changed bool) error {
	m, err := mgr.Connect()
	if err != nil {
		return fmt.Errorf("the service control manager: %w (run as an administrator)", err)
	}
	defer m.Disconnect()
	cfg := mgr.Config{DisplayName: def.DisplayName, Description: def.Description, StartType: mgr.StartAutomatic,
		DelayedAutoStart: def.DelayedAutoStart, ServiceStartName: def.ServiceStartName}
	s, err := m.OpenService(def.Name)
	if err == nil {
		old, err := s.Config()
		if err != nil {
			s.Close()
			return err
		}
		if old.BinaryPathName != def.CommandLine {
			changed = true
		}
		old.BinaryPathName, old.DisplayName, old.Description = def.CommandLine, def.DisplayName, def.Description
		old.StartType, old.DelayedAutoStart, old.ServiceStartName = mgr.StartAutomatic, def.DelayedAutoStart, def.ServiceStartName
		err = s.UpdateConfig(old)
		if err != nil {
			s.Close()
			return fmt.Errorf("update the service: %w", err)
		}
	} else {
		s, err = m.CreateService(def.Name, def.Executable, cfg, def.Args...)
		if err != nil {
			return fmt.Errorf("create the service: %w", err)
		}
	}
	defer s.Close()
	var actions []mgr.RecoveryAction
	for _, d := range def.RestartDelays {
		actions = append(actions, mgr.RecoveryAction{Type: mgr.ServiceRestart, Delay: d})
	}
	if err := s.SetRecoveryActions(actions, uint32(def.ResetPeriod/time.Second)); err != nil {
		return fmt.Errorf("set the service's recovery: %w", err)
	}
	if changed {
		if err := stopService(s, def.StopWaitHint); err != nil {
			return err
		}
	}
	if err := s.Start(); err != nil && !errors.Is(err, windows.ERROR_SERVICE_ALREADY_RUNNING) {
		return fmt.Errorf("start the service: %w", err)
	}
	return nil
}

// stopInstalled stops the agent's service, if it is registered, so that
// its binary can be replaced.
func stopInstalled() error {
	m, err := mgr.Connect()
	if err != nil {
		return fmt.Errorf("the service control manager: %w (run as an administrator)", err)
	}
	defer m.Disconnect()
	s, err := m.OpenService(windowsService)
	if err != nil {
		return nil // not registered yet
	}
	defer s.Close()
	return stopService(s, 45*time.Second)
}

// stopService stops s, if it runs, and waits until it has stopped (the
// agent drains first), at most wait.
func stopService(s *mgr.Service, wait time.Duration) error {
	st, err := s.Query()
	if err != nil || st.State == svc.Stopped {
		return err
	}
	if _, err := s.Control(svc.Stop); err != nil {
		return fmt.Errorf("stop the service to restart it: %w", err)
	}
	deadline := time.Now().Add(wait)
	for st.State != svc.Stopped {
		if time.Now().After(deadline) {
			return fmt.Errorf("the service did not stop within %s", wait)
		}
		time.Sleep(300 * time.Millisecond) // the service control manager has no wait call
		if st, err = s.Query(); err != nil {
			return err
		}
	}
	return nil
}

// protect sets stateDACL on dir.
func protect(dir string) error {
	sd, err := windows.SecurityDescriptorFromString(stateDACL)
	if err != nil {
		return err
	}
	dacl, _, err := sd.DACL()
	if err != nil {
		return err
	}
	return windows.SetNamedSecurityInfo(dir, windows.SE_FILE_OBJECT,
		windows.DACL_SECURITY_INFORMATION|windows.PROTECTED_DACL_SECURITY_INFORMATION, nil, nil, dacl, nil)
}
