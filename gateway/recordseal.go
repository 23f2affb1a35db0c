package gateway

import (
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/enrol"
)

// The audit records and the ledger of revoked keys are sealed as the
// agent records and join tokens are (enrol.Seal), each under a kind of
// its own.

// sealKind names what a record is.
type sealKind = enrol.SealKind

const (
	// sealAudit: an audit record, keyed by its call ID, its seal in the
	// message's auditSealHeader.
	sealAudit sealKind = "audit"
	// sealAuditChained: a chained audit record, its seal over its link
	// (auditPrevHeader) and its data (chainSealInput).
	sealAuditChained sealKind = "audit-chain"
)

// recordSeal seals and opens records (enrol.Seal).
type recordSeal struct{ s *enrol.Seal }

// newRecordSeal derives the sealing key from the agent signing key.
func newRecordSeal(agentSigner nkeys.KeyPair) (*recordSeal, error) {
	s, err := enrol.NewSeal(agentSigner)
	if err != nil {
		return nil, err
	}
	return &recordSeal{s: s}, nil
}

func (r *recordSeal) seal(kind sealKind, key string, v any) ([]byte, error) {
	return r.s.Seal(kind, key, v)
}

func (r *recordSeal) mark(kind sealKind, key string, data []byte) string {
	return r.s.Mark(kind, key, data)
}

func (r *recordSeal) holds(kind sealKind, key string, data []byte, mark string) bool {
	return r.s.Holds(kind, key, data, mark)
}
