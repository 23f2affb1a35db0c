package identity

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/protocol"
)

func opts(g *identitytest.Gateway, state string) JoinOptions {
	return JoinOptions{GatewayURL: g.URL, Token: g.Token, CAPin: g.Pin, Host: "web-1", StateDir: state}
}

// A join against the fleet API stores an identity that loads: the key
// made on the host, the credential for it and host, the enrolment; the
// request the gateway saw carries a proof that verifies and the facts.
func TestJoin(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	id, enrolled, err := Join(context.Background(), opts(g, state))
	if err != nil || !enrolled {
		t.Fatalf("Join: %v (enrolled %v)", err, enrolled)
	}
	e := id.Enrolment
	if e.Host != "web-1" || e.GatewayURL != g.URL || e.CAPin != g.Pin || e.NATSCA != g.NATSCA || e.Labels["env"] != "prod" || e.Expires.IsZero() ||
		!slices.Equal(e.SigningKeys, g.SigningKeys) {
		t.Errorf("enrolment %+v", e)
	}
	last := g.LastEnrolment()
	if last.PublicKey != id.PublicKey || last.Facts.OS == "" || last.Facts.Arch == "" || last.Facts.Hostname == "" {
		t.Errorf("the request: %+v", last)
	}
	seed, _ := os.ReadFile(filepath.Join(state, Dir, KeyFile))
	body, _ := json.Marshal(last)
	if strings.Contains(string(body), strings.TrimSpace(string(seed))) {
		t.Error("the request carries the seed")
	}
	again, err := Load(state)
	if err != nil || again.PublicKey != id.PublicKey {
		t.Fatalf("Load after join: %v", err)
	}
	for _, name := range []string{KeyFile, JWTFile, EnrolmentFile} {
		if fi, err := os.Stat(filepath.Join(state, Dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", name, err, fi)
		}
	}

	// A second join with this gateway sends nothing and keeps the identity.
	n := g.Requests()
	id2, enrolled, err := Join(context.Background(), opts(g, state))
	if err != nil || enrolled || id2.PublicKey != id.PublicKey || g.Requests() != n {
		t.Fatalf("second join: %v, enrolled %v, requests %d -> %d", err, enrolled, n, g.Requests())
	}
	// Without --name too; with another name, or another gateway, it is
	// refused and says why.
	o := opts(g, state)
	o.Host = ""
	if _, enrolled, err := Join(context.Background(), o); err != nil || enrolled {
		t.Errorf("second join without --name: %v %v", err, enrolled)
	}
	o.Host = "web-2"
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), `enrolled as "web-1"`) {
		t.Errorf("second join as web-2: %v", err)
	}
	o = opts(g, state)
	o.CAPin = identitytest.NewCA(t, "other").Pin()
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), "to move this host to another fleet") {
		t.Errorf("join with another CA: %v", err)
	}
	if g.Requests() != n {
		t.Errorf("the refused joins sent %d requests", g.Requests()-n)
	}

	// An interrupted join (key, no credential) joins again with the same
	// key, which the gateway accepts for the same name.
	if err := os.Remove(filepath.Join(state, Dir, JWTFile)); err != nil {
		t.Fatal(err)
	}
	id3, enrolled, err := Join(context.Background(), opts(g, state))
	if err != nil || !enrolled || id3.PublicKey != id.PublicKey {
		t.Fatalf("join after an interrupted one: %v, enrolled %v", err, enrolled)
	}
	// So does one whose credential does not fit its key (a restore gone
	// wrong); a damaged key is left for the operator.
	other, _ := nkeys.CreateUser()
	if err := Open(state).SaveJWT(credential(t, other, "web-1", time.Now().Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	if _, enrolled, err := Join(context.Background(), opts(g, state)); err != nil || !enrolled {
		t.Fatalf("join over a credential of another key: %v, enrolled %v", err, enrolled)
	}
	if err := os.WriteFile(filepath.Join(state, Dir, KeyFile), []byte("SUjunk\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Join(context.Background(), opts(g, state)); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("join over a damaged key: %v", err)
	}
}

// Every refusal of the gateway reaches the caller as a *RefusedError with
// the gateway's code and advice saying what to do, and nothing is stored
// but the key.
func TestJoinRefused(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	advice := map[protocol.APICode]string{
		protocol.APITokenUnknown: "copied whole", protocol.APITokenExpired: "new token", protocol.APITokenSpent: "--uses",
		protocol.APITokenRevoked: "new one", protocol.APINameNotAllowed: "--name", protocol.APINameTaken: "--replace",
		protocol.APIHostRevoked: "--replace", protocol.APIKeyRevoked: "new key", protocol.APIClockSkew: "clock",
		protocol.APIReplayed: "try again", protocol.APIBadSignature: "upgrade", protocol.APIBadRequest: "upgrade",
		protocol.APIUnavailable: "later", protocol.APIWrongCA: "--ca_pin", protocol.APINoRecovery: "join with a new token",
		protocol.APIUnknownHost: "join", protocol.APINotFound: "--gateway",
	}
	for code, want := range advice {
		g.Refuse(code)
		state := t.TempDir()
		o := opts(g, state)
		o.RetryFor = -1 // unavailable too is final here (see TestJoinRetriesWhileUnavailable)
		_, _, err := Join(context.Background(), o)
		var re *RefusedError
		var apiErr *protocol.APIError
		if !errors.As(err, &re) || !errors.As(err, &apiErr) || apiErr.Code != code || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a refusal saying %q", code, err, want)
		}
		if _, err := Load(state); !errors.Is(err, ErrNotEnrolled) {
			t.Errorf("%s: a refused join left an identity: %v", code, err)
		}
	}
	// A token the gateway does not know, as the gateway decides it.
	g.Refuse("")
	o := opts(g, t.TempDir())
	_, _, other := protocol.NewJoinToken()
	o.Token = other
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), string(protocol.APITokenUnknown)) {
		t.Errorf("unknown token: %v", err)
	}
	// Another key under a name taken.
	if _, _, err := Join(context.Background(), opts(g, t.TempDir())); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Join(context.Background(), opts(g, t.TempDir())); err == nil || !strings.Contains(err.Error(), "name_taken") {
		t.Errorf("a second machine as web-1: %v", err)
	}
}

// While the gateway answers that it is unavailable (a leader election
// on its cluster), a join asks again, each time with a new nonce and
// time, and enrols once it is served; a final refusal after that is
// returned at once; and an outage longer than RetryFor ends the join with
// the gateway's answer and how often it was asked.
func TestJoinRetriesWhileUnavailable(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	g.RefuseNext(protocol.APIUnavailable, 3)
	start := time.Now()
	if _, enrolled, err := Join(context.Background(), opts(g, t.TempDir())); err != nil || !enrolled {
		t.Fatalf("Join through three unavailable answers: %v (enrolled %v)", err, enrolled)
	}
	// The fake refuses a nonce seen before: four requests, four nonces.
	if n, took := g.Requests(), time.Since(start); n != 4 || took < 1750*time.Millisecond {
		t.Errorf("%d requests in %s; want 4, after waits of 0.25, 0.5 and 1 s", n, took)
	}

	before := g.Requests()
	g.RefuseNext(protocol.APIUnavailable, 1)
	g.Refuse(protocol.APITokenSpent) // checked first: the unavailable answer never comes
	if _, _, err := Join(context.Background(), opts(g, t.TempDir())); !strings.Contains(err.Error(), string(protocol.APITokenSpent)) || g.Requests() != before+1 {
		t.Errorf("a final refusal: %v after %d requests; want it at once, after one", err, g.Requests()-before)
	}
	g.Refuse("")

	g.RefuseNext(protocol.APIUnavailable, 1000)
	o := opts(g, t.TempDir())
	o.RetryFor = 2 * time.Second
	start = time.Now()
	// The bounds below tell RetryFor (and the context) from the default
	// minute; each request itself may take a while on a loaded machine.
	_, _, err := Join(context.Background(), o)
	if !unavailable(err) || !strings.Contains(err.Error(), "times over 2s") || time.Since(start) > 20*time.Second {
		t.Errorf("an outage longer than RetryFor: %v after %s", err, time.Since(start))
	}
	if _, err := Load(o.StateDir); !errors.Is(err, ErrNotEnrolled) {
		t.Errorf("a join that gave up left an identity: %v", err)
	}

	// The caller's context ends the waiting.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, _, err := Join(ctx, opts(g, t.TempDir())); err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("a join whose context ends: %v after %s", err, time.Since(start))
	}
}

// Bad options are refused before anything is made or sent.
func TestJoinRefusesBadOptions(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	httpURL := strings.Replace(g.URL, "https://", "http://", 1)
	for _, tc := range []struct {
		name string
		edit func(*JoinOptions)
		want string
	}{
		{"http", func(o *JoinOptions) { o.GatewayURL = httpURL }, "plain http"},
		{"no scheme", func(o *JoinOptions) { o.GatewayURL = "gw.example:8443" }, "want https://"},
		{"path", func(o *JoinOptions) { o.GatewayURL = g.URL + "/v1/enrol" }, "path"},
		{"user", func(o *JoinOptions) { o.GatewayURL = "https://u:p@gw.example" }, "user name"},
		{"bad port", func(o *JoinOptions) { o.GatewayURL = "https://gw.example:99999" }, "port"},
		{"token", func(o *JoinOptions) { o.Token = "fmcp1.abc.def" }, "not a join token"},
		{"pin", func(o *JoinOptions) { o.CAPin = "sha256:ABC" }, "--ca_pin"},
		{"upper-case pin", func(o *JoinOptions) { o.CAPin = strings.ToUpper(g.Pin) }, "--ca_pin"},
		{"name", func(o *JoinOptions) { o.Host = "web.1" }, "--name"},
		{"state", func(o *JoinOptions) { o.StateDir = "" }, "state directory"},
	} {
		state := t.TempDir()
		o := opts(g, state)
		if tc.name != "state" {
			o.StateDir = state
		}
		tc.edit(&o)
		if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if entries, _ := os.ReadDir(state); len(entries) != 0 {
			t.Errorf("%s: the refused join wrote %v", tc.name, entries)
		}
	}
	if g.Requests() != 0 {
		t.Errorf("refused options sent %d requests", g.Requests())
	}
}

// The token goes only to a server whose certificate verifies, for the
// URL's host name and now, against the certificate of the pin in its
// chain: a server of another CA, a certificate for another name, an
// expired one, and a chain that shows the pinned CA without being signed
// by it are all refused in the TLS handshake, before the request.
func TestJoinPinsTheCA(t *testing.T) {
	fleet := identitytest.NewCA(t, "fleet")
	other := identitytest.NewCA(t, "other")
	inter := identitytest.NewIntermediate(t, fleet, "fleet-intermediate")
	now := time.Now()
	good := []string{"127.0.0.1", "localhost"}
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		host string // the URL's host, default 127.0.0.1
		want string
	}{
		{"another CA", other.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour)), "", "holds no CA certificate of the pin"},
		{"another CA presenting the fleet's", other.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "", "does not verify"},
		{"another CA presenting the fleet's and its own", other.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), other.Cert, fleet.Cert), "", "does not verify"},
		{"another host name", fleet.Leaf(t, []string{"gw.example"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "", "does not verify"},
		{"IP URL, name only for localhost", fleet.Leaf(t, []string{"localhost"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "", "does not verify"},
		{"expired", fleet.Leaf(t, good, now.Add(-2*time.Hour), now.Add(-time.Hour), fleet.Cert), "", "expired"},
		{"not yet valid", fleet.Leaf(t, good, now.Add(time.Hour), now.Add(2*time.Hour), fleet.Cert), "", "does not verify"},
		{"the fleet's CA not shown", fleet.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour)), "", "holds no CA certificate of the pin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := identitytest.NewGatewayCert(t, fleet.Pin(), tc.cert)
			o := opts(g, t.TempDir())
			_, _, err := Join(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error saying %q", err, tc.want)
			}
			if g.Requests() != 0 {
				t.Errorf("the request reached a server that failed the pin (%d requests)", g.Requests())
			}
		})
	}
	// The chains that pass: the CA shown after the leaf, under an
	// intermediate, and a name URL.
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		host string
	}{
		{"CA after the leaf", fleet.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), ""},
		{"intermediate", inter.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), inter.Cert, fleet.Cert), ""},
		{"localhost", fleet.Leaf(t, []string{"localhost"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "localhost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := identitytest.NewGatewayCert(t, fleet.Pin(), tc.cert)
			o := opts(g, t.TempDir())
			if tc.host != "" {
				o.GatewayURL = strings.Replace(o.GatewayURL, "127.0.0.1", tc.host, 1)
			}
			if _, _, err := Join(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A redirect is not followed: it would carry the token to a URL nobody
// pinned.
func TestJoinRefusesRedirects(t *testing.T) {
	fleet := identitytest.NewCA(t, "fleet")
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer target.Close()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{fleet.Leaf(t, []string{"127.0.0.1"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), fleet.Cert)}}
	srv.StartTLS()
	defer srv.Close()
	_, _, token := protocol.NewJoinToken()
	_, _, err := Join(context.Background(), JoinOptions{GatewayURL: srv.URL, Token: token, CAPin: fleet.Pin(), StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "redirect") || hits.Load() != 0 {
		t.Errorf("%v; the redirect target saw %d requests", err, hits.Load())
	}
}

// Recovery sends the pin of enrolment.json and a proof of the enrolled
// key; it replaces the credential when the gateway allows one, and says
// to join again when it does not.
func TestRecover(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	id, _, err := Join(context.Background(), opts(g, state))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := id.JWT()
	_, err = Recover(context.Background(), state)
	var apiErr *protocol.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != protocol.APINoRecovery || !strings.Contains(err.Error(), NoRecoveryAdvice) {
		t.Errorf("recovery not allowed: %v", err)
	}
	g.AllowRecovery(1)
	id2, err := Recover(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := id2.JWT()
	if after == before {
		t.Error("the recovered credential is the old one")
	}
	if onDisk, _ := Open(state).LoadJWT(); onDisk != after {
		t.Error("the recovered credential was not stored")
	}
	// An agent enrolled in process has nowhere to recover from.
	local := t.TempDir()
	s := Open(local)
	kp, _ := s.LoadOrCreateKey()
	_ = s.SaveJWT(credential(t, kp, "dev-1", time.Now().Add(time.Hour)))
	_ = s.SaveEnrolment(&Enrolment{Host: "dev-1", NATSURLs: []string{"nats://127.0.0.1:4222"}})
	if _, err := Recover(context.Background(), local); !errors.Is(err, ErrNoGateway) {
		t.Errorf("in-process enrolment: %v", err)
	}
}

func TestParseGatewayURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://GW.example:8443": "https://gw.example:8443",
		"https://gw.example/":     "https://gw.example",
		" https://[::1]:8443 ":    "https://[::1]:8443",
		"HTTPS://10.0.0.1:8443":   "https://10.0.0.1:8443",
	} {
		if got, err := ParseGatewayURL(in); err != nil || got != want {
			t.Errorf("ParseGatewayURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"http://gw:8443", "gw:8443", "https://", "https://gw:0", "https://gw:8443/x", "https://gw?x=1", "https://gw#f", "https://u@gw", "nats://gw:4222", "https:gw", "https://[fe80::1%25en0]:8443"} {
		if got, err := ParseGatewayURL(in); err == nil {
			t.Errorf("ParseGatewayURL(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzParseGatewayURL: what ParseGatewayURL accepts is an https URL of a
// host only, and accepting it again changes nothing.
func FuzzParseGatewayURL(f *testing.F) {
	for _, s := range []string{"https://gw:8443", "http://gw", "https://[::1]:1", "https://u@h", "https://h/p?q#f", "https:h", "https://h:99999", "https://[fe80::1%25en0]:1", "https://gw:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseGatewayURL(raw)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "https://") || strings.ContainsAny(got[len("https://"):], "/?#@") {
			t.Fatalf("ParseGatewayURL(%q) = %q", raw, got)
		}
		again, err := ParseGatewayURL(got)
		if err != nil || again != got {
			t.Fatalf("ParseGatewayURL(%q) = %q, then %q, %v", raw, got, again, err)
		}
	})
}

// Two joins at once on a fresh state directory: the first holds the
// state directory's lock from before it makes the key until it has
// stored the enrolment, so the second is refused at once with the
// directory in use and sends nothing; the directory ends with the
// first's key, and a credential and enrolment for that key.
func TestConcurrentJoinsOneWins(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := filepath.Join(t.TempDir(), "state")
	arrived, release := g.Hold()
	defer release()
	type result struct {
		id  *Identity
		err error
	}
	first := make(chan result, 1)
	go func() {
		id, _, err := Join(context.Background(), opts(g, state))
		first <- result{id, err}
	}()
	select {
	case <-arrived:
	case r := <-first:
		t.Fatalf("the first join ended before its request was held: %v", r.err)
	case <-time.After(20 * time.Second):
		t.Fatal("the first join's request never reached the gateway")
	}
	keyBefore, err := os.ReadFile(filepath.Join(state, Dir, KeyFile))
	if err != nil {
		t.Fatalf("the first join made no key before it sent its request: %v", err)
	}
	o := opts(g, state)
	o.Host = "web-2"
	_, _, err = Join(context.Background(), o)
	var inUse *statelock.InUseError
	if !errors.As(err, &inUse) || inUse.PID != os.Getpid() || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("the second join: %v; want the state directory in use by pid %d", err, os.Getpid())
	}
	if n := g.Requests(); n != 0 {
		t.Errorf("%d requests reached the gateway while the first was held; the second join sent one", n)
	}
	release()
	r := <-first
	if r.err != nil {
		t.Fatalf("the first join: %v", r.err)
	}
	keyAfter, _ := os.ReadFile(filepath.Join(state, Dir, KeyFile))
	if string(keyAfter) != string(keyBefore) {
		t.Error("the key changed under the first join")
	}
	id, err := Load(state)
	if err != nil || id.PublicKey != r.id.PublicKey || id.Enrolment.Host != "web-1" {
		t.Fatalf("the directory after both: %v, %+v", err, id)
	}
	token, _ := id.JWT()
	if _, err := checkCredential(token, id.PublicKey, "web-1"); err != nil {
		t.Errorf("the stored credential is not for the stored key: %v", err)
	}
	// The lock went with the first join: a plain start can take it.
	l, err := statelock.Acquire(state)
	if err != nil {
		t.Fatalf("after the join: %v", err)
	}
	l.Release()
}

// A join given the lock its caller holds uses it, and leaves it held;
// one given a lock on another directory is refused.
func TestJoinWithCallersLock(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	lock, err := statelock.Acquire(state)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	o := opts(g, state)
	o.Lock = lock
	if _, enrolled, err := Join(context.Background(), o); err != nil || !enrolled {
		t.Fatalf("Join with the caller's lock: %v %v", err, enrolled)
	}
	if held, pid, _ := statelock.Holder(state); !held || pid != os.Getpid() {
		t.Error("Join let the caller's lock go")
	}
	other, err := statelock.Acquire(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	o = opts(g, t.TempDir())
	o.Lock = other
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), "lock given is on") {
		t.Errorf("Join with a lock on another directory: %v", err)
	}
}

// A join with a new token on a state directory enrolled already asks the
// gateway, with the agent's own key, whether the enrolment holds: it does,
// and the token is not used; the host was revoked, and the token enrols it
// again under its name with a new key, in one command. The same token
// again sends nothing.
func TestJoinNewTokenReenrolsARevokedHost(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	o := opts(g, state)
	old, _, err := Join(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	// The same token: nothing is sent.
	n := g.Requests()
	if _, enrolled, err := Join(context.Background(), o); err != nil || enrolled || g.Requests() != n {
		t.Fatalf("the same join again: %v, enrolled %v, %d requests", err, enrolled, g.Requests()-n)
	}
	// A new token while the host holds: one question, the identity kept.
	o.Token, o.Host = g.NewToken(), ""
	id, enrolled, err := Join(context.Background(), o)
	if err != nil || enrolled || id.PublicKey != old.PublicKey || g.Requests() != n+1 {
		t.Fatalf("a new token on a good identity: %v, enrolled %v, key kept %v, %d requests", err, enrolled, id.PublicKey == old.PublicKey, g.Requests()-n)
	}

	// That token again: the identity held, nothing is asked.
	if _, enrolled, err := Join(context.Background(), o); err != nil || enrolled || g.Requests() != n+1 {
		t.Fatalf("the new token again: %v, enrolled %v, %d requests", err, enrolled, g.Requests()-n)
	}
	// A running agent holds the state directory: its identity stays,
	// nothing is asked, the join says so.
	o.Token = g.NewToken()
	var said []string
	o.Say = func(msg string) { said = append(said, msg) }
	running, err := statelock.Acquire(state)
	if err != nil {
		t.Fatal(err)
	}
	if id, enrolled, err := Join(context.Background(), o); err != nil || enrolled || id.PublicKey != old.PublicKey || g.Requests() != n+1 ||
		len(said) != 1 || !strings.Contains(said[0], "an agent runs on") {
		t.Fatalf("a new token while an agent runs: %v, enrolled %v, %d requests, said %q", err, enrolled, g.Requests()-n, said)
	}
	running.Release()
	said = nil

	// Revoked: the new token enrols the host again, as web-1, with a new
	// key, without --name.
	g.Revoke("web-1")
	id, enrolled, err = Join(context.Background(), o)
	if err != nil || !enrolled {
		t.Fatalf("a new token on a revoked identity: %v, enrolled %v", err, enrolled)
	}
	if id.PublicKey == old.PublicKey || id.Enrolment.Host != "web-1" || g.LastEnrolment().Host != "web-1" {
		t.Errorf("re-enrolled as %q (asked %q) with the old key %v", id.Enrolment.Host, g.LastEnrolment().Host, id.PublicKey == old.PublicKey)
	}
	if len(said) != 1 || !strings.Contains(said[0], "host_revoked") || !strings.Contains(said[0], "new key") {
		t.Errorf("what the join said: %q", said)
	}
	if again, err := Load(state); err != nil || again.PublicKey != id.PublicKey {
		t.Fatalf("the new identity does not load: %v", err)
	}
	// And that token again: nothing is sent.
	n = g.Requests()
	if _, enrolled, err := Join(context.Background(), o); err != nil || enrolled || g.Requests() != n {
		t.Errorf("the re-enrolling join again: %v, enrolled %v, %d requests", err, enrolled, g.Requests()-n)
	}
}

// A gateway that cannot say whether the identity holds: the join keeps
// the identity, leaves the token unused, and says so.
func TestJoinNewTokenGatewayAway(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	o := opts(g, state)
	old, _, err := Join(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.Token = g.NewToken()
	g.Close()
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), "the token was not used") {
		t.Fatalf("join with the gateway away: %v", err)
	}
	if id, err := Load(state); err != nil || id.PublicKey != old.PublicKey {
		t.Fatalf("the identity after: %v", err)
	}
}
