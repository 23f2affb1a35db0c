// Package natsauth is the fleet's NATS authority: the operator and
// account keys the gateway keeps in its data directory, the agents' NATS
// credentials and their revocation, the embedded NATS server and the
// cluster it may be a node of, the setup of an external cluster, and the
// fleet CA that signs the certificates of the gateway's listeners.
//
// It is the only package of the gateway that imports nats-server. It
// must not import the gateway package: what it needs of the rest (the
// records that say which keys are revoked, their seal, the logger) the
// gateway hands it as small interfaces and function values.
package natsauth
