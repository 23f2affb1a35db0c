package audit

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file keeps the stream's de-duplication from being turned against
// the trail. JetStream drops a message whose ID it has stored within its
// duplicate window, and answers its publisher "duplicate", as if it were
// stored. Every user of the fleet's NATS account may publish to the audit
// subject (the gateways' users must), and may read the calls on the bus:
// were a record's message ID its call ID, such a user could store junk
// under a call's ID while the call runs, and the gateway's record would be
// dropped as a duplicate and taken for stored.
//
// So a record's message ID is random, made by the gateway that writes it
// and kept for its resends (a resend after a lost acknowledgement must
// still be dropped), and no one can know it before the record is first
// published. That is not enough alone: a publish the stream refused (its
// place in the chain taken) shows the ID on the bus before the record is
// stored. So whatever the stream answers "duplicate" to, or the search for
// a record finds, is read back and must be this record: its data, its
// seal, and its link naming the sequence just before it. Anything else
// under its ID is reported as damage (log, fleet_audit_damage_total,
// /readyz) and the record is stored under a new ID; the foreign message
// stays in the stream, and verify names it (unsealed, or out of place).

// newAuditMsgID returns a new message ID for a record: 130 random bits.
func newAuditMsgID() string {
	return rand.Text()
}

// holdsRecord reports whether the message at seq is r as this writer
// sent it: the same data, sealed by a gateway of this fleet (when records
// are sealed), and chained to the sequence just before it.
func (a *Trail) holdsRecord(r *pendingRecord, seq uint64) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
	defer cancel()
	m, err := a.stream.GetMsg(ctx, seq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read back the audit record stored under call %s's message ID at seq %d: %w", r.id, seq, err)
	}
	if !bytes.Equal(m.Data, r.data) {
		return false, nil
	}
	if a.seal != nil && !a.sealHolds(r.id, m.Data, m.Header) {
		return false, nil
	}
	l, err := parseChainLink(m.Header.Get(auditPrevHeader))
	return err == nil && l.seq+1 == seq, nil
}

// foreignUnderID reports a message at seq, found under r's message ID,
// that is not r, and gives r a new ID (and a new duplicate window), so
// that it is stored anyway.
func (a *Trail) foreignUnderID(r *pendingRecord, seq uint64, how string) {
	if r.foreign != seq {
		r.foreign = seq
		a.alarm(fmt.Sprintf("a message not written by this gateway was stored under the message ID of the record of call %s (seq %d), which would have suppressed it; the record is stored under a new ID", r.id, seq),
			how+", and the message stored under its ID is not this record",
			"", "a NATS user of the fleet's account published to the audit subject under a record's message ID: see README, Audit")
	}
	r.msgID, r.since = newAuditMsgID(), time.Now()
}

// checkFound marks stored each record of found that one of the messages
// found under its ID is, and gives the others a new ID.
func (a *Trail) checkFound(found map[*pendingRecord][]uint64) error {
	for r, seqs := range found {
		var foreign uint64
		for _, seq := range seqs {
			mine, err := a.holdsRecord(r, seq)
			if err != nil {
				return err
			}
			if mine {
				r.stored = true
				break
			}
			foreign = seq
		}
		if !r.stored {
			a.foreignUnderID(r, foreign, "the search for its message ID found a message")
		}
	}
	return nil
}
