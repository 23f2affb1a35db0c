// Package protocol is the wire contract between the fleet gateway and its
// agents: message shapes, the protocol version, NATS subject builders, host-ID
// validation and the error-code enum.
//
// It exists so that both sides agree on one definition and so that no other
// package ever concatenates a subject string. It depends on the standard
// library only and must not import anything else from this module.
package protocol

// Version is the wire protocol version. It is part of every subject, so
// agents and gateways of different major versions never see each other's
// traffic. Bump it only for incompatible changes.
const Version = 1
