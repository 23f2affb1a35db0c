package identity

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// credential issues a user JWT for kp named host (signed by a throwaway
// account: these tests never reach NATS).
func credential(t *testing.T, kp nkeys.KeyPair, host string, expires time.Time) string {
	t.Helper()
	acc, _ := nkeys.CreateAccount()
	pub, _ := kp.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = host
	uc.Expires = expires.Unix()
	token, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func enrolment(host string) *Enrolment {
	return &Enrolment{Host: host, GatewayURL: "https://gw.example:8443", CAPin: "sha256:" + strings.Repeat("ab", 32),
		NATSURLs: []string{"tls://gw.example:4222"}, Labels: map[string]string{"env": "prod"}, EnrolledAt: time.Now().UTC().Truncate(time.Second)}
}

// An identity written the way join writes it loads whole: the key, the
// credential for it and the enrolment, every file private.
func TestStoreAndLoad(t *testing.T) {
	state := t.TempDir()
	s := Open(state)
	kp, err := s.LoadOrCreateKey()
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.LoadOrCreateKey()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	if p2, _ := again.PublicKey(); p2 != pub {
		t.Fatal("the key changed at the second load")
	}
	expires := time.Now().Add(time.Hour).Truncate(time.Second)
	if err := s.SaveJWT(credential(t, kp, "web-1", expires)); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveEnrolment(enrolment("web-1")); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(s.Dir())
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("identity directory mode %v, want 0700", fi.Mode().Perm())
	}
	for _, name := range []string{KeyFile, JWTFile, EnrolmentFile} {
		fi, err := os.Stat(filepath.Join(s.Dir(), name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", name, err, fi.Mode().Perm())
		}
	}
	id, err := Load(state)
	if err != nil {
		t.Fatal(err)
	}
	token, _ := id.JWT()
	if id.PublicKey != pub || id.Enrolment.Host != "web-1" || token == "" || !id.Expires().Equal(expires) {
		t.Errorf("loaded %s %+v, expires %s", id.PublicKey, id.Enrolment, id.Expires())
	}
	if seedKP, err := nkeys.FromSeed(id.Seed); err != nil {
		t.Errorf("the loaded seed: %v", err)
	} else if p, _ := seedKP.PublicKey(); p != pub {
		t.Error("the loaded seed is not the key's")
	}

	// A renewed credential replaces the old one, on disk and in memory.
	renewed := credential(t, kp, "web-1", expires.Add(time.Hour))
	if err := id.Replace(renewed); err != nil {
		t.Fatal(err)
	}
	if got, _ := id.JWT(); got != renewed || !id.Expires().Equal(expires.Add(time.Hour)) {
		t.Error("Replace did not make the new credential the current one")
	}
	if onDisk, _ := s.LoadJWT(); onDisk != renewed {
		t.Error("Replace did not store the new credential")
	}
	// One for another key or host is refused, and changes nothing.
	other, _ := nkeys.CreateUser()
	for _, bad := range []string{credential(t, other, "web-1", expires), credential(t, kp, "web-2", expires), "junk"} {
		if err := id.Replace(bad); err == nil {
			t.Errorf("Replace accepted %.40s", bad)
		}
	}
	if got, _ := id.JWT(); got != renewed {
		t.Error("a refused Replace changed the credential")
	}
}

// A state directory without an identity, or with part of one, says the
// agent is not enrolled and how to enrol; a damaged one says what is
// damaged.
func TestLoadIncomplete(t *testing.T) {
	if _, err := Load(t.TempDir()); !errors.Is(err, ErrNotEnrolled) || !strings.Contains(err.Error(), "fleet-agent join") {
		t.Errorf("empty state directory: %v", err)
	}
	state := t.TempDir()
	s := Open(state)
	kp, _ := s.LoadOrCreateKey()
	if _, err := Load(state); !errors.Is(err, ErrNotEnrolled) || !strings.Contains(err.Error(), "no credential") {
		t.Errorf("key only: %v", err)
	}
	if err := s.SaveJWT(credential(t, kp, "web-1", time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(state); !errors.Is(err, ErrNotEnrolled) || !strings.Contains(err.Error(), EnrolmentFile) {
		t.Errorf("no enrolment: %v", err)
	}
	if err := s.SaveEnrolment(enrolment("web-2")); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(state); err == nil || !strings.Contains(err.Error(), `for host "web-1", but the agent enrolled as "web-2"`) {
		t.Errorf("credential of another host: %v", err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir(), KeyFile), []byte("SUjunk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(state); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged key: %v", err)
	}
	acc, _ := nkeys.CreateAccount()
	accSeed, _ := acc.Seed()
	if err := os.WriteFile(filepath.Join(s.Dir(), KeyFile), accSeed, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(state); err == nil || !strings.Contains(err.Error(), "no user key") {
		t.Errorf("an account key: %v", err)
	}
	if err := s.RemoveKey(); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(state); !errors.Is(err, ErrNotEnrolled) {
		t.Errorf("after RemoveKey: %v", err)
	}
}

func TestParseEnrolment(t *testing.T) {
	good, err := enrolment("web-1").encode()
	if err != nil {
		t.Fatal(err)
	}
	if e, err := ParseEnrolment(good); err != nil || e.Host != "web-1" {
		t.Fatalf("ParseEnrolment of an encoded enrolment: %+v %v", e, err)
	}
	for _, tc := range []struct{ name, data, want string }{
		{"not JSON", "host=web-1", "not an enrolment"},
		{"unknown field", `{"host":"web-1","nats_urls":["nats://a:4222"],"password":"x"}`, "unknown field"},
		{"trailing data", `{"host":"web-1","nats_urls":["nats://a:4222"]} {}`, "after the JSON object"},
		{"bad host", `{"host":"web.1","nats_urls":["nats://a:4222"]}`, "host"},
		{"no URLs", `{"host":"web-1"}`, "nats_urls"},
		{"HTTP URL", `{"host":"web-1","nats_urls":["http://a:8080"]}`, "HTTP URL"},
		{"plain gateway", `{"host":"web-1","nats_urls":["nats://a:4222"],"gateway_url":"http://gw:8443"}`, "https://"},
		{"bad pin", `{"host":"web-1","nats_urls":["nats://a:4222"],"ca_pin":"sha256:abc"}`, "ca_pin"},
		{"bad CA", `{"host":"web-1","nats_urls":["nats://a:4222"],"nats_ca":"junk"}`, "nats_ca"},
		{"bad signing key", `{"host":"web-1","nats_urls":["nats://a:4222"],"signing_keys":["ed25519:short"]}`, "signing_keys"},
	} {
		if _, err := ParseEnrolment([]byte(tc.data)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// The gateway's signing keys an agent learnt at enrolment are kept, and
// read back, with the enrolment.
func TestEnrolmentSigningKeys(t *testing.T) {
	pub, _, _ := ed25519.GenerateKey(nil)
	e := enrolment("web-1")
	e.SigningKeys = []string{protocol.FormatSigningKey(pub)}
	data, err := e.encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseEnrolment(data)
	if err != nil || len(got.SigningKeys) != 1 || got.SigningKeys[0] != e.SigningKeys[0] {
		t.Fatalf("ParseEnrolment: %+v %v, want the signing key back", got, err)
	}
}

// FuzzParseEnrolment: what ParseEnrolment accepts is an enrolment the
// agent can use (a valid host, NATS URLs), and encodes to something it
// accepts again.
func FuzzParseEnrolment(f *testing.F) {
	good, _ := enrolment("web-1").encode()
	for _, s := range []string{string(good), `{"host":"h","nats_urls":["h:1"]}`, `{"host":"","nats_urls":[]}`, `{"host":"web-1","nats_urls":["tls://x:1"],"nats_ca":"-----BEGIN CERTIFICATE-----\n"}`, "null", "{}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		e, err := ParseEnrolment(data)
		if err != nil {
			return
		}
		if e.Host == "" || len(e.NATSURLs) == 0 {
			t.Fatalf("accepted an unusable enrolment %+v", e)
		}
		again, err := e.encode()
		if err != nil {
			t.Fatalf("an accepted enrolment does not encode: %v", err)
		}
		if _, err := ParseEnrolment(again); err != nil {
			t.Fatalf("an accepted enrolment, encoded, is refused: %v", err)
		}
	})
}

// The key file is made exclusively: a key that appears meanwhile is
// never replaced, and every caller that got a key got the one on disk.
func TestCreateKeyExclusive(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := createFileExclusive(path, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	if err := createFileExclusive(path, []byte("two\n")); !errors.Is(err, os.ErrExist) {
		t.Errorf("second create: %v, want ErrExist", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "one\n" {
		t.Errorf("the file holds %q after the refused create", data)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".f.new-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}

	for range 20 {
		s := Open(t.TempDir())
		const n = 8
		pubs := make(chan string, n)
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				kp, err := s.LoadOrCreateKey()
				if err != nil {
					if !strings.Contains(err.Error(), "another process made") {
						t.Errorf("LoadOrCreateKey: %v", err)
					}
					return
				}
				pub, _ := kp.PublicKey()
				pubs <- pub
			})
		}
		wg.Wait()
		close(pubs)
		onDisk, err := s.LoadKey()
		if err != nil {
			t.Fatal(err)
		}
		want, _ := onDisk.PublicKey()
		got := 0
		for pub := range pubs {
			got++
			if pub != want {
				t.Fatalf("a caller got key %s, the file holds %s", pub, want)
			}
		}
		if got == 0 {
			t.Fatal("no caller got a key")
		}
	}
}
