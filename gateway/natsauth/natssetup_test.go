package natsauth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// nats-setup writes what nsc would: an operator with a signing key, a
// system account, the fleet account signed by the operator's signing
// key, creds of a fleet account user and a system user, the seeds the
// gateways need, and a server include that loads into operator mode.
func TestNATSSetup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "setup")
	res, err := Setup(dir, 30*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	f := SetupFiles
	read := func(name string) string {
		t.Helper()
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(data))
	}
	oc, err := jwt.DecodeOperatorClaims(read(f.OperatorJWT))
	if err != nil || oc.Subject != res.Operator || oc.SystemAccount != res.SystemAccount || !oc.SigningKeys.Contains(res.OperatorSigningKey) {
		t.Fatalf("operator JWT %+v (%v)", oc, err)
	}
	ac, err := jwt.DecodeAccountClaims(read(f.AccountJWT))
	if err != nil || ac.Subject != res.Account || ac.Issuer != res.OperatorSigningKey || !ac.Limits.IsJSEnabled() {
		t.Fatalf("fleet account JWT: issuer %s, JetStream %v (%v)", ac.Issuer, ac.Limits.IsJSEnabled(), err)
	}
	if s, _ := ac.SigningKeys.GetScope(res.AgentSigningKey); s == nil || s.(*jwt.UserScope).Template.Resp.Expires != 30*time.Minute {
		t.Errorf("the agent signing key's scope: %+v", s)
	}
	for name, want := range map[string]string{f.GatewayCreds: res.Account, f.SystemCreds: res.SystemAccount} {
		data, _ := os.ReadFile(filepath.Join(dir, name))
		token, err := jwt.ParseDecoratedJWT(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		uc, err := jwt.DecodeUserClaims(token)
		if err != nil || uc.Issuer != want {
			t.Errorf("%s: a user of %s, want of %s (%v)", name, uc.Issuer, want, err)
		}
		kp, err := jwt.ParseDecoratedUserNKey(data)
		if pub, _ := kp.PublicKey(); err != nil || pub != uc.Subject {
			t.Errorf("%s: the seed is not the user's (%v)", name, err)
		}
	}
	for name, prefix := range map[string]nkeys.PrefixByte{f.AgentSigningKey: nkeys.PrefixByteAccount, f.OperatorSigningKey: nkeys.PrefixByteOperator} {
		kp, err := readSeedFile(filepath.Join(dir, name), prefix, name)
		if err != nil {
			t.Fatal(err)
		}
		if pub := publicKey(kp); pub != res.AgentSigningKey && pub != res.OperatorSigningKey {
			t.Errorf("%s holds %s", name, pub)
		}
	}

	// The include, with a resolver directory of the test's, puts a server
	// in operator mode with both accounts.
	conf := filepath.Join(dir, "server.conf")
	jwtDir := filepath.Join(t.TempDir(), "jwt")
	text := "include " + f.ServerConfig + "\nresolver: {type: full, dir: \"" + jwtDir + "\"}\n"
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the include does not load: %v", err)
	}
	if len(opts.TrustedOperators) != 1 || opts.TrustedOperators[0].Subject != res.Operator || opts.SystemAccount != res.SystemAccount {
		t.Errorf("operator %v, system account %q", opts.TrustedOperators, opts.SystemAccount)
	}
	if _, ok := opts.AccountResolver.(*server.DirAccResolver); !ok {
		t.Errorf("resolver %T, want the full resolver", opts.AccountResolver)
	}

	if _, err := Setup(dir, 0); err == nil || !strings.Contains(err.Error(), "already holds a setup") {
		t.Errorf("a second setup into the same directory: %v", err)
	}
}
