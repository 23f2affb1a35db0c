// Package service runs fleet-agent as a system service and writes the
// definitions that register it: a launchd property list on macOS and a
// Windows service configuration. It exists so that installing the agent
// is a matter of calling plain functions whose output is tested on any
// system, with the calls into the operating system (the Windows service
// control manager) kept to a thin file behind build tags.
//
// It imports nothing from the module but keeps to the agent's rules: no
// nats-server, go-oidc or MCP SDK.
package service
