package natsauth

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The fleet account: JetStream on, bearer tokens refused, and the agent
// signing key scoped to exactly the agent permissions of package
// protocol, surviving an encode and decode (the servers compare scopes
// after decoding; a changed scope would cut every agent off).
func TestFleetAccountClaims(t *testing.T) {
	op, _ := nkeys.CreateOperator()
	acc, _ := nkeys.CreateAccount()
	signer, _ := nkeys.CreateAccount()
	ac := fleetAccountClaims(publicKey(acc), publicKey(signer), 45*time.Minute)
	token, err := ac.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	got, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Limits.IsJSEnabled() || !got.Limits.DisallowBearer {
		t.Errorf("limits %+v: want JetStream on and bearer tokens refused", got.Limits)
	}
	scope, ok := got.SigningKeys.GetScope(publicKey(signer))
	us, scoped := scope.(*jwt.UserScope)
	if !ok || !scoped {
		t.Fatalf("the agent signing key is not a scoped key: %v", scope)
	}
	want := jwt.Permissions{
		Pub:  jwt.Permission{Allow: []string{"fleet.v1.presence.{{name()}}", "fleet.v1.agent.{{name()}}.>"}},
		Sub:  jwt.Permission{Allow: []string{"fleet.v1.host.{{name()}}.>", "fleet.v1.discover", "_INBOX_{{name()}}.>"}},
		Resp: &jwt.ResponsePermission{MaxMsgs: -1, Expires: 45 * time.Minute},
	}
	if !slices.Equal(us.Template.Pub.Allow, want.Pub.Allow) || !slices.Equal(us.Template.Sub.Allow, want.Sub.Allow) ||
		len(us.Template.Pub.Deny)+len(us.Template.Sub.Deny) > 0 || *us.Template.Resp != *want.Resp || us.Role != protocol.AgentSigningRole {
		t.Errorf("agent template %+v (resp %+v), want %+v", us.Template.Permissions, us.Template.Resp, want)
	}
	// Built again, the scope is the same.
	again, _ := jwt.DecodeAccountClaims(mustEncode(t, fleetAccountClaims(publicKey(acc), publicKey(signer), 45*time.Minute), op))
	s2, _ := again.SigningKeys.GetScope(publicKey(signer))
	if !scopesEqual(scope, s2) {
		t.Error("the scope differs between two builds")
	}
}

func mustEncode(t *testing.T, ac *jwt.AccountClaims, kp nkeys.KeyPair) string {
	t.Helper()
	token, err := ac.Encode(kp)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func scopesEqual(a, b jwt.Scope) bool {
	ua, ok1 := a.(*jwt.UserScope)
	ub, ok2 := b.(*jwt.UserScope)
	return ok1 && ok2 && slices.Equal(ua.Template.Pub.Allow, ub.Template.Pub.Allow) && slices.Equal(ua.Template.Sub.Allow, ub.Template.Sub.Allow) &&
		*ua.Template.Resp == *ub.Template.Resp && ua.Key == ub.Key && ua.Role == ub.Role
}

// An agent's credential: its key, its host as name, the fleet account as
// issuer account, the scoped key as issuer, an expiry, no permissions of
// its own, and not a bearer token.
func TestAgentJWT(t *testing.T) {
	acc, _ := nkeys.CreateAccount()
	signer, _ := nkeys.CreateAccount()
	a := &Authority{accountPub: publicKey(acc), agentSigner: signer}
	user, _ := nkeys.CreateUser()
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	token, err := a.AgentJWT("web-1", publicKey(user), expires)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case uc.Subject != publicKey(user) || uc.Name != "web-1":
		t.Errorf("subject %s name %q", uc.Subject, uc.Name)
	case uc.IssuerAccount != publicKey(acc) || uc.Issuer != publicKey(signer):
		t.Errorf("issuer %s, issuer account %s", uc.Issuer, uc.IssuerAccount)
	case uc.Expires != expires.Unix():
		t.Errorf("expires %d, want %d", uc.Expires, expires.Unix())
	case uc.BearerToken:
		t.Error("a bearer token")
	case !uc.HasEmptyPermissions():
		t.Errorf("permissions of its own: %+v", uc.UserPermissionLimits)
	}
	for _, tc := range []struct{ host, pub string }{{"web.1", publicKey(user)}, {"*", publicKey(user)}, {"web-1", publicKey(acc)}, {"web-1", "Ujunk"}} {
		if _, err := a.AgentJWT(tc.host, tc.pub, expires); err == nil {
			t.Errorf("AgentJWT(%q, %q) issued a credential", tc.host, tc.pub)
		}
	}
}

// The revocations a reconcile pushes: every revoked key at the second it
// was revoked, until all credentials issued for it have expired (plus a
// margin); entries made by hand are kept.
func TestRevocations(t *testing.T) {
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	a := &Authority{ttl: 24 * time.Hour, now: func() time.Time { return now }}
	recent := RevokedKey{Pub: "Urecent", RevokedAt: now.Add(-time.Hour), Expires: now.Add(20 * time.Hour)}
	old := RevokedKey{Pub: "Uold", RevokedAt: now.Add(-48 * time.Hour), Expires: now.Add(-30 * time.Hour)}
	// Revoked long ago, but a credential issued before then with a
	// longer TTL is still valid.
	longLived := RevokedKey{Pub: "Ulong", RevokedAt: now.Add(-48 * time.Hour), Expires: now.Add(time.Hour)}
	// Expired just now: kept within the margin.
	margin := RevokedKey{Pub: "Umargin", RevokedAt: now.Add(-25 * time.Hour), Expires: now.Add(-time.Minute)}
	cur := jwt.RevocationList{"Uold": old.RevokedAt.Unix(), "Uhand": 123, jwt.All: 456}
	got := a.revocations(cur, []RevokedKey{recent, old, longLived, margin})
	want := jwt.RevocationList{"Urecent": recent.RevokedAt.Unix(), "Ulong": longLived.RevokedAt.Unix(),
		"Umargin": margin.RevokedAt.Unix(), "Uhand": 123, jwt.All: 456}
	if !maps.Equal(got, want) {
		t.Errorf("revocations %v, want %v", got, want)
	}
	if _, ok := cur["Urecent"]; ok {
		t.Error("revocations changed the list it was given")
	}
}

// A restarted embedded server starts with the revocations of the account
// JWT the gateway pushed last, and not with those of a JWT that is not
// the fleet account's (signed by another operator).
func TestEmbeddedAccountKeepsRevocations(t *testing.T) {
	dir := t.TempDir()
	keys, err := loadOrCreateNATSKeys(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	e, err := newEmbeddedAccount(dir, keys, time.Hour, false, log)
	if err != nil {
		t.Fatal(err)
	}
	ac, _ := e.current(context.Background(), nil)
	if len(ac.Revocations) != 0 {
		t.Fatalf("a new fleet has revocations: %v", ac.Revocations)
	}
	ac.Revocations = jwt.RevocationList{"Uvictim": 1000}
	token, err := e.sign(ac)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.save(token); err != nil {
		t.Fatal(err)
	}
	e2, err := newEmbeddedAccount(dir, keys, time.Hour, false, log)
	if err != nil {
		t.Fatal(err)
	}
	if ac, _ := e2.current(context.Background(), nil); ac.Revocations["Uvictim"] != 1000 {
		t.Errorf("after a restart: revocations %v, want Uvictim", ac.Revocations)
	}
	stored, _ := e2.resolver.Fetch(keys.accountPub)
	if sac, _ := jwt.DecodeAccountClaims(stored); sac == nil || sac.Revocations["Uvictim"] != 1000 {
		t.Error("the server's resolver is not preloaded with the revocations")
	}

	// A JWT signed by another operator is not taken.
	stranger, _ := nkeys.CreateOperator()
	forged := fleetAccountClaims(keys.accountPub, publicKey(keys.agentSigner), time.Hour)
	if err := os.WriteFile(filepath.Join(dir, natsDir, accountJWTFile), []byte(mustEncode(t, forged, stranger)), 0o600); err != nil {
		t.Fatal(err)
	}
	e3, err := newEmbeddedAccount(dir, keys, time.Hour, false, log)
	if err != nil {
		t.Fatal(err)
	}
	if ac, _ := e3.current(context.Background(), nil); len(ac.Revocations) != 0 {
		t.Errorf("took the revocations of a JWT another operator signed: %v", ac.Revocations)
	}
}
