package enrol

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Token creation checks what it is given.
func TestTokenCreateValidation(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		req  protocol.TokenCreateRequest
		want string
	}{
		{protocol.TokenCreateRequest{TTL: "forever"}, "not a duration"},
		{protocol.TokenCreateRequest{TTL: "721h"}, "at most"},
		{protocol.TokenCreateRequest{TTL: "-1h"}, "more than 0"},
		{protocol.TokenCreateRequest{Uses: -1}, "uses -1"},
		{protocol.TokenCreateRequest{Labels: map[string]string{"": "x"}}, "labels"},
		{protocol.TokenCreateRequest{Name: "a.b"}, "name"},
		{protocol.TokenCreateRequest{Name: "a", NamePattern: "b*"}, "not both"},
		{protocol.TokenCreateRequest{NamePattern: "web-[a"}, "not a valid pattern"},
		{protocol.TokenCreateRequest{NamePattern: "a/b"}, "not a valid pattern"},
		{protocol.TokenCreateRequest{Name: "web-1", Replace: "web-2"}, "could never replace"},
		{protocol.TokenCreateRequest{NamePattern: "web-*", Replace: "db-1"}, "does not match"},
		{protocol.TokenCreateRequest{Replace: "x>y"}, "replace"},
	} {
		_, _, err := newTokenRecord(&tc.req, "t", now)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.req, err, tc.want)
		}
	}
	rec, token, err := newTokenRecord(&protocol.TokenCreateRequest{}, "t", now)
	if err != nil || rec.Uses != 1 || !rec.ExpiresAt.Equal(now.Add(time.Hour).UTC()) {
		t.Fatalf("defaults: %+v %v", rec, err)
	}
	id, secret, err := protocol.ParseJoinToken(token)
	if err != nil || id != rec.ID || !rec.secretMatches(secret) || strings.Contains(mustJSON(t, rec), strings.Split(token, ".")[2]) {
		t.Errorf("token %s, record %+v: %v", token, rec, err)
	}
	if rec.secretMatches(append(secret[:len(secret)-1:len(secret)-1], secret[len(secret)-1]^1)) {
		t.Error("another secret matches")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Any enrolment request that decodes goes through the checks made before
// its token is read without a panic.
func FuzzEnrolChecks(f *testing.F) {
	f.Add([]byte(`{"token":"fmcp1.aaaaaaaaaa.x","host":"web-1","ca_pin":"sha256:00","public_key":"U","nonce":"n","time":"2026-01-01T00:00:00Z","signature":"s"}`))
	f.Add([]byte(`{"facts":{"os":"linux","hostname":"Web-1.example.com"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req protocol.EnrolRequest
		if json.Unmarshal(data, &req) != nil {
			return
		}
		_ = checkProofShape(&req.Proof)
		_ = checkFacts(&req.Facts)
		if _, _, err := protocol.ParseJoinToken(req.Token); err == nil {
			rec := &tokenRecord{ID: "aaaaaaaaaa", Uses: 1, NamePattern: "web-*"}
			_, _, _ = rec.allowName(req.Host, req.Facts.Hostname)
		}
	})
}
