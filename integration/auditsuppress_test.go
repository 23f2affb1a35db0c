package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// Someone holding the gateway's runtime credentials (which read every
// subject of the fleet's account and publish to the audit subject) tries
// to suppress a call's record through the stream's de-duplication: they
// watch the calls to the hosts, and while each runs store a forged record
// in the audit stream with the call's ID as its message ID, so that the
// gateway's own record would be dropped as a duplicate. The real record
// is stored anyway, sealed, and verify names the forged one as unsealed.
func TestAuditRecordNotSuppressedThroughDedup(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	mustOK(t, call(t, cs, "hosts", nil))

	gwCreds := filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)
	rogue, err := nats.Connect(env.NATSURL(), nats.UserCredentials(gwCreds), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	js, err := jetstream.New(rogue)
	if err != nil {
		t.Fatal(err)
	}
	forged := make(chan string, 16)
	sub, err := rogue.Subscribe(protocol.CallSubject("*"), func(m *nats.Msg) {
		id := m.Header.Get(protocol.HeaderCall)
		if id == "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		junk := fmt.Sprintf(`{"time":%q,"call_id":%q,"caller":{"kind":"local","sub":"nobody"},"tool":"bash","hosts":["alpha"],"args":{"command":"true"},"decision":"allowed","outcome":"ok"}`,
			time.Now().UTC().Format(time.RFC3339Nano), id)
		if _, err := js.Publish(ctx, protocol.AuditSubject(), []byte(junk), jetstream.WithMsgID(id)); err != nil {
			t.Errorf("store the forged record of call %s: %v", id, err)
			return
		}
		forged <- id
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}

	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "sleep 1; echo secret-work"}))
	var id string
	select {
	case id = <-forged:
	case <-time.After(5 * time.Second):
		t.Fatal("the rogue saw no call on the bus, or could not store its record")
	}

	res := call(t, cs, "audit", map[string]any{"verify": true, "limit": 500})
	out := mustOK(t, res)
	data, _ := json.Marshal(res.StructuredContent)
	var page struct {
		Records []audit.Record    `json:"records"`
		Chain   audit.ChainReport `json:"chain"`
	}
	if err := json.Unmarshal(data, &page); err != nil {
		t.Fatalf("audit structuredContent %s: %v", data, err)
	}
	var real, fake []audit.Record
	for _, r := range page.Records {
		if r.CallID != id {
			continue
		}
		if r.Unsealed {
			fake = append(fake, r)
		} else {
			real = append(real, r)
		}
	}
	if len(real) != 1 || !strings.Contains(fmt.Sprint(real[0].Args), "secret-work") || real[0].Caller.Subject == "nobody" {
		t.Fatalf("call %s: %d sealed records, want its own, once (%d unsealed):\n%s", id, len(real), len(fake), out)
	}
	if len(fake) != 1 {
		t.Fatalf("call %s: the forged record is not shown as unsealed (%d):\n%s", id, len(fake), out)
	}
	for _, p := range page.Chain.Problems {
		if p.Seq != fake[0].Seq || (p.Kind != "unsealed" && p.Kind != "unchained") {
			t.Errorf("verify names %s at seq %d (%s); want only the forged record, seq %d, as unsealed", p.Kind, p.Seq, p.Detail, fake[0].Seq)
		}
	}
	if !page.Chain.Intact && !strings.Contains(out, fmt.Sprintf("unsealed at seq %d", fake[0].Seq)) {
		t.Errorf("verify does not name the forged record, seq %d, as unsealed:\n%s", fake[0].Seq, out)
	}
}

// The same rogue, knowing that message IDs are no longer call IDs, takes
// them from the bus: it floods the audit subject so that the gateway's
// publishes lose their place in the chain and are refused, reads the
// message ID of every publish it sees there, refused or not, and stores
// junk under it at once, so that the gateway's next try is answered
// "duplicate". Every call's record is stored anyway, sealed, once; what
// was stored under a record's ID is counted as damage.
func TestAuditRecordNotSuppressedByStolenMsgID(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}, Gateway: func(c *gateway.Config) { c.Metrics = true }})
	cs := env.Client("", nil)
	mustOK(t, call(t, cs, "hosts", nil))
	base := strings.TrimSuffix(env.Gateway.MCPURL(), "/mcp")

	gwCreds := filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)
	rogue, err := nats.Connect(env.NATSURL(), nats.UserCredentials(gwCreds), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	junk := []byte(`{"call_id":"junk","caller":{"kind":"local","sub":"nobody"},"tool":"bash","decision":"allowed","outcome":"ok"}`)
	var stolen atomic.Int64
	sub, err := rogue.Subscribe(protocol.AuditSubject(), func(m *nats.Msg) {
		id := m.Header.Get(jetstream.MsgIDHeader)
		if id == "" || m.Header.Get("Rogue") != "" {
			return
		}
		stolen.Add(1)
		_ = rogue.PublishMsg(&nats.Msg{Subject: protocol.AuditSubject(), Data: junk, Header: nats.Header{jetstream.MsgIDHeader: {id}, "Rogue": {"1"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	stop := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = rogue.PublishMsg(&nats.Msg{Subject: protocol.AuditSubject(), Data: junk, Header: nats.Header{"Rogue": {"1"}}})
			}
		}
	}()
	const calls = 10
	for i := range calls {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": fmt.Sprintf("echo call-%d", i)}))
	}
	close(stop)
	<-flooded
	damage := scrape(t, base+"/metrics")["fleet_audit_damage_total"]
	t.Logf("the rogue stored junk under %d message IDs it saw; the gateway found %v under its records' IDs", stolen.Load(), damage)
	if damage == 0 {
		t.Error("no junk was found under a record's message ID: the attack did not reach the gateway's records")
	}

	recs := auditRecords(t, cs, map[string]any{"tool": "bash", "caller": "local", "limit": 500})
	sealed := map[string]int{}
	for _, r := range recs {
		if !r.Unsealed {
			sealed[fmt.Sprint(r.Args["command"])]++
		}
	}
	for i := range calls {
		if n := sealed[fmt.Sprintf("echo call-%d", i)]; n != 1 {
			t.Errorf("call %d has %d sealed records, want 1: %v", i, n, sealed)
		}
	}
}
