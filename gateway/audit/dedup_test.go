package audit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A message stored under a record's message ID before the record does not
// suppress it, whatever it is: the stream answers the record's publish
// "duplicate", the gateway reads the message back, finds it is not the
// record, reports it, and stores the record under a new ID. A record whose
// own first send was stored (its acknowledgement lost) is still stored
// once, and reported as nothing.
func TestAuditForeignMessageUnderRecordID(t *testing.T) {
	cases := []struct {
		name string
		// before stores what is under r's ID before r is sent.
		before  func(t *testing.T, a *Trail, js jetstream.JetStream, r *pendingRecord)
		copies  int    // of r's call ID in the stream afterwards
		damage  bool   // reported
		verify  string // problems verify names
		chained int    // records with a link
	}{{
		name: "junk under its ID",
		before: func(t *testing.T, a *Trail, js jetstream.JetStream, r *pendingRecord) {
			publish(t, js, &nats.Msg{Subject: protocol.AuditSubject(), Data: []byte(`{"call_id":"c1","tool":"bash","args":{"command":"true"}}`)}, pubOpts(r.msgID)...)
		},
		copies: 2, damage: true, verify: "unchained@2 unsealed@2", chained: 2,
	}, {
		// Its own publish, refused as its place was taken, seen on the
		// bus and stored again out of place.
		name: "its own message out of place",
		before: func(t *testing.T, a *Trail, js jetstream.JetStream, r *pendingRecord) {
			tail, err := a.chainTail()
			if err != nil {
				t.Fatal(err)
			}
			m, _ := a.chained(r, tail)
			publish(t, js, &nats.Msg{Subject: protocol.AuditSubject(), Data: []byte(`{"call_id":"other"}`)})
			publish(t, js, m, pubOpts(r.msgID)...)
			a.forgetTail()
		},
		copies: 2, damage: true, verify: "unchained@2 unsealed@2 broken_link@3", chained: 3,
	}, {
		name: "its own first send, acknowledgement lost",
		before: func(t *testing.T, a *Trail, js jetstream.JetStream, r *pendingRecord) {
			tail, err := a.chainTail()
			if err != nil {
				t.Fatal(err)
			}
			m, opts := a.chained(r, tail)
			publish(t, js, m, opts...)
			a.forgetTail()
		},
		copies: 1, damage: false, verify: "", chained: 2,
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newAuditServer(t)
			a := s.sealedAuditor(t, testSeal(t))
			js, ctx := adminStream(t, a.js.Conn())
			if err := a.Commit(ctx, &Record{CallID: "c0", Tool: "bash"}); err != nil {
				t.Fatal(err)
			}
			r := &pendingRecord{id: "c1", data: recordJSON("c1", "bash"), ticket: newTicket(), msgID: newAuditMsgID()}
			tc.before(t, a, js, r)
			a.pending.Add(1)
			if left := a.send([]*pendingRecord{r}); len(left) != 0 {
				t.Fatalf("the record was not stored")
			}
			if err := waitStored(ctx, time.Second, r.ticket); err != nil {
				t.Fatal(err)
			}
			if n := streamCount(t, a.js.Conn())["c1"]; n != tc.copies {
				t.Errorf("call c1 is %d times in the stream, want %d", n, tc.copies)
			}
			damages, n := a.Damages()
			if tc.damage != (n == 1) || tc.damage && !strings.Contains(damages[0].What, "under the message ID of the record of call c1") {
				t.Errorf("damage reported %d times, want %v: %+v", n, tc.damage, damages)
			}
			rep, err := a.VerifyChain(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got := problems(rep); got != tc.verify {
				t.Errorf("verify names %q, want %q\n%s", got, tc.verify, rep.Summary())
			}
			if rep.Chained != tc.chained {
				t.Errorf("%d chained records, want %d\n%s", rep.Chained, tc.chained, rep.Summary())
			}
		})
	}
}

func publish(t *testing.T, js jetstream.JetStream, m *nats.Msg, opts ...jetstream.PublishOpt) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(ctx, m, opts...); err != nil {
		t.Fatal(err)
	}
}
