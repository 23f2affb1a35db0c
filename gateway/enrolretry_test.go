package gateway

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A host whose enrolment answer was lost sends the same token again
// with the same key: it gets a credential for its record, and no use is
// spent. The retry is the key's alone and bounded: another key, another
// name, the host revoked, the token revoked, or the window over, and the
// spent token is refused as ever.
func TestEnrolRetryAfterLostAnswer(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, func(c *Config) { c.EnrolRetryWindow = 10 * time.Minute })
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Labels: map[string]string{"env": "prod"}, Name: "web-1"})
	kp := newUser(t)
	first, code := c.enrol(enrolReq(t, kp, tok.Token, "", c.pin, clock.now()))
	if code != "" {
		t.Fatalf("enrol: %s", code)
	}
	// The answer never reached the host; it asks again a minute later.
	clock.advance(time.Minute)
	again, code := c.enrol(enrolReq(t, kp, tok.Token, "", c.pin, clock.now()))
	if code != "" {
		t.Fatalf("the retry of the same key: %s", code)
	}
	if again.Host != "web-1" || again.Labels["env"] != "prod" || again.JWT == "" || again.JWT == first.JWT || !again.Expires.After(first.Expires) {
		t.Errorf("retry answer %+v", again)
	}
	if nc := agentConn(t, gw, "web-1", kp, again); !nc.IsConnected() {
		t.Error("the retried credential does not connect")
	}
	if ti := c.tokenInfo(tok.Info.ID); ti.Used != 1 || ti.State != protocol.TokenSpent {
		t.Errorf("token after the retry: %+v", ti)
	}
	rec, err := gw.Agent(context.Background(), "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.CredentialExpiresAt.Equal(again.Expires) {
		t.Errorf("record's credential expiry %s, the retry issued one to %s", rec.CredentialExpiresAt, again.Expires)
	}
	// With --name web-1 too (what the token gives); another name is
	// the ordinary path.
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, clock.now())); code != "" {
		t.Errorf("retry naming the host: %s", code)
	}
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-2", c.pin, clock.now())); code != protocol.APITokenSpent {
		t.Errorf("retry asking for another name: %q, want token_spent", code)
	}
	// Another key never gets anything from the spent token.
	if _, code := c.enrol(enrolReq(t, newUser(t), tok.Token, "", c.pin, clock.now())); code != protocol.APITokenSpent {
		t.Errorf("another key with the spent token: %q, want token_spent", code)
	}
	// The token's secret is checked: the right id with another secret.
	id, _, _ := protocol.ParseJoinToken(tok.Token)
	forged := protocol.TokenPrefix + "." + id + "." + base64.RawURLEncoding.EncodeToString(make([]byte, protocol.TokenSecretBytes))
	if _, code := c.enrol(enrolReq(t, kp, forged, "", c.pin, clock.now())); code != protocol.APITokenUnknown {
		t.Errorf("the key with another secret: %q, want token_unknown", code)
	}
	// The window is over: the key's retry is refused as spent.
	clock.advance(10 * time.Minute)
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "", c.pin, clock.now())); code != protocol.APITokenSpent {
		t.Errorf("a retry after the window: %q, want token_spent", code)
	}
	if ti := c.tokenInfo(tok.Info.ID); ti.Used != 1 {
		t.Errorf("token after the refusals: %+v", ti)
	}

	// A revoked host, or a revoked token, gets no retry.
	for _, revoke := range []string{"host", "token"} {
		tok := c.createToken(protocol.TokenCreateRequest{Name: "db-" + revoke})
		kp := newUser(t)
		if _, code := c.enrol(enrolReq(t, kp, tok.Token, "", c.pin, clock.now())); code != "" {
			t.Fatalf("enrol db-%s: %s", revoke, code)
		}
		want := protocol.APITokenSpent
		if revoke == "host" {
			if err := gw.RevokeAgent(context.Background(), "db-host", "test"); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, _, err := gw.subsys.enrol.RevokeJoinToken(context.Background(), tok.Info.ID, "test"); err != nil {
				t.Fatal(err)
			}
			want = protocol.APITokenRevoked
		}
		if _, code := c.enrol(enrolReq(t, kp, tok.Token, "", c.pin, clock.now())); code != want {
			t.Errorf("retry after the %s was revoked: %q, want %q", revoke, code, want)
		}
	}
}
