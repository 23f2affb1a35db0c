// Package integration runs the whole fleet in one test process: a NATS
// server, the gateway and any number of agents (in-process or as real
// fleet-agent processes), driven by the go-sdk MCP client over real HTTP.
// End-to-end scenarios and benchmarks live here, along with the test that
// enforces the module's import rules.
package integration
