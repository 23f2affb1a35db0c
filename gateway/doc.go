// Package gateway is the fleet's control plane: the MCP endpoint AI clients
// talk to, the host registry, and the router that turns each tool call into
// a call over NATS to the agent on the target host.
//
// One file per concern: config, embedded NATS, registry, router, the MCP
// surface and its tools, and result.go, the one place where failures become
// MCP tool errors or JSON-RPC errors. It must not import the agent package.
package gateway
