package protocol

// The audit trail is not part of the agent contract: gateways publish one
// record per tool call to a JetStream stream, and agents have no
// permission to publish to it or to use JetStream at all, so a host
// cannot forge or erase what it was asked to do.

// AuditStream is the JetStream stream that holds the audit trail.
const AuditStream = "FLEET_AUDIT"

// AuditSubject is where gateways publish audit records.
func AuditSubject() string { return prefix + ".audit" }

// RevokedKeysSubject is where the gateways record every agent key they
// revoke (the revoked keys' ledger); no agent may publish on it.
func RevokedKeysSubject() string { return prefix + ".revoked" }
