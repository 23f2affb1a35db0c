//go:build unix

package agent

import (
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestAgentRefusesForgeries: whoever can publish on a host's subjects
// cannot make it act: unsigned, foreign-signed, tampered, replayed,
// re-addressed and stale messages run nothing; each is reported with
// its reason, and only those whose signature held are answered.
func TestAgentRefusesForgeries(t *testing.T) {
	const host = "sec-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	cwd := t.TempDir()
	runAgent(t, ns, Config{Name: host, Cwd: cwd})
	if a := nextAnnounce(t, pres, host, false); len(a.TrustedKeys) != 1 || a.TrustedKeys[0] != testSigner().KeyID() {
		t.Fatalf("the agent announces trusted keys %v, want the test gateway's %s", a.TrustedKeys, testSigner().KeyID())
	}
	refused := refusals(t, nc, host)
	marks := filepath.Join(cwd, "marks")
	mark := func(id string) protocol.Call {
		return newCall(host, id, "bash", map[string]string{"command": "echo " + id + " >> marks"})
	}
	ran := func() string { b, _ := os.ReadFile(marks); return string(b) }
	noAnswer := func(x exchange, what string) {
		t.Helper()
		if m, err := x.sub.NextMsg(150 * time.Millisecond); err == nil {
			t.Errorf("%s was answered: %s", what, m.Data)
		}
	}
	want := func(reason protocol.RefusalReason, id string) {
		t.Helper()
		r := nextRefusal(t, refused)
		if r.Reason != reason || r.Host != host || (id != "" && r.CallID != id) {
			t.Errorf("refusal %+v, want %s of call %q", r, reason, id)
		}
	}

	// Unsigned.
	x := newExchange(t, nc)
	data, _ := json.Marshal(mark("unsigned-1"))
	h, body := protocol.Frame{Kind: protocol.KindCall, CallID: "unsigned-1", Seq: 1, Part: 1, Parts: 1, Data: data}.Encode()
	if err := nc.PublishMsg(&nats.Msg{Subject: protocol.CallSubject(host), Reply: x.sub.Subject, Header: nats.Header(h), Data: body}); err != nil {
		t.Fatal(err)
	}
	want(protocol.RefusedUnsigned, "")
	noAnswer(x, "an unsigned call")

	// Signed by a key the host does not trust.
	_, rogue, _ := ed25519.GenerateKey(nil)
	x = newExchange(t, nc)
	frames := callFrames(t, mark("rogue-1"), x.sub.Subject, 0)
	c := claimsOf(t, frames[0].Auth)
	frames[0].Auth = protocol.NewEnvelopeSigner(rogue).Sign(c)
	publishFrames(t, nc, host, x.sub.Subject, frames)
	want(protocol.RefusedUnknownKey, "")
	noAnswer(x, "a call signed by another key")

	// Tampered: the gateway's envelope, another command.
	x = newExchange(t, nc)
	frames = callFrames(t, mark("tamper-1"), x.sub.Subject, 0)
	frames[0].Data = []byte(strings.Replace(string(frames[0].Data), "echo tamper-1", "echo TAMPER1", 1))
	publishFrames(t, nc, host, x.sub.Subject, frames)
	want(protocol.RefusedTampered, "tamper-1")
	noAnswer(x, "a tampered call")

	// A call in parts whose last part was changed: the envelope signed
	// all of them, and nothing runs.
	x = newExchange(t, nc)
	big := mark("parts-1")
	big.Args, _ = json.Marshal(map[string]string{"command": "echo parts-1 >> marks #" + strings.Repeat("p", 3000)})
	frames = callFrames(t, big, x.sub.Subject, 1024)
	last := frames[len(frames)-1]
	last.Data = append([]byte(nil), last.Data...)
	last.Data[0] ^= 1
	frames[len(frames)-1] = last
	publishFrames(t, nc, host, x.sub.Subject, frames)
	want(protocol.RefusedTampered, "parts-1")
	noAnswer(x, "a call in parts with a changed part")

	// A genuine call, then the same message again.
	x = newExchange(t, nc)
	frames = callFrames(t, mark("once-1"), x.sub.Subject, 0)
	publishFrames(t, nc, host, x.sub.Subject, frames)
	if res, _ := x.result(t, "once-1"); res.Error != nil || res.IsError {
		t.Fatalf("the genuine call: %+v", res)
	}
	publishFrames(t, nc, host, x.sub.Subject, frames)
	want(protocol.RefusedReplayed, "once-1")
	noAnswer(x, "a replayed call")

	// Another reply subject than the envelope names.
	x = newExchange(t, nc)
	frames = callFrames(t, mark("reply-1"), "_INBOX.elsewhere", 0)
	publishFrames(t, nc, host, x.sub.Subject, frames)
	want(protocol.RefusedMismatch, "reply-1")
	noAnswer(x, "a call with another reply subject")

	// Expired, and issued in the future: clocks; these are answered.
	for _, tc := range []struct {
		id     string
		iat    time.Time
		reason protocol.RefusalReason
	}{
		{"old-1", time.Now().Add(-protocol.EnvelopeLifetime - protocol.CallClockSkew - time.Minute), protocol.RefusedExpired},
		{"future-1", time.Now().Add(protocol.CallClockSkew + time.Minute), protocol.RefusedFuture},
	} {
		x = newExchange(t, nc)
		frames = callFrames(t, mark(tc.id), x.sub.Subject, 0)
		c := claimsOf(t, frames[0].Auth)
		c.IssuedAt, c.Expires = tc.iat, tc.iat.Add(protocol.EnvelopeLifetime)
		frames[0].Auth = testSigner().Sign(c)
		publishFrames(t, nc, host, x.sub.Subject, frames)
		want(tc.reason, tc.id)
		res, _ := x.result(t, tc.id)
		wantCode(t, res, protocol.CodeRefused, "NTP")
	}

	// Unsigned cancel, fetch and poke.
	sendUnsigned := func(subject, reply string, v any) {
		data, _ := json.Marshal(v)
		if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	sendUnsigned(protocol.CancelSubject(host), "", protocol.Cancel{CallID: "once-1"})
	want(protocol.RefusedUnsigned, "")
	x = newExchange(t, nc)
	sendUnsigned(protocol.FetchSubject(host), x.sub.Subject, protocol.Fetch{CallID: "once-1"})
	want(protocol.RefusedUnsigned, "")
	noAnswer(x, "an unsigned fetch")
	sendUnsigned(protocol.SkillsPokeSubject(host), "", nil)
	want(protocol.RefusedUnsigned, "")
	// A signed fetch of the genuine call is answered, with its result.
	if res, _ := sendFetch(t, nc, host, "once-1").result(t, "once-1"); res.Error != nil {
		t.Errorf("a signed fetch: %+v", res)
	}

	// A genuine cancel, twice: the second is a replay.
	cancelData, _ := json.Marshal(protocol.Cancel{CallID: "once-1"})
	cancelMsg := &nats.Msg{Subject: protocol.CancelSubject(host), Data: cancelData,
		Header: nats.Header{protocol.HeaderAuth: {envelope(protocol.MsgCancel, host, "once-1", "", "", cancelData, 0, protocol.CallerClaims{})}}}
	for range 2 {
		if err := nc.PublishMsg(cancelMsg); err != nil {
			t.Fatal(err)
		}
	}
	want(protocol.RefusedReplayed, "once-1")

	if got := ran(); got != "once-1\n" {
		t.Errorf("commands that ran: %q, want the genuine call's once", got)
	}
}

// claimsOf opens an envelope of the test gateway's.
func claimsOf(t *testing.T, auth string) *protocol.Claims {
	t.Helper()
	pub := testGatewayPriv().Public().(ed25519.PublicKey)
	c, err := protocol.OpenEnvelope(auth, func(string) (ed25519.PublicKey, bool) { return pub, true })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAgentCallerPolicy: the host policy decides on the caller the
// envelope names, per tool and per path; the caller the call's JSON
// names decides nothing.
func TestAgentCallerPolicy(t *testing.T) {
	const host = "pol-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	cwd := t.TempDir()
	if err := os.MkdirAll(filepath.Join(cwd, "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"app/main.go", "other.txt"} {
		if err := os.WriteFile(filepath.Join(cwd, f), []byte("content of "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(`
callers:
  - name: deploy
    match: {client_id: [ci-deploy]}
    tools: {allow: [read, patch]}
    paths: {allow: ["`+cwd+`/app/**"]}
  - name: sre
    match: {groups: [sre]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	pres := presence(t, nc)
	runAgent(t, ns, Config{Name: host, Cwd: cwd, PolicyFile: policyFile})
	nextAnnounce(t, pres, host, false)
	deploy := protocol.Caller{Subject: "svc", ClientID: "ci-deploy"}
	sre := protocol.Caller{Subject: "alice", Groups: []string{"sre"}}
	nobody := protocol.Caller{Subject: "mallory", Groups: []string{"dev"}}
	n := 0
	call := func(caller protocol.Caller, tool string, args any) *protocol.Result {
		n++
		c := newCall(host, "pc-"+string(rune('a'+n)), tool, args)
		c.Caller = caller
		res, _ := sendCall(t, nc, c).result(t, c.ID)
		return res
	}
	read := func(p string) map[string]string { return map[string]string{"path": p} }
	if res := call(deploy, "read", read("app/main.go")); res.Error != nil || res.IsError {
		t.Errorf("deploy reads app/main.go: %+v", res)
	}
	wantCode(t, call(deploy, "read", read("other.txt")), protocol.CodeDenied, "callers.deploy", "outside paths.allow")
	wantCode(t, call(deploy, "bash", map[string]string{"command": "true"}), protocol.CodeDenied, "callers.deploy", "bash")
	if res := call(sre, "read", read("other.txt")); res.Error != nil || res.IsError {
		t.Errorf("sre reads other.txt: %+v", res)
	}
	if res := call(sre, "bash", map[string]string{"command": "echo hi"}); res.Error != nil || res.IsError {
		t.Errorf("sre runs bash: %+v", res)
	}
	wantCode(t, call(nobody, "read", read("app/main.go")), protocol.CodeDenied, "mallory", "matches no entry")
	// The JSON claims sre, the envelope says mallory: mallory it is.
	c := newCall(host, "lying-1", "bash", map[string]string{"command": "true"})
	c.Caller = nobody
	x := newExchange(t, nc)
	frames := callFrames(t, c, x.sub.Subject, 0)
	var body protocol.Call
	_ = json.Unmarshal(frames[0].Data, &body)
	if body.Caller.Subject != "mallory" {
		t.Fatal("the test's call is not mallory's")
	}
	publishFrames(t, nc, host, x.sub.Subject, frames)
	res, _ := x.result(t, "lying-1")
	wantCode(t, res, protocol.CodeDenied, "mallory")
}

// memKeyStore records the key states an agent stores.
type memKeyStore struct {
	mu    sync.Mutex
	saved []protocol.KeyState
}

func (s *memKeyStore) SaveGatewayKeys(st protocol.KeyState) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved = append(s.saved, st)
	return nil
}

// TestAgentKeyRotation: a key set pushed by a gateway, signed by the key
// the agent trusts, adds the new key (announced and stored); retiring
// the old key makes the agent refuse it; a set signed by a key it does
// not trust changes nothing.
func TestAgentKeyRotation(t *testing.T) {
	const host = "rot-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	store := &memKeyStore{}
	runAgent(t, ns, Config{Name: host, KeyStore: store, Heartbeat: 100 * time.Millisecond})
	nextAnnounce(t, pres, host, false)
	refused := refusals(t, nc, host)
	old := testGatewayPriv()
	_, next, _ := ed25519.GenerateKey(nil)
	nextKey := protocol.FormatSigningKey(next.Public().(ed25519.PublicKey))
	oldKey := testGatewayKeys()[0]
	rotate, _ := protocol.SignKeySet(protocol.KeySet{Serial: 1, Keys: []string{nextKey, oldKey}, At: time.Now()}, old, next)
	retire, _ := protocol.SignKeySet(protocol.KeySet{Serial: 2, Keys: []string{nextKey}, At: time.Now()}, next)
	push := func(sets ...protocol.SignedKeySet) {
		data, _ := json.Marshal(protocol.KeySetChain{Sets: sets})
		if err := nc.Publish(protocol.KeysPushSubject(host), data); err != nil {
			t.Fatal(err)
		}
	}
	waitKeys := func(n int) protocol.Announce {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if a := nextAnnounce(t, pres, host, false); len(a.TrustedKeys) == n {
				return a
			}
		}
		t.Fatalf("the agent never announced %d trusted keys", n)
		return protocol.Announce{}
	}
	_, rogue, _ := ed25519.GenerateKey(nil)
	bogus, _ := protocol.SignKeySet(protocol.KeySet{Serial: 1, Keys: []string{nextKey}, At: time.Now()}, rogue)
	push(bogus)
	push(rotate)
	a := waitKeys(2)
	if a.TrustedKeys[0] != protocol.NewEnvelopeSigner(next).KeyID() {
		t.Errorf("trusted keys %v, want the new key first", a.TrustedKeys)
	}
	signedBy := func(priv ed25519.PrivateKey, id string) exchange {
		x := newExchange(t, nc)
		frames := callFrames(t, newCall(host, id, "bash", map[string]string{"command": "true"}), x.sub.Subject, 0)
		frames[0].Auth = protocol.NewEnvelopeSigner(priv).Sign(claimsOf(t, frames[0].Auth))
		publishFrames(t, nc, host, x.sub.Subject, frames)
		return x
	}
	for i, priv := range []ed25519.PrivateKey{old, next} {
		id := []string{"by-old", "by-new"}[i]
		if res, _ := signedBy(priv, id).result(t, id); res.Error != nil {
			t.Errorf("during the overlap, %s: %+v", id, res)
		}
	}
	push(rotate, retire)
	waitKeys(1)
	signedBy(old, "old-after")
	if r := nextRefusal(t, refused); r.Reason != protocol.RefusedUnknownKey {
		t.Errorf("the retired key: refusal %+v", r)
	}
	if res, _ := signedBy(next, "new-after").result(t, "new-after"); res.Error != nil {
		t.Errorf("the new key after the retirement: %+v", res)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.saved) != 2 || store.saved[1].Serial != 2 {
		t.Errorf("stored key states %+v, want serials 1 and 2", store.saved)
	}
}

// TestAgentWithoutKeys: an agent enrolled before calls were signed runs
// nothing, says so, and announces that it trusts no key.
func TestAgentWithoutKeys(t *testing.T) {
	const host = "nokeys-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	runAgent(t, ns, Config{Name: host, GatewayKeys: []string{}})
	if a := nextAnnounce(t, pres, host, false); len(a.TrustedKeys) != 0 {
		t.Fatalf("trusted keys %v", a.TrustedKeys)
	}
	refused := refusals(t, nc, host)
	x := sendCall(t, nc, newCall(host, "nk-1", "bash", map[string]string{"command": "true"}))
	if r := nextRefusal(t, refused); r.Reason != protocol.RefusedNoKeys || !strings.Contains(r.Message, "enrol it again") {
		t.Errorf("refusal %+v", r)
	}
	if m, err := x.sub.NextMsg(150 * time.Millisecond); err == nil {
		t.Errorf("answered: %s", m.Data)
	}
}

// TestAgentReceipts: every result carries a receipt signed by the
// agent's own key, of exactly that result: results of calls, refusals,
// and results fetched again.
func TestAgentReceipts(t *testing.T) {
	const host = "rcpt-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	seed, _ := user.Seed()
	acct, _ := nkeys.CreateAccount()
	uc := jwt.NewUserClaims(pub)
	uc.Name = host
	token, err := uc.Encode(acct)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, ns, Config{Name: host, Credentials: Credentials{JWT: func() (string, error) { return token, nil }, Seed: seed}})
	nextAnnounce(t, pres, host, false)
	check := func(x exchange, id string, wantOutcome string, wantExit *int) {
		t.Helper()
		var asm *protocol.Assembly
		for {
			f := x.next(t, 10*time.Second)
			if f.Kind != protocol.KindResult {
				continue
			}
			if f.Part == 1 {
				asm = protocol.NewAssembly(0)
			}
			done, err := asm.Add(f)
			if err != nil {
				t.Fatal(err)
			}
			if !done {
				if f.Receipt != "" {
					t.Error("a receipt on a part before the last")
				}
				continue
			}
			res, _ := protocol.DecodeResult(asm.Bytes())
			r, err := protocol.ParseReceipt(f.Receipt)
			if err == nil {
				err = r.Verify(pub)
			}
			if err == nil {
				err = r.Matches(host, id, res, asm.Bytes())
			}
			if err != nil {
				t.Fatalf("receipt of %s: %v", id, err)
			}
			if r.Outcome != wantOutcome || (wantExit == nil) != (r.ExitCode == nil) || wantExit != nil && *r.ExitCode != *wantExit || r.End.Before(r.Start) {
				t.Errorf("receipt of %s: %+v, want outcome %s exit %v", id, r, wantOutcome, wantExit)
			}
			return
		}
	}
	three := 3
	check(sendCall(t, nc, newCall(host, "r-1", "bash", map[string]string{"command": "exit 3"})), "r-1", protocol.OutcomeToolError, &three)
	check(sendFetch(t, nc, host, "r-1"), "r-1", protocol.OutcomeToolError, &three)
	check(sendCall(t, nc, newCall(host, "r-2", "frob", map[string]string{})), "r-2", string(protocol.CodeUnknownTool), nil)
	zero := 0
	check(sendCall(t, nc, newCall(host, "r-3", "bash", map[string]string{"command": "echo " + strings.Repeat("z", 100<<10)})), "r-3", protocol.OutcomeOK, &zero)
}
