package access

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
)

// The line NewAPIToken prints is a valid entry of a tokens file, and the
// token it prints is accepted as that entry's caller.
func TestNewAPITokenRoundTrip(t *testing.T) {
	token, line, err := NewAPIToken("ci-bot")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(token, APITokenPrefix) || len(token) != len(APITokenPrefix)+43 {
		t.Fatalf("token %q: want %s and 43 base64url characters", token, APITokenPrefix)
	}
	if strings.Contains(line, token) {
		t.Fatal("the line for the file contains the token itself")
	}
	tokens, err := ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+line+"\n"))
	if err != nil {
		t.Fatalf("printed line %q does not parse: %v", line, err)
	}
	a := &Authenticator{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.tokens.Store(tokens)
	ti, err := a.verify(context.Background(), token, httptest.NewRequest("POST", "/mcp", nil))
	if err != nil {
		t.Fatalf("generated token refused: %v", err)
	}
	id := ti.Extra[identityKey].(*Identity)
	if id.Kind != KindAPIToken || id.Subject != "ci-bot" || ti.UserID != "18:fleetmcp:api-token token:ci-bot" {
		t.Fatalf("identity %+v, user %q", id, ti.UserID)
	}
	if d := (*Rules)(nil).For(id).Tool("read", "any", nil); !d.Allowed {
		t.Fatalf("the printed grant does not allow read: %+v", d)
	}
	if _, err := a.verify(context.Background(), token+"x", httptest.NewRequest("POST", "/mcp", nil)); err == nil {
		t.Fatal("a modified token was accepted")
	}
	if _, err := a.verify(context.Background(), "eyJhbGciOiJSUzI1NiJ9.e30.x", httptest.NewRequest("POST", "/mcp", nil)); err == nil ||
		!strings.Contains(err.Error(), "only its API tokens") {
		t.Fatalf("a JWT at a tokens-only gateway: %v", err)
	}
	for _, bad := range []string{"", "two words", strings.Repeat("x", 65), "a/b"} {
		if _, _, err := NewAPIToken(bad); err == nil {
			t.Errorf("NewAPIToken(%q) accepted the name", bad)
		}
	}
}

func TestParseAPITokens(t *testing.T) {
	hash := strings.Repeat("0f", 32)
	tests := []struct {
		file string
		want string // substring of the error
	}{
		{"tokens: []", "has no tokens"},
		{"tokens:\n  - {sha256: \"" + hash + "\", admin: true}", "name is missing"},
		{"tokens:\n  - {name: a, sha256: abc, admin: true}", "64 hex digits"},
		{"tokens:\n  - {name: a, sha256: \"" + hash + "\"}", "grants nothing"},
		{"tokens:\n  - {name: a, sha256: \"" + hash + "\", tools: [read]}", "tools without hosts"},
		{"tokens:\n  - {name: a, sha256: \"" + hash + "\", admin: true, token: x}", `unknown key "token" in a token`},
		{"tokens:\n  - {name: a, sha256: \"" + hash + "\", admin: true}\n  - {name: a, sha256: \"" + strings.Repeat("1", 64) + "\", admin: true}", `name "a" is already used`},
		{"tokens:\n  - {name: a, sha256: \"" + hash + "\", admin: true}\n  - {name: b, sha256: \"" + hash + "\", admin: true}", "same hash as a"},
		{"tokenz: []", `unknown key "tokenz" at the top level`},
	}
	for _, tc := range tests {
		_, err := ParseAPITokens("tokens.yaml", []byte(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseAPITokens(%q) = %v, want an error mentioning %q", tc.file, err, tc.want)
		}
	}
	tokens, err := ParseAPITokens("tokens.yaml", []byte("tokens:\n  - {name: ops, sha256: \""+strings.ToUpper(hash)+"\", hosts: [\"*\"], tools: [\"*\"], admin: true}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tokens.Summary(), "\n"); got != "allow token ops; tools [read, write, edit, bash, skill, list, search, delete, move, patch] on hosts [*]; admin" {
		t.Errorf("Summary() = %q", got)
	}
}

// FuzzParseAPITokens: the tokens parser never panics, and an accepted
// file answers lookups.
func FuzzParseAPITokens(f *testing.F) {
	f.Add([]byte("tokens:\n  - {name: a, sha256: \"" + strings.Repeat("ab", 32) + "\", hosts: [\"*\"], tools: [read]}\n"))
	f.Add([]byte(`{"tokens": [{"name": "b", "sha256": "` + strings.Repeat("0", 64) + `", "admin": true}]}`))
	f.Add([]byte("tokens: []"))
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseAPITokens("fuzz.yaml", data)
		if err != nil {
			return
		}
		if len(tokens.Summary()) == 0 {
			t.Fatal("accepted a file without tokens")
		}
		if tokens.lookup(APITokenPrefix+"x") != nil {
			t.Fatal("an arbitrary token matched")
		}
	})
}
