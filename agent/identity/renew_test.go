package identity

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// enrolledIdentity writes an identity for host and loads it.
func enrolledIdentity(t *testing.T, host string) (*Identity, nkeys.KeyPair) {
	t.Helper()
	state := t.TempDir()
	s := Open(state)
	kp, err := s.LoadOrCreateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveJWT(credential(t, kp, host, time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveEnrolment(enrolment(host)); err != nil {
		t.Fatal(err)
	}
	id, err := Load(state)
	if err != nil {
		t.Fatal(err)
	}
	return id, kp
}

// Renew signs a RenewRequest for its host with its key, sends it on the
// host's renew subject, and takes the answer only when it is a
// credential for its own key and host; a refusal is a *RefusedError.
func TestRenew(t *testing.T) {
	id, kp := enrolledIdentity(t, "web-1")
	other, _ := nkeys.CreateUser()
	old, _ := id.JWT()
	for _, tc := range []struct {
		name   string
		answer any
		want   string // "" : renewed
	}{
		{"refused", &protocol.APIError{Code: protocol.APIHostRevoked, Message: "host web-1 was revoked"}, "host_revoked"},
		{"another key", &protocol.RenewResponse{JWT: credential(t, other, "web-1", time.Now().Add(2*time.Hour))}, "not for this agent's key"},
		{"another host", &protocol.RenewResponse{JWT: credential(t, kp, "web-2", time.Now().Add(2*time.Hour))}, `for host "web-2"`},
		{"not JSON", "junk", "not the gateway's"},
		{"empty", map[string]string{}, "neither a credential nor an error"},
		{"good", &protocol.RenewResponse{JWT: credential(t, kp, "web-1", time.Now().Add(2*time.Hour))}, ""},
	} {
		var sent protocol.RenewRequest
		err := id.Renew(context.Background(), func(_ context.Context, subject string, data []byte) ([]byte, error) {
			if subject != protocol.RenewSubject("web-1") {
				t.Errorf("%s: sent on %s", tc.name, subject)
			}
			if err := json.Unmarshal(data, &sent); err != nil {
				t.Fatal(err)
			}
			if s, ok := tc.answer.(string); ok {
				return []byte(s), nil
			}
			return json.Marshal(tc.answer)
		})
		sig, _ := base64.RawURLEncoding.DecodeString(sent.Signature)
		if sent.Host != "web-1" || sent.PublicKey != id.PublicKey || kp.Verify(sent.SigningBytes(), sig) != nil || sent.CheckTime(time.Now()) != nil {
			t.Errorf("%s: the request %+v does not carry a valid proof", tc.name, sent)
		}
		cur, _ := id.JWT()
		if tc.want == "" {
			if err != nil || cur == old {
				t.Errorf("%s: %v; renewed %v", tc.name, err, cur != old)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || cur != old {
			t.Errorf("%s: %v (want %q); credential changed %v", tc.name, err, tc.want, cur != old)
		}
	}
	var re *RefusedError
	err := id.Renew(context.Background(), func(context.Context, string, []byte) ([]byte, error) {
		return json.Marshal(&protocol.APIError{Code: protocol.APIUnavailable, Message: "busy"})
	})
	if !errors.As(err, &re) || re.API.Code != protocol.APIUnavailable {
		t.Errorf("a refusal: %v", err)
	}
	if err := id.Renew(context.Background(), func(context.Context, string, []byte) ([]byte, error) {
		return nil, context.DeadlineExceeded
	}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("no answer: %v", err)
	}
}

// FuzzParseRenewAnswer: an answer is either a credential or an error
// with a code, never both nor neither.
func FuzzParseRenewAnswer(f *testing.F) {
	for _, s := range []string{`{"jwt":"x"}`, `{"code":"unavailable","message":"m"}`, `{"jwt":"x","code":"c"}`, `{}`, `null`, `[]`, `{"jwt":""}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		resp, err := parseRenewAnswer(data)
		var re *RefusedError
		switch {
		case err == nil && (resp == nil || resp.JWT == ""):
			t.Fatalf("accepted %q without a credential", data)
		case errors.As(err, &re) && re.API.Code == "":
			t.Fatalf("a refusal without a code from %q", data)
		}
	})
}
