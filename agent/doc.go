// Package agent is the fleet agent that runs on every machine: it dials
// NATS (outbound only), announces itself and heartbeats, takes tool calls
// addressed to its host, runs them in a bounded worker pool (files, bash)
// and streams output and one final result back. It enforces the host
// policy (package policy) on every call, whatever the gateway asks, and
// keeps its tools off its own files.
//
// It must not import the gateway, nats-server, go-oidc or the MCP SDK: the
// agent binary stays small and has no server surface of its own.
package agent
