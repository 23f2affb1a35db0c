package protocol

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
)

// An agent's NATS identity is a user JWT whose name is its host ID. Its
// permissions are not in the JWT: they come from the template of the
// fleet account's agent signing key, where {{name()}} stands for the
// user's name. The functions below build both the template and the
// permissions it gives one host from the same subject builders, so the
// template, the documentation and the tests cannot drift apart.
// ValidateHost guarantees that a host ID holds none of '.', '*' or '>',
// so a permission built for a host never reaches another host.

// NameTemplate is what NATS replaces with the user JWT's name in the
// permission template of a scoped signing key.
const NameTemplate = "{{name()}}"

// AgentsBucket is the JetStream key-value bucket of agent records: one per
// enrolled host (key = host ID), with its public key, its labels and
// whether it was revoked. Only gateways use it; agents have no JetStream
// permissions.
const AgentsBucket = "fleet_agents"

// TokensBucket is the gateways' key-value bucket of the join tokens (key
// = token ID), with their uses and revocations. Only gateways use it.
const TokensBucket = "fleet_tokens"

// AgentSubjects matches every subject a host's agent publishes requests
// to the gateway on (credential renewal, for one).
func AgentSubjects(host string) string { return prefix + ".agent." + host + ".>" }

// AgentPublishAllow is what the agent of host may publish: its presence
// and its own requests to the gateway. Answers to the calls it receives
// are allowed by the response permission, not here. No JetStream API
// subject is ever allowed: JetStream answers on whatever reply subject the
// request names, so an agent could make it write anywhere.
func AgentPublishAllow(host string) []string {
	return []string{PresenceSubject(host), AgentSubjects(host)}
}

// AgentSubscribeAllow is what the agent of host may subscribe to: the
// calls, cancels and fetches addressed to its host, the gateway's
// discovery request, and replies to its own inbox prefix.
func AgentSubscribeAllow(host string) []string {
	return []string{HostSubjects(host), DiscoverSubject(), AgentInboxPrefix(host) + ".>"}
}

// IsAgentReply reports whether reply is a subject under host's own inbox
// (AgentInboxPrefix(host) and at least one more token, no wildcard). An
// agent chooses the reply subject of every request it sends, and a
// gateway answers with its own unrestricted connection: a gateway that
// answered on any other subject would publish wherever the agent asked
// (on another host's call subject, into a KV bucket, to the JetStream
// API). Gateways answer an agent's request only when this holds.
func IsAgentReply(host, reply string) bool { return IsReplyUnder(AgentInboxPrefix(host), reply) }

// IsReplyUnder reports whether reply is a subject under inboxPrefix (and
// at least one more token, no wildcard): the inbox of the client that may
// send the request, enrolling hosts' included (EnrolInboxPrefix).
func IsReplyUnder(inboxPrefix, reply string) bool {
	rest, ok := strings.CutPrefix(reply, inboxPrefix+".")
	if !ok || rest == "" {
		return false
	}
	for _, tok := range strings.Split(rest, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return true
}

// AgentPublishTemplate is AgentPublishAllow for the signing key's
// template: {{name()}} in place of the host.
func AgentPublishTemplate() []string { return AgentPublishAllow(NameTemplate) }

// AgentSubscribeTemplate is AgentSubscribeAllow for the signing key's
// template.
func AgentSubscribeTemplate() []string { return AgentSubscribeAllow(NameTemplate) }

// AgentSigningRole is the role of the fleet account's scoped signing key
// that issues agent credentials.
const AgentSigningRole = "agent"

// CAPinPrefix starts every CA pin.
const CAPinPrefix = "sha256:"

// CAPin identifies a CA certificate by its key: "sha256:" and the
// lowercase hex SHA-256 of its DER-encoded SubjectPublicKeyInfo, as
// kubeadm's discovery hash. A CA re-issued for the same key keeps its pin.
func CAPin(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return CAPinPrefix + hex.EncodeToString(sum[:])
}

// ValidCAPin reports whether pin has the form CAPin returns.
func ValidCAPin(pin string) bool {
	h, ok := strings.CutPrefix(pin, CAPinPrefix)
	if !ok || len(h) != 2*sha256.Size || strings.ToLower(h) != h {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// AgentFacts are what an agent reports about its machine when it
// enrols. They are shown to operators and never authorise anything:
// labels, which access rules and selectors use, come from the operator.
type AgentFacts struct {
	OS       string `json:"os,omitempty"`
	Arch     string `json:"arch,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
}
