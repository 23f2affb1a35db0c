// Package gateway is the fleet's control plane: the MCP endpoint AI clients
// talk to, the host registry, and the router that turns each tool call into
// a call over NATS to the agent on the target host. It is also where
// callers are authenticated and their access decided, and where every call
// is recorded.
//
// The gateway itself is the wiring and what no other package can hold:
// Start and Shutdown (gateway.go, natsconnect.go), Config, reload (SIGHUP),
// health and metrics; the MCP surface (mcp.go, tools, fan-out, the guard
// that applies access and writes the audit trail, result.go where failures
// become MCP errors); the host registry and store, the router and its
// signed calls, bounded transfers; and the HTTP APIs (fleetapi.go,
// admin.go, skillsapi.go). The Gateway struct holds its state in five
// documented parts: NATS connections, subsystems, call handling, serving
// and lifecycle.
//
// The rest lives in subpackages, which the gateway wires together:
//
//	gateway/access          authentication (JWT, API tokens), access rules, grants, rate limits
//	gateway/audit           the audit trail: records, commit, reading, redaction, seals
//	gateway/enrol           join tokens, enrolment, recovery, renewal, agent records
//	gateway/natsauth        operator mode keys, agent credentials, revocation, the
//	                        embedded server and cluster setup, the fleet CA
//	gateway/signing         the gateway's signing keys, their rotation, the key sets
//	                        agents get, and the envelopes of calls
//	gateway/skills          the skill store, rollouts, manifest and blob serving
//	gateway/internal/jskv   the JetStream key-value helpers
//	gateway/internal/...    small shared helpers (files, listening, log limits,
//	                        record seals, text)
//
// Import rules (integration/deps_test.go checks them): no subpackage
// imports gateway; access, audit, enrol, natsauth and signing import no
// other gateway package but gateway/internal/...; skills imports neither
// gateway nor access; gateway/internal/... imports nothing of the module
// (jskv only protocol); only natsauth imports the NATS server. It must not
// import the agent package.
package gateway
