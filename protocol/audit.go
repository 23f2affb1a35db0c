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

// RevokerSubject is where the gateways of an external NATS cluster ask
// its revoker (fleet-gateway nats-revoker, which alone holds the
// operator signing key) to add revocations to the fleet account; no
// agent may publish on it.
func RevokerSubject() string { return prefix + ".revoker" }

// RevokerRequest asks the revoker to revoke keys (public user keys, with
// the Unix time from which credentials issued are revoked), each of
// which the revoked keys' ledger must hold already.
type RevokerRequest struct {
	Keys map[string]int64 `json:"keys"`
}

// RevokerAnswer is the revoker's answer: how many keys it added to the
// fleet account's revocations, or why it refused.
type RevokerAnswer struct {
	Added int    `json:"added"`
	Error string `json:"error,omitempty"`
}
