// Package install installs fleet-agent as a system service on the machine
// it runs on (fleet-agent install): the binary, a system user, the state
// directory with the identity the machine enrols with, and the service
// definition (a systemd unit and an environment file on Linux, a launchd
// daemon on macOS, a Windows service), enabled and started.
//
// Before it enrols (and spends the join token) it checks everything it
// needs: root, the service manager, the user, the paths it writes; a
// failed check is a *PreflightError and changes nothing. The systemd unit
// is the fleet-agent package's (embedded, kept equal to
// deploy/systemd/fleet-agent.service by a test) with another user,
// ExecStart and stop timeout; beside the installed package, install
// writes none of its own and uses the package's.
//
// Everything is written only when it differs from what is there, so a
// second install changes nothing and keeps the identity; every path is
// under Options.Prefix, so that an install into a directory tree can be
// tested without root or systemd. The parts that call into the system
// (useradd, systemctl, launchctl, the service control manager) sit
// behind build tags; what they write is made by plain functions tested
// on any system.
//
// It imports nothing of the module but protocol, agent/identity and
// agent/service, and keeps to the agent's rules: no nats-server, go-oidc
// or MCP SDK.
package install
