package protocol

import (
	"fmt"
	"strings"
)

// Subject prefix shared by every fleet subject of this protocol version.
var prefix = fmt.Sprintf("fleet.v%d", Version)

// CallSubject is where the gateway publishes tool calls for host. Agents
// answer on the message's reply subject.
func CallSubject(host string) string { return prefix + ".host." + host + ".call" }

// CancelSubject is where the gateway publishes a Cancel for a running call
// on host.
func CancelSubject(host string) string { return prefix + ".host." + host + ".cancel" }

// FetchSubject is where the gateway asks host for a call's state again,
// when frames or the final result were lost on the way. The agent answers
// on the reply subject with the same frames a call produces.
func FetchSubject(host string) string { return prefix + ".host." + host + ".fetch" }

// HostSubjects matches every subject addressed to host.
func HostSubjects(host string) string { return prefix + ".host." + host + ".>" }

// PresenceSubject is where host publishes its Announce, at connect and on
// every heartbeat.
func PresenceSubject(host string) string { return prefix + ".presence." + host }

// PresenceWildcard matches the presence subjects of every host.
func PresenceWildcard() string { return prefix + ".presence.*" }

// AllPresence matches every presence subject; used for permissions.
func AllPresence() string { return prefix + ".presence.>" }

// DiscoverSubject is where a starting gateway asks every agent to announce
// itself at once instead of at its next heartbeat.
func DiscoverSubject() string { return prefix + ".discover" }

// AllHosts matches every host-addressed subject; used for permissions.
func AllHosts() string { return prefix + ".host.>" }

// AgentInboxPrefix is the inbox prefix an agent uses for its own requests, so
// that permissions can confine it to its own replies.
func AgentInboxPrefix(host string) string { return "_INBOX_" + host }

// HostFromPresence returns the host of a presence subject, or "" when
// subject is not one.
func HostFromPresence(subject string) string {
	host, ok := strings.CutPrefix(subject, prefix+".presence.")
	if !ok || ValidateHost(host) != nil {
		return ""
	}
	return host
}

// ReplySubject is the subject the frames of a gateway's calls to host are
// sent to: one token per host under the gateway's reply inbox. Every frame
// names its call (HeaderCall), so all calls to a host share the subject,
// and the NATS server keeps one reply permission and one routing cache
// entry per agent rather than one per call ever made.
func ReplySubject(inbox, host string) string { return inbox + "." + host }

// ReplyWildcard matches the reply subjects of every host under inbox.
func ReplyWildcard(inbox string) string { return inbox + ".*" }

// HostFromReply returns the host of a reply subject.
func HostFromReply(subject string) string {
	return subject[strings.LastIndexByte(subject, '.')+1:]
}

// GatewayInboxPrefix is the inbox prefix gateways use for call replies. Host
// IDs never start with '_', so no agent's prefix can equal it.
func GatewayInboxPrefix() string { return "_INBOX__gw" }

// KeysSubject is where the agent of host asks the gateways for the chain
// of gateway key sets (keyset.go; answer: KeySetChain, or an APIError).
func KeysSubject(host string) string { return prefix + ".agent." + host + ".keys" }

// KeysPushSubject is where a gateway pushes the key set chain to host.
func KeysPushSubject(host string) string { return prefix + ".host." + host + ".keys" }

// RefusedSubject is where the agent of host reports a message it refused
// (refusal.go).
func RefusedSubject(host string) string { return prefix + ".agent." + host + ".refused" }
