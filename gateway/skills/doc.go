// Package skills holds fleet-wide skill rollout: the skill store (files
// in a JetStream object store by SHA-256, signed manifests in a KV
// bucket), the rollout records and the controller that drives them from
// one elected gateway, the hosts' desired states and status reports,
// the serving of desired states, manifests and files to agents, the
// audit of skills hosts report tampered, and the signing again of stored
// records after a key rotation.
//
// It reaches the rest of the gateway through small interfaces: a Fleet
// (the enrolled hosts and which are online), a Signer (the gateway's
// signing key) and the functions of Options. It must import neither
// gateway nor gateway/access.
package skills
