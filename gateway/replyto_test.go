package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

// An agent chooses the reply subject of the requests it sends the
// gateways, and the gateways answer with their own, unrestricted
// connection: a reply subject outside the agent's own inbox would make
// a gateway publish wherever the agent likes — on another host's call
// subject, into a KV bucket, or to the JetStream API (purging the agent
// records). Renewals and skill requests are answered on the agent's
// inbox only; any other reply subject gets no answer at all.
func TestAgentRequestsAnswerOnlyItsInbox(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	kp := newUser(t)
	first, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now()))
	if code != "" {
		t.Fatal(code)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), tok.Token, "web-2", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	nc := agentConn(t, gw, "web-1", kp, first)

	// What reaches other subjects is seen by a connection of the gateway's.
	tap := make(chan *nats.Msg, 16)
	for _, subj := range []string{protocol.HostSubjects("web-2"), "$KV." + protocol.SkillsDesiredBucket + ".>", "$JS.API.STREAM.PURGE.>"} {
		sub, err := gw.conns.nc.ChanSubscribe(subj, tap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := gw.conns.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	manifestReq, _ := json.Marshal(protocol.SkillManifestRequest{BundleID: "not-a-bundle"})
	blobReq, _ := json.Marshal(protocol.SkillBlobRequest{SHA256: "00", Offset: 0, Length: 1})
	for _, tc := range []struct{ name, subject, reply string }{
		{"renewal to another host's calls", protocol.RenewSubject("web-1"), protocol.CallSubject("web-2")},
		{"renewal to the JetStream API", protocol.RenewSubject("web-1"), "$JS.API.STREAM.PURGE.KV_" + protocol.AgentsBucket},
		{"manifest into a KV bucket", protocol.SkillsManifestSubject("web-1"), "$KV." + protocol.SkillsDesiredBucket + ".web-2"},
		{"blob to another host's calls", protocol.SkillsBlobSubject("web-1"), protocol.CallSubject("web-2")},
		{"manifest to another agent's inbox", protocol.SkillsManifestSubject("web-1"), protocol.AgentInboxPrefix("web-2") + ".x"},
		{"renewal to a look-alike inbox", protocol.RenewSubject("web-1"), protocol.AgentInboxPrefix("web-1") + "x.y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := renewReq(t, kp, "web-1", clock.now())
			switch tc.subject {
			case protocol.SkillsManifestSubject("web-1"):
				data = manifestReq
			case protocol.SkillsBlobSubject("web-1"):
				data = blobReq
			}
			if err := nc.PublishRequest(tc.subject, tc.reply, data); err != nil {
				t.Fatal(err)
			}
			// A request on the agent's own inbox afterwards is answered:
			// once it is, the one before was handled (or dropped).
			if _, err := nc.Request(protocol.SkillsManifestSubject("web-1"), manifestReq, 10*time.Second); err != nil {
				t.Fatalf("a request with the agent's own inbox: %v", err)
			}
			if _, err := nc.Request(protocol.RenewSubject("web-1"), renewReq(t, kp, "web-1", clock.now()), 10*time.Second); err != nil {
				t.Fatalf("a renewal with the agent's own inbox: %v", err)
			}
			if err := gw.conns.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			select {
			case m := <-tap:
				t.Errorf("the gateway published on %s for the agent: %.120q", m.Subject, m.Data)
			default:
			}
		})
	}
	if _, err := gw.Agent(context.Background(), "web-2"); err != nil {
		t.Errorf("web-2's record after the requests: %v", err)
	}
}

// subjectHost returns the host of fleet.v1.agent.HOST.skills.X.
func subjectHost(subject string) string {
	parts := strings.Split(subject, ".")
	if len(parts) != 6 {
		return ""
	}
	return parts[3]
}

// agentRequest sends a request on subject, fleet.v1.agent.HOST...., the
// way the agent of HOST does: with a reply subject under its own inbox,
// whatever nc's inbox prefix is. Gateways answer agents there only.
func agentRequest(nc *nats.Conn, subject string, data []byte, timeout time.Duration) (*nats.Msg, error) {
	host := subjectHost(subject)
	if host == "" {
		host, _ = renewSubjectHost(subject)
	}
	return gwtest.AgentRequest(nc, host, subject, data, timeout)
}

// renewSubjectHost returns the host of a renewal subject.
func renewSubjectHost(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, strings.TrimSuffix(protocol.RenewSubjectAll, "*.renew"))
	if !ok {
		return "", false
	}
	host, ok := strings.CutSuffix(rest, ".renew")
	return host, ok && protocol.ValidateHost(host) == nil
}
