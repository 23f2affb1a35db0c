// Package gateway is the fleet's control plane: the MCP endpoint AI clients
// talk to, the host registry, and the router that turns each tool call into
// a call over NATS to the agent on the target host. It is also where
// callers are authenticated and their access decided, and where every call
// is recorded.
//
// One file per concern: config; embedded NATS (natsserver.go,
// natsembedded.go) or an external cluster (natsexternal.go, and
// natssetup.go for its setup); the agents' NATS identities: the operator
// mode keys (natskeys.go), the authority that issues credentials and
// pushes revocations (natsauth.go, revocation.go), the agent records
// (agents.go, internal/jskv) and enrolment (agentadmin.go), the fleet CA
// (tlsca.go); the fleet API listener (fleetapi.go), where hosts enrol and
// recover with join tokens (enrol.go, tokens.go) and operators use the
// admin API (admin.go), and renewal over NATS (renew.go); registry; router; the MCP surface (mcp.go) and its tools;
// auth.go, jwt.go and apitokens.go, the bearer tokens a caller may
// present; access.go and accessfile.go, the caller access rules (host
// selectors are policy.Selector); guard.go, the MCP middleware that
// applies the rules and writes the audit trail (audit.go, auditread.go,
// redact.go); and result.go, the one place where failures become MCP tool
// errors or JSON-RPC errors. Running it: reload.go (what SIGHUP reloads),
// health.go (/healthz, /readyz), metrics.go (Prometheus), cors.go,
// authevents.go and sdklog.go (what is logged). It must not import the
// agent package.
package gateway
