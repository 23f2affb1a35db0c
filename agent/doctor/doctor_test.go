package doctor

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
	"github.com/fleetmcp/fleetmcp/integration/natstest"
)

func TestCredentialExpiry(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	for _, tc := range []struct {
		name            string
		issued, expires time.Time
		want            Status
		say             string
	}{
		{"never", now.Add(-day), time.Time{}, OK, "never expires"},
		{"fresh", now.Add(-day), now.Add(29 * day), OK, "29 days left"},
		{"just over a third left", now.Add(-19 * day), now.Add(11 * day), OK, "11 days"},
		{"under a third left", now.Add(-21 * day), now.Add(9 * day), Warn, "renews it over NATS"},
		{"no issue date", time.Time{}, now.Add(day), OK, "24h left"},
		{"expired", now.Add(-31 * day), now.Add(-day), Fail, "recovers a new credential"},
		{"expires now", now.Add(-30 * day), now, Fail, "expired"},
	} {
		r := credentialExpiry(tc.issued, tc.expires, now)
		if r.Status != tc.want || !strings.Contains(r.Detail+" "+r.Fix, tc.say) {
			t.Errorf("%s: %v %q %q, want %v saying %q", tc.name, r.Status, r.Detail, r.Fix, tc.want, tc.say)
		}
	}
}

func TestClockSkew(t *testing.T) {
	server := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		skew time.Duration
		want Status
		say  string
	}{
		{0, OK, "0s ahead of"},
		{-59 * time.Second, OK, "59s behind"},
		{90 * time.Second, Warn, "1m30s ahead of"},
		{-4 * time.Minute, Warn, "behind"},
		{5*time.Minute + time.Second, Fail, "refuses"},
		{-time.Hour, Fail, "1h0m0s behind"},
	} {
		r := clockSkew(server, server.Add(tc.skew))
		if r.Status != tc.want || !strings.Contains(r.Detail+" "+r.Fix, tc.say) {
			t.Errorf("skew %s: %v %q %q, want %v saying %q", tc.skew, r.Status, r.Detail, r.Fix, tc.want, tc.say)
		}
	}
}

func TestLeafValidity(t *testing.T) {
	ca := identitytest.NewCA(t, "fleet")
	now := time.Now()
	leaf := func(from, to time.Time) *x509.Certificate {
		c := ca.Leaf(t, []string{"gw.example"}, from, to)
		x, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	for _, tc := range []struct {
		name     string
		from, to time.Time
		want     Status
	}{
		{"valid", now.Add(-time.Hour), now.Add(90 * 24 * time.Hour), OK},
		{"expiring", now.Add(-time.Hour), now.Add(3 * 24 * time.Hour), Warn},
		{"expired", now.Add(-48 * time.Hour), now.Add(-time.Hour), Fail},
		{"not yet valid", now.Add(time.Hour), now.Add(48 * time.Hour), Fail},
	} {
		if r := leafValidity("c", leaf(tc.from, tc.to), now); r.Status != tc.want {
			t.Errorf("%s: %v %q, want %v", tc.name, r.Status, r.Detail, tc.want)
		}
	}
}

func TestStateDir(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("modes and owners are ACLs on Windows")
	}
	dir := t.TempDir()
	private := filepath.Join(dir, "private")
	open := filepath.Join(dir, "open")
	file := filepath.Join(dir, "file")
	for _, d := range []string{private, open} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	uid := os.Getuid()
	for _, tc := range []struct {
		name, dir string
		uid       int
		want      Status
		say       string
	}{
		{"private", private, uid, OK, "0700"},
		{"readable by others", open, uid, Fail, "chmod 700"},
		{"another user's", private, uid + 1, Warn, "the agent's user"},
		{"missing", filepath.Join(dir, "none"), uid, Fail, "does not exist"},
		{"a file", file, uid, Fail, "not a directory"},
		{"none", "", uid, Fail, "--state_dir"},
	} {
		r := checkStateDir(tc.dir, tc.uid)
		if r.Status != tc.want || !strings.Contains(r.Detail+" "+r.Fix, tc.say) {
			t.Errorf("%s: %v %q %q, want %v saying %q", tc.name, r.Status, r.Detail, r.Fix, tc.want, tc.say)
		}
	}
}

// enrol enrols a state directory with a fleet API of the contract and
// returns it with the API.
func enrol(t *testing.T) (string, *identitytest.Gateway) {
	t.Helper()
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.Join(context.Background(), identity.JoinOptions{GatewayURL: g.URL, Token: g.Token, CAPin: g.Pin, Host: "web-1", StateDir: state}); err != nil {
		t.Fatal(err)
	}
	return state, g
}

// find returns the result of check, failing the test when there is none.
func find(t *testing.T, rs []Result, check string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Check == check {
			return r
		}
	}
	t.Fatalf("no %q check in %+v", check, rs)
	return Result{}
}

// A host enrolled with a fleet API passes the local and fleet API
// checks; the NATS URL its enrolment names is not served, which fails.
func TestRunEnrolled(t *testing.T) {
	state, _ := enrol(t)
	rs := Run(context.Background(), Options{StateDir: state, UID: os.Getuid(), Timeout: 5 * time.Second,
		ConfineABI: func() (int, string) { return 3, "" }})
	for _, c := range []string{"state dir", "identity files", "enrolment", "agent key", "credential", "credential ttl", "fleet API", "clock skew", "host policy", "confinement"} {
		if r := find(t, rs, c); r.Status != OK {
			t.Errorf("%s: %v %q %q", c, r.Status, r.Detail, r.Fix)
		}
	}
	// The test API's certificate is valid for an hour.
	if r := find(t, rs, "fleet API cert"); r.Status != Warn || !strings.Contains(r.Detail, "left") {
		t.Errorf("an hour's certificate: %+v", r)
	}
	if r := find(t, rs, "nats tls://127.0.0.1:1"); r.Status != Fail || !strings.Contains(r.Fix, "reaches it") {
		t.Errorf("unserved NATS URL: %+v", r)
	}
	var out bytes.Buffer
	if !Print(&out, rs) || !strings.Contains(out.String(), "FAIL  nats tls://127.0.0.1:1") || !strings.Contains(out.String(), "ok    fleet API ") {
		t.Errorf("Print:\n%s", out.String())
	}
	// A clock 10 minutes fast fails the skew check; its credential
	// then looks nearer its end, but not expired.
	rs = Run(context.Background(), Options{StateDir: state, UID: -1, Timeout: 5 * time.Second, Now: func() time.Time { return time.Now().Add(10 * time.Minute) }})
	if r := find(t, rs, "clock skew"); r.Status != Fail || !strings.Contains(r.Detail, "ahead of") {
		t.Errorf("skewed clock: %+v", r)
	}
}

// The fleet API check verifies the gateway against the pin: a gateway
// of another CA fails it, before any request is sent.
func TestFleetAPIPin(t *testing.T) {
	_, g := enrol(t)
	other := identitytest.NewCA(t, "other")
	rs := checkFleetAPI(context.Background(), g.URL, other.Pin(), 5*time.Second, time.Now)
	if len(rs) != 1 || rs[0].Status != Fail || !strings.Contains(rs[0].Detail, "pin") {
		t.Errorf("another CA's pin: %+v", rs)
	}
	before := g.Requests()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close() // nothing listens there now
	rs = checkFleetAPI(context.Background(), "https://"+ln.Addr().String(), g.Pin, 5*time.Second, time.Now)
	if rs[0].Status != Fail || !strings.Contains(rs[0].Fix, "--api_listen") {
		t.Errorf("no API: %+v", rs)
	}
	if g.Requests() != before {
		t.Errorf("requests reached the API")
	}
}

// The identity checks read and never change: a key others may read
// fails (and stays as it was), a credential for another host or key
// fails, a damaged enrolment fails.
func TestIdentityBroken(t *testing.T) {
	now := time.Now()
	t.Run("key readable by others", func(t *testing.T) {
		if runtime.GOOS == "windows" {
			t.Skip("modes are ACLs on Windows")
		}
		state, _ := enrol(t)
		key := filepath.Join(state, identity.Dir, identity.KeyFile)
		if err := os.Chmod(key, 0o644); err != nil {
			t.Fatal(err)
		}
		id, rs := checkIdentity(state, now)
		if r := find(t, rs, "agent key"); id != nil || r.Status != Fail || !strings.Contains(r.Fix, "chmod 600") {
			t.Errorf("%+v", rs)
		}
		if fi, _ := os.Stat(key); fi.Mode().Perm() != 0o644 {
			t.Errorf("doctor changed the key's mode to %v", fi.Mode().Perm())
		}
	})
	t.Run("credential of another host", func(t *testing.T) {
		state, _ := enrol(t)
		kp, _ := nkeys.FromSeed(mustRead(t, filepath.Join(state, identity.Dir, identity.KeyFile)))
		pub, _ := kp.PublicKey()
		acc, _ := nkeys.CreateAccount()
		uc := jwt.NewUserClaims(pub)
		uc.Name = "web-2"
		token, _ := uc.Encode(acc)
		writeFile(t, filepath.Join(state, identity.Dir, identity.JWTFile), token)
		if id, rs := checkIdentity(state, now); id != nil || find(t, rs, "credential").Status != Fail || !strings.Contains(find(t, rs, "credential").Detail, `"web-2"`) {
			t.Errorf("%+v", rs)
		}
	})
	t.Run("credential of another key", func(t *testing.T) {
		state, _ := enrol(t)
		other, _ := nkeys.CreateUser()
		pub, _ := other.PublicKey()
		acc, _ := nkeys.CreateAccount()
		uc := jwt.NewUserClaims(pub)
		uc.Name = "web-1"
		token, _ := uc.Encode(acc)
		writeFile(t, filepath.Join(state, identity.Dir, identity.JWTFile), token)
		if id, rs := checkIdentity(state, now); id != nil || !strings.Contains(find(t, rs, "credential").Detail, "not this agent's key") {
			t.Errorf("%+v", rs)
		}
	})
	t.Run("damaged enrolment", func(t *testing.T) {
		state, _ := enrol(t)
		writeFile(t, filepath.Join(state, identity.Dir, identity.EnrolmentFile), `{"host": "web-1"}`)
		if id, rs := checkIdentity(state, now); id != nil || find(t, rs, "enrolment").Status != Fail {
			t.Errorf("%+v", rs)
		}
	})
	t.Run("damaged key", func(t *testing.T) {
		state, _ := enrol(t)
		writeFile(t, filepath.Join(state, identity.Dir, identity.KeyFile), "SUxyz")
		if id, rs := checkIdentity(state, now); id != nil || find(t, rs, "agent key").Status != Fail {
			t.Errorf("%+v", rs)
		}
	})
	t.Run("interrupted join", func(t *testing.T) {
		state, _ := enrol(t)
		if err := os.Remove(filepath.Join(state, identity.Dir, identity.JWTFile)); err != nil {
			t.Fatal(err)
		}
		if id, rs := checkIdentity(state, now); id != nil || !strings.Contains(find(t, rs, "identity files").Detail, "lacks agent.jwt") {
			t.Errorf("%+v", rs)
		}
	})
	t.Run("expired", func(t *testing.T) {
		state, _ := enrol(t)
		if id, rs := checkIdentity(state, now.Add(365*24*time.Hour)); id == nil || find(t, rs, "credential ttl").Status != Fail {
			t.Errorf("%+v", rs)
		}
	})
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(data)
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestPolicyAndLock(t *testing.T) {
	bad := func(string) ([]string, error) { return nil, os.ErrPermission }
	good := func(string) ([]string, error) { return []string{"tools: read"}, nil }
	if r := checkPolicy("p.yaml", bad); r.Status != Fail {
		t.Errorf("bad policy: %+v", r)
	}
	if r := checkPolicy("p.yaml", good); r.Status != OK || !strings.Contains(r.Detail, "tools: read") {
		t.Errorf("good policy: %+v", r)
	}
	if r := checkLock("d", func(string) (bool, int, error) { return true, 42, nil }); !strings.Contains(r.Detail, "an agent is running") || !strings.Contains(r.Detail, "pid 42") {
		t.Errorf("held lock: %+v", r)
	}
	if r := checkLock("d", func(string) (bool, int, error) { return false, 0, nil }); !strings.Contains(r.Detail, "free") {
		t.Errorf("free lock: %+v", r)
	}
}

// natsServer starts an embedded NATS server, with TLS when cert is
// given, and returns its host:port.
func natsServer(t *testing.T, cert *tls.Certificate, first bool) string {
	t.Helper()
	opts := &server.Options{}
	if cert != nil {
		opts.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}, MinVersion: tls.VersionTLS12}
		opts.TLS = true
		opts.TLSHandshakeFirst = first
	}
	return natstest.Start(t, opts).Addr().String()
}

func TestNATS(t *testing.T) {
	ca := identitytest.NewCA(t, "nats")
	other := identitytest.NewCA(t, "other")
	now := time.Now()
	cert := ca.Leaf(t, []string{"127.0.0.1"}, now.Add(-time.Hour), now.Add(90*24*time.Hour))
	tlsAddr := natsServer(t, &cert, false)
	firstAddr := natsServer(t, &cert, true)
	plainAddr := natsServer(t, nil, false)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() { // accepts and says nothing, as a server that hangs
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	for _, tc := range []struct {
		name, url, ca string
		want          Status
		say           string
	}{
		{"tls", "tls://" + tlsAddr, ca.PEM(), OK, "TLS verified"},
		{"tls first", "tls://" + firstAddr, ca.PEM(), OK, "TLS verified"},
		{"another CA", "tls://" + tlsAddr, other.PEM(), Fail, "certificate"},
		{"plain", "nats://" + plainAddr, "", OK, "plain NATS"},
		{"plain where TLS is required", "tls://" + plainAddr, ca.PEM(), Fail, "speaks no TLS"},
		{"silent", "tls://" + silent.Addr().String(), ca.PEM(), Fail, "TLS"},
		{"silent, plain", "nats://" + silent.Addr().String(), "", Fail, "no NATS INFO"},
		{"no scheme", plainAddr, "", OK, "plain NATS"},
		{"wss", "wss://" + tlsAddr, ca.PEM(), Fail, "TLS"}, // the client port wants INFO first, not a handshake
	} {
		start := time.Now()
		r := checkNATS(context.Background(), tc.url, tc.ca, 2*time.Second, time.Now())
		if r.Status != tc.want || !strings.Contains(r.Detail+" "+r.Fix, tc.say) {
			t.Errorf("%s: %v %q %q, want %v saying %q", tc.name, r.Status, r.Detail, r.Fix, tc.want, tc.say)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s took %s, beyond its timeout", tc.name, d)
		}
	}
}
