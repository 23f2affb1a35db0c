package protocol

import "time"

// This file is the wire contract of the gateway's admin API (under
// AdminPath on the fleet API listener), which fleetctl speaks. Every
// request carries "Authorization: Bearer" with an admin API token or an
// OIDC token whose access rule says admin; errors are APIError.

// Admin API paths. Agent paths continue with "/NAME/revoke",
// "/NAME/labels" and "/NAME/allow-recovery"; a token's path with "/ID";
// a key's with "/KEY/revoke" (an agent's nkey user public key).
const (
	AdminTokensPath = AdminPath + "tokens"
	AdminAgentsPath = AdminPath + "agents"
	AdminKeysPath   = AdminPath + "keys"
	// AdminAuditPath (GET) queries the audit trail; its query
	// parameters are AuditFilter's fields (caller, host, tool,
	// decision, since, until, limit, receipt), its answer AuditAnswer.
	AdminAuditPath = AdminPath + "audit"
)

// AuditFilter are the audit trail's filters, as the query parameters of
// AdminAuditPath and the arguments of the audit tool name them: Caller
// is text in the caller's sub, email or client_id ("token NAME" for an
// API token); Decision allowed or denied; Since and Until an RFC 3339
// time or a duration back from now (1h); Limit the newest N records
// (default 50, at most 500); Receipt verified, problem or none.
var AuditFilter = []string{"caller", "host", "tool", "decision", "since", "until", "limit", "receipt"}

// AuditAnswer answers GET AdminAuditPath: the newest matching records,
// oldest first.
type AuditAnswer struct {
	Records []AuditEntry `json:"records"`
	// Scanned is how many records were read; Incomplete is set when
	// older records in the range were not (narrow it with until).
	Scanned    int  `json:"scanned"`
	Incomplete bool `json:"incomplete,omitempty"`
	// Unsealed counts the records whose seal does not hold.
	Unsealed int `json:"unsealed,omitempty"`
}

// AuditEntry is one audit record, as the admin API gives it (the
// gateway's record has more fields; these are the ones fleetctl shows).
type AuditEntry struct {
	Seq    uint64    `json:"seq,omitempty"`
	Time   time.Time `json:"time"`
	CallID string    `json:"call_id"`
	Caller struct {
		Kind     string `json:"kind"`
		Subject  string `json:"sub"`
		Email    string `json:"email,omitempty"`
		ClientID string `json:"client_id,omitempty"`
	} `json:"caller"`
	Tool       string         `json:"tool"`
	Hosts      []string       `json:"hosts,omitempty"`
	Target     string         `json:"target,omitempty"`
	Source     string         `json:"source,omitempty"`
	Args       map[string]any `json:"args,omitempty"`
	Decision   string         `json:"decision"`
	Rule       string         `json:"rule,omitempty"`
	Reason     string         `json:"reason,omitempty"`
	Outcome    string         `json:"outcome"`
	ExitCode   *int           `json:"exit_code,omitempty"`
	Error      string         `json:"error,omitempty"`
	DurationMS int64          `json:"duration_ms"`
	Unsealed   bool           `json:"unsealed,omitempty"`
	Receipt    *struct {
		Verified bool   `json:"verified"`
		Problem  string `json:"problem,omitempty"`
	} `json:"receipt,omitempty"`
}

// KeyRevokeResponse answers POST AdminKeysPath/KEY/revoke: the key
// revoked, and the host it was enrolled as or its live credential was
// issued for (empty: none known).
type KeyRevokeResponse struct {
	Key  string `json:"key"`
	Host string `json:"host,omitempty"`
}

// TokenCreateRequest is the body of POST AdminTokensPath.
type TokenCreateRequest struct {
	// Labels are given to every host that enrols with the token.
	Labels map[string]string `json:"labels,omitempty"`
	// TTL is how long the token may be used (Go duration, e.g. "1h";
	// default 1h, at most 30 days).
	TTL string `json:"ttl,omitempty"`
	// Uses is how many hosts may enrol with it (default 1).
	Uses int `json:"uses,omitempty"`
	// Name is the one host name it enrols; NamePattern a doublestar
	// pattern the name must match; neither: any valid name.
	Name        string `json:"name,omitempty"`
	NamePattern string `json:"name_pattern,omitempty"`
	// Replace is a host name the token may take over from another key,
	// even a revoked one (the old key is revoked).
	Replace string `json:"replace,omitempty"`
	// NATS makes the token usable over NATS too, for hosts that cannot
	// reach the fleet API: the answer's Token is then a NATS join token
	// (NATSJoinToken) holding an enrol credential for this token alone.
	NATS bool `json:"nats,omitempty"`
}

// Token states, as TokenInfo.State says them.
const (
	TokenActive  = "active"
	TokenExpired = "expired"
	TokenSpent   = "spent"
	TokenRevoked = "revoked"
	// TokenTampered: the token's record was put back from an old copy
	// by someone who can write the gateways' bucket; it is refused for
	// good.
	TokenTampered = "tampered"
)

// TokenInfo describes a join token (never its secret).
type TokenInfo struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Labels      map[string]string `json:"labels,omitempty"`
	Name        string            `json:"name,omitempty"`
	NamePattern string            `json:"name_pattern,omitempty"`
	Replace     string            `json:"replace,omitempty"`
	Uses        int               `json:"uses"`
	Used        int               `json:"used"`
	CreatedAt   time.Time         `json:"created_at"`
	CreatedBy   string            `json:"created_by,omitempty"`
	ExpiresAt   time.Time         `json:"expires_at"`
	RevokedAt   time.Time         `json:"revoked_at,omitzero"`
	RevokedBy   string            `json:"revoked_by,omitempty"`
	// NATS: the token has an enrol credential for NATS.
	NATS bool `json:"nats,omitempty"`
}

// TokenCreateResponse answers a token creation: the token itself (shown
// this once) and what to run on the host.
type TokenCreateResponse struct {
	Token string    `json:"token"`
	Info  TokenInfo `json:"info"`
	// GatewayURL is the fleet API URL hosts enrol at, CAPin the pin of
	// its CA.
	GatewayURL string `json:"gateway_url"`
	CAPin      string `json:"ca_pin"`
	// NATSURLs are the NATS URLs a host enrols at with a NATS token.
	NATSURLs []string `json:"nats_urls,omitempty"`
	// JoinCommand and InstallCommand are ready to paste on the host.
	JoinCommand    string `json:"join_command"`
	InstallCommand string `json:"install_command"`
}

// JoinCommands returns the commands that join a host with the token of
// resp, ready to paste but for the token itself: fleet-agent reads it
// from standard input (--token_file -), so that it shows neither in ps
// nor in a shell's history. A token for one name, or one that replaces a
// host, names the host; one for a pattern of names asks for the name.
func JoinCommands(resp *TokenCreateResponse) (join, install string) {
	args := "--gateway " + resp.GatewayURL
	if resp.Info.NATS && len(resp.NATSURLs) > 0 {
		args = "--nats " + resp.NATSURLs[0]
	}
	args += " --ca_pin " + resp.CAPin
	switch t := &resp.Info; {
	case t.Name != "":
		args += " --name " + t.Name
	case t.Replace != "":
		args += " --name " + t.Replace
	case t.NamePattern != "":
		// The host's own name may not match the pattern.
		args += " --name NAME"
	}
	args += " --token_file -"
	return "fleet-agent join " + args, "fleet-agent install " + args
}

// TokenList answers GET AdminTokensPath.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// AgentInfo describes an enrolled host.
type AgentInfo struct {
	Host                string            `json:"host"`
	PublicKey           string            `json:"public_key"`
	Labels              map[string]string `json:"labels,omitempty"`
	Facts               AgentFacts        `json:"facts,omitzero"`
	TokenID             string            `json:"token_id,omitempty"`
	EnrolledAt          time.Time         `json:"enrolled_at"`
	CredentialExpiresAt time.Time         `json:"credential_expires_at"`
	RevokedAt           time.Time         `json:"revoked_at,omitzero"`
	RevokedBy           string            `json:"revoked_by,omitempty"`
	RecoveriesLeft      int               `json:"recoveries_left"`
	// Online says whether the host is connected now.
	Online bool `json:"online"`
	// AgentVersion is the fleet-agent version the host last announced
	// (empty: not known, e.g. never connected since the gateway started
	// or forgotten after --hosts_retention).
	AgentVersion string `json:"agent_version,omitempty"`
}

// AgentList answers GET AdminAgentsPath.
type AgentList struct {
	Agents []AgentInfo `json:"agents"`
}

// LabelsRequest is the body of POST AdminAgentsPath/NAME/labels: Set
// adds or changes labels, Remove deletes them.
type LabelsRequest struct {
	Set    map[string]string `json:"set,omitempty"`
	Remove []string          `json:"remove,omitempty"`
}

// AllowRecoveryRequest is the body of POST
// AdminAgentsPath/NAME/allow-recovery: how many more recoveries the host
// may make (default 1).
type AllowRecoveryRequest struct {
	Count int `json:"count,omitempty"`
}
