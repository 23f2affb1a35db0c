// Package integration runs the whole fleet in one test process: a NATS
// server, the gateway and any number of agents (in-process or as real
// fleet-agent processes), driven by the go-sdk MCP client over real HTTP.
// Its non-test code is the harness (NewEnv, the helpers, gateway
// processes, NATS setups, network namespaces) that its own end-to-end
// tests and those of integration/ha, integration/netns and
// integration/load use; its tests also enforce the module's import
// rules.
package integration
