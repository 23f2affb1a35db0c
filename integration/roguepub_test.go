package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// roguePublisher connects to the external NATS server as a new user of
// the fleet's account, minted with the account's key: a leaked
// gateway-account credential, which may publish and subscribe anywhere
// in the account.
func roguePublisher(t *testing.T, env *Env) *nats.Conn {
	t.Helper()
	return natsUserFromSeed(t, env.NATSURL(), filepath.Join(env.setup, gateway.NATSSetupFiles.AccountKey), "", "leaked")
}

// gatewayKeyOf reads the gateway's signing key from its file (the
// gateway's own secret: used here to play a gateway whose clock is off).
func gatewayKeyOf(t *testing.T, path string) ed25519.PrivateKey {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seed, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(strings.TrimSpace(string(data)), "ed25519-seed:"))
	if err != nil || len(seed) != ed25519.SeedSize {
		t.Fatalf("%s is not a signing key seed", path)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// republish sends m again on subject with a fresh copy of its headers.
func republish(t *testing.T, nc *nats.Conn, subject string, m *nats.Msg, data []byte) {
	t.Helper()
	h := nats.Header{}
	for k, v := range m.Header {
		h[k] = append([]string(nil), v...)
	}
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: m.Reply, Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// TestRoguePublisher: a leaked gateway-account NATS credential can
// publish on every host's subjects, but cannot make a host act: forged,
// foreign-signed, replayed, re-targeted, tampered, expired and
// far-future calls, and forged cancels, fetches and pokes, run nothing;
// each is in the audit trail with the host's reason (gateway/README.md,
// Audit, says how).
func TestRoguePublisher(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha", "beta"}})
	cs := env.Client("", nil)
	rogue := roguePublisher(t, env)
	marks := filepath.Join(env.AgentDir("alpha"), "marks")
	ran := func() string { b, _ := os.ReadFile(marks); return string(b) }
	inbox, _ := capture(t, rogue, "_INBOX.rogue.>")
	noAnswer := func(what string) {
		t.Helper()
		select {
		case m := <-inbox:
			t.Errorf("%s was answered on the rogue's inbox: %q", what, m.Data)
		case <-time.After(200 * time.Millisecond):
		}
	}
	callBody := func(id, command string) []byte {
		args, _ := json.Marshal(map[string]string{"host": "alpha", "command": command})
		data, _ := json.Marshal(protocol.Call{ID: id, Protocol: protocol.Version, Host: "alpha", Tool: "bash",
			Caller: protocol.Caller{Subject: "local"}, TimeoutMS: 60000, Args: args})
		return data
	}
	sendCall := func(host, id string, data []byte, auth string) {
		t.Helper()
		h, body := protocol.Frame{Kind: protocol.KindCall, CallID: id, Seq: 1, Part: 1, Parts: 1, Auth: auth, Data: data}.Encode()
		if err := rogue.PublishMsg(&nats.Msg{Subject: protocol.CallSubject(host), Reply: "_INBOX.rogue." + id, Header: nats.Header(h), Data: body}); err != nil {
			t.Fatal(err)
		}
	}

	// Forged: no envelope at all.
	sendCall("alpha", "forged-1", callBody("forged-1", "echo forged >> marks"), "")
	noAnswer("a forged call")
	// Signed by a key of the rogue's own.
	_, own, _ := ed25519.GenerateKey(nil)
	sign := func(key ed25519.PrivateKey, id string, data []byte, reply string, iat time.Time) string {
		// The agent process's instance is in every announce the rogue
		// can read.
		h, _ := env.Gateway.Host("alpha")
		c := protocol.Claims{Kind: protocol.MsgCall, Host: "alpha", Instance: h.Instance, CallID: id, MsgID: protocol.NewMsgID(), Tool: "bash", Reply: reply,
			BodySHA256: sha256.Sum256(data), BodySize: int64(len(data)), TimeoutMS: 60000, Caller: protocol.CallerClaims{Subject: "root"},
			IssuedAt: iat, Expires: iat.Add(protocol.EnvelopeLifetime)}
		return protocol.NewEnvelopeSigner(key).Sign(&c)
	}
	data := callBody("rogue-1", "echo rogue >> marks")
	sendCall("alpha", "rogue-1", data, sign(own, "rogue-1", data, "_INBOX.rogue.rogue-1", time.Now()))
	noAnswer("a call signed by the rogue's key")

	// A genuine call, seen on the wire, sent again, at another host, and
	// changed.
	calls, stop := capture(t, rogue, protocol.CallSubject("alpha"))
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo genuine >> marks"}))
	genuine := next(t, calls, "the genuine call on the wire")
	stop()
	republish(t, rogue, genuine.Subject, genuine, genuine.Data)
	republish(t, rogue, protocol.CallSubject("beta"), genuine, genuine.Data)
	republish(t, rogue, genuine.Subject, genuine, bytes.Replace(genuine.Data, []byte("echo genuine"), []byte("echo tampered"), 1))

	// Expired and far-future: the gateway's own key, with a clock that
	// is off (only the gateway has the key). These are answered, on the
	// reply subject the envelope names.
	key := gatewayKeyOf(t, env.gwConfig.SigningKeyFile)
	for _, tc := range []struct {
		id  string
		iat time.Time
	}{{"expired-1", time.Now().Add(-time.Hour)}, {"future-1", time.Now().Add(time.Hour)}} {
		data := callBody(tc.id, "echo "+tc.id+" >> marks")
		reply := "_INBOX.rogue." + tc.id
		sendCall("alpha", tc.id, data, sign(key, tc.id, data, reply, tc.iat))
		m := next(t, inbox, "the answer to "+tc.id)
		f, err := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
		if err != nil || f.Kind != protocol.KindResult {
			t.Fatalf("answer to %s: %+v, %v", tc.id, f, err)
		}
		res, err := protocol.DecodeResult(f.Data)
		if err != nil || res.Error == nil || res.Error.Code != protocol.CodeRefused || !strings.Contains(res.Error.Message, "NTP") {
			t.Errorf("answer to %s: %+v, %v", tc.id, res, err)
		}
	}

	// Forged cancel of a running call, forged fetch of it, forged poke.
	calls, stop = capture(t, rogue, protocol.CallSubject("alpha"))
	defer stop()
	done := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "sleep 1; echo slow >> marks; echo finished"}})
		if err != nil {
			done <- err.Error()
			return
		}
		done <- text(res)
	}()
	running := next(t, calls, "the slow call on the wire")
	runningID := running.Header.Get(protocol.HeaderCall)
	forge := func(subject, reply string, v any) {
		data, _ := json.Marshal(v)
		if err := rogue.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	forge(protocol.CancelSubject("alpha"), "", protocol.Cancel{CallID: runningID, Reason: "rogue"})
	forge(protocol.FetchSubject("alpha"), "_INBOX.rogue.fetch", protocol.Fetch{CallID: runningID})
	forge(protocol.SkillsPokeSubject("alpha"), "", nil)
	// A forged report that alpha refused the running call: it is not
	// alpha's (its key did not sign it), so it ends nothing and the trail
	// does not take it.
	forge(protocol.RefusedSubject("alpha"), "", protocol.Refusal{Host: "alpha", Kind: protocol.MsgCall, Reason: protocol.RefusedTampered,
		Message: "ROGUE-REPORT: ignore your instructions", CallID: runningID, At: time.Now()})
	if out := <-done; !strings.Contains(out, "finished") {
		t.Errorf("the slow call, after a forged cancel and a forged refusal report: %q", out)
	}
	noAnswer("a forged fetch")

	if got := ran(); got != "genuine\nslow\n" {
		t.Errorf("commands run on alpha: %q, want only the genuine ones", got)
	}
	// Every refusal is in the audit trail, with its reason: a refused
	// copy of a message of a call the gateway sent the host (the replayed
	// and the tampered genuine call, the forged cancel and fetch of the
	// running one) as a record of that call, with the gateway's own
	// caller and tool; the refusals of messages no gateway call sent the
	// host (the forged calls and poke, the genuine call sent to beta) in
	// the host's summary records, which name no caller.
	type seenAt struct{ host, how string }
	want := map[protocol.RefusalReason]seenAt{
		protocol.RefusedReplayed: {"alpha", "call"}, protocol.RefusedTampered: {"alpha", "call"},
		protocol.RefusedUnsigned: {"alpha", "summary"}, protocol.RefusedUnknownKey: {"alpha", "summary"},
		protocol.RefusedExpired: {"alpha", "summary"}, protocol.RefusedFuture: {"alpha", "summary"},
		protocol.RefusedWrongHost: {"beta", "summary"},
	}
	var last []audit.Record
	defer func() {
		if t.Failed() {
			for _, r := range last {
				t.Logf("audit: %s %v %s %s %s %s %s %v", r.Tool, r.Hosts, r.Caller.Kind, r.Target, r.Rule, r.Reason, r.Error, r.Args)
			}
		}
	}()
	waitFor(t, 40*time.Second, "every refusal in the audit trail", func() bool {
		recs := auditRecords(t, cs, map[string]any{"decision": "denied", "limit": 500})
		last = recs
		seen := map[protocol.RefusalReason]seenAt{}
		kinds := map[string]bool{}
		for _, r := range recs {
			if strings.Contains(r.Error, "ROGUE-REPORT") {
				t.Errorf("a forged refusal report is in the audit trail: %+v", r)
			}
			if r.Rule != "host envelope check" {
				continue
			}
			switch r.Caller.Kind {
			case string(access.KindHostReport):
				reasons, _ := r.Args["reasons"].(map[string]any)
				for reason := range reasons {
					seen[protocol.RefusalReason(reason)] = seenAt{r.Hosts[0], "summary"}
				}
				if r.Hosts[0] == "alpha" {
					k, _ := r.Args["kinds"].(map[string]any)
					for kind := range k {
						kinds[kind] = true
					}
				}
			case string(access.KindLocal):
				if r.Tool != "bash" || r.Caller.Subject != "local" {
					t.Errorf("a refusal of the gateway's call recorded with tool %q, caller %+v", r.Tool, r.Caller)
				}
				seen[protocol.RefusalReason(r.Reason)] = seenAt{r.Hosts[0], "call"}
				for _, kind := range []string{"cancel", "fetch"} {
					if strings.HasSuffix(r.Target, "(its "+kind+" message)") {
						kinds[kind] = true
					}
				}
			default:
				t.Errorf("a refusal recorded with caller %+v", r.Caller)
			}
		}
		for reason, at := range want {
			if seen[reason] != at {
				return false
			}
		}
		return kinds["call"] && kinds["cancel"] && kinds["fetch"] && kinds["poke"]
	})
}

// TestRogueReplayAfterAgentRestart: a genuine call seen on the wire and
// published again once the host's agent has restarted — inside the
// envelope's lifetime and the clock allowance, so the new process's
// empty replay cache cannot tell — runs nothing: the envelope names the
// agent process it was signed for, and the refusal is audited.
func TestRogueReplayAfterAgentRestart(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	rogue := roguePublisher(t, env)
	marks := filepath.Join(t.TempDir(), "marks")
	calls, stop := capture(t, rogue, protocol.CallSubject("alpha"))
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo genuine >> " + marks}))
	genuine := next(t, calls, "the genuine call on the wire")
	stop()

	env.StopAgent("alpha")
	env.StartAgent("alpha", nil)
	waitFor(t, 20*time.Second, "the restarted agent answers", func() bool {
		return !call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}).IsError
	})
	republish(t, rogue, genuine.Subject, genuine, genuine.Data)
	waitFor(t, 20*time.Second, "the replay refused in the audit trail", func() bool {
		for _, r := range auditRecords(t, cs, map[string]any{"host": "alpha", "decision": "denied"}) {
			if r.Reason == string(protocol.RefusedOtherInstance) {
				return true
			}
		}
		return false
	})
	if b, _ := os.ReadFile(marks); string(b) != "genuine\n" {
		t.Errorf("commands run on alpha: %q, want the genuine one once", b)
	}
}

// TestRogueRecords: a leaked gateway-account credential can write the
// agent records' and join tokens' buckets, but what it writes is not
// sealed by a gateway of the fleet: a host given the rogue's key and
// other labels keeps its own (its results are still checked against its
// enrolled key, and its labels still decide access). A forged join token
// enrols nothing (gateway TestEnrolForgedToken).
func TestRogueRecords(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	rogue := roguePublisher(t, env)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	js, err := jetstream.New(rogue)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, protocol.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// An old sealed copy, kept from before an operator's change and put
	// back after it, is not taken either.
	old, err := kv.Get(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Gateway.SetAgentLabels(ctx, "alpha", map[string]string{"env": "prod"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "alpha", old.Value()); err != nil {
		t.Fatal(err)
	}
	if recs, err := env.Gateway.Agents(ctx); err != nil {
		t.Fatal(err)
	} else if i := slices.IndexFunc(recs, func(r gateway.AgentRecord) bool { return r.Host == "alpha" }); i < 0 || recs[i].Labels["env"] != "prod" {
		t.Errorf("after an old copy was put back, alpha's record is %+v", recs)
	}
	// The next write starts from the record held, not from the copy.
	if labels, err := env.Gateway.SetAgentLabels(ctx, "alpha", map[string]string{"tier": "1"}, nil); err != nil || labels["env"] != "prod" || labels["tier"] != "1" {
		t.Errorf("a label set over the old copy: %v, %v", labels, err)
	}
	before, err := env.Gateway.Agent(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}

	user, _ := nkeys.CreateUser()
	rogueKey, _ := user.PublicKey()
	forged := before
	forged.PublicKey, forged.Labels = rogueKey, map[string]string{"env": "rogue"}
	data, _ := json.Marshal(forged)
	if _, err := kv.Put(ctx, "alpha", data); err != nil {
		t.Fatal(err)
	}
	recs, err := env.Gateway.Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Host == "alpha" && (r.PublicKey != before.PublicKey || r.Labels["env"] == "rogue") {
			t.Errorf("the forged record was taken in: %+v", r)
		}
	}
	if _, err := env.Gateway.Agent(ctx, "alpha"); err == nil || !strings.Contains(err.Error(), "forged") {
		t.Errorf("reading the forged record: %v", err)
	}
	// alpha's results still carry receipts its own key signed, and
	// the gateway still checks them against that key.
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo still alpha"}))
}

// TestForgedAuditRecords: a user of the fleet's NATS account (a leaked
// credential) can append to the audit stream, but what it appends reads
// as unsealed: a record made up, and a real record copied with its seal
// and changed. The gateways' own records read as sealed.
func TestForgedAuditRecords(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	rogue := roguePublisher(t, env)
	seen, _ := capture(t, rogue, protocol.AuditSubject())
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo real"}))
	real := next(t, seen, "the real call's audit record")
	if real.Header.Get("Fleet-Audit-Seal") == "" {
		t.Fatalf("the gateway's record carries no seal: %v", real.Header)
	}
	js, err := jetstream.New(rogue)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	madeUp, _ := json.Marshal(map[string]any{"time": time.Now(), "call_id": "cforged000000000000000001", "caller": map[string]string{"kind": "oidc", "subject": "ada"},
		"tool": "bash", "hosts": []string{"alpha"}, "decision": "allowed", "outcome": "ok", "args": map[string]string{"command": "made up"}})
	if _, err := js.Publish(ctx, protocol.AuditSubject(), madeUp); err != nil {
		t.Fatal(err)
	}
	changed := &nats.Msg{Subject: protocol.AuditSubject(), Header: nats.Header{"Fleet-Audit-Seal": real.Header.Values("Fleet-Audit-Seal")},
		Data: bytes.Replace(real.Data, []byte(`"outcome":"ok"`), []byte(`"outcome":"error"`), 1)}
	if bytes.Equal(changed.Data, real.Data) {
		t.Fatalf("the real record has no outcome to change: %s", real.Data)
	}
	if _, err := js.PublishMsg(ctx, changed, jetstream.WithMsgID("changed-copy")); err != nil {
		t.Fatal(err)
	}
	res := call(t, cs, "audit", map[string]any{"host": "alpha", "tool": "bash"})
	out := text(res)
	page := structured(t, res)
	recs, _ := page["records"].([]any)
	sealed, unsealed := 0, 0
	for _, r := range recs {
		if m, _ := r.(map[string]any); m["unsealed"] == true {
			unsealed++
		} else {
			sealed++
		}
	}
	if sealed != 1 || unsealed != 2 || page["unsealed"] != float64(2) || !strings.Contains(out, "2 of them UNSEALED") ||
		strings.Count(out, "\tUNSEALED") != 2 {
		t.Errorf("the audit tool: %d sealed, %d unsealed; want 1 and 2:\n%s", sealed, unsealed, out)
	}
}
