package enrol

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// startService runs a Service over a JetStream server of its own, its
// credentials issued by a stub.
func startService(t *testing.T) *Service {
	t.Helper()
	ns := natstest.StartJetStream(t, &server.Options{StoreDir: t.TempDir()})
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	seal, err := NewSeal(kp)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	index := NewIndex()
	agents, err := OpenAgents(nc, index, seal, 1, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agents.Close)
	s := New(Config{Log: log, Now: time.Now, CredentialTTL: time.Hour, RetryWindow: time.Minute, Replicas: 1,
		Issuer: stubIssuer{}, Dial: func() Dial { return Dial{} }}, index, agents)
	if err := s.Open(js, seal, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// stubIssuer issues credentials that are not ones.
type stubIssuer struct{}

func (stubIssuer) AgentJWT(host, _ string, _ time.Time) (string, error) { return "jwt-" + host, nil }
func (stubIssuer) EnrolJWT(id, _ string, _ time.Time) (string, error)   { return "enrol-" + id, nil }
func (stubIssuer) CheckIssuable(string) error                           { return nil }

// lostAnswerKV stores what Create is given but answers the first lost
// calls as JetStream does when a leader election swallows the reply.
type lostAnswerKV struct {
	jetstream.KeyValue
	lost atomic.Int32
}

func (kv *lostAnswerKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := kv.KeyValue.Create(ctx, key, value, opts...)
	if kv.lost.Add(-1) >= 0 {
		return 0, context.DeadlineExceeded
	}
	return rev, err
}

// TestNonceRecordRetried: a nonce whose write was stored but whose answer
// was lost (an election) is recorded on the next attempt, not refused as
// replayed by its own first write; a nonce another request wrote is
// still a replay, whatever the answers lost on the way.
func TestNonceRecordRetried(t *testing.T) {
	svc := startService(t)
	kv := &lostAnswerKV{KeyValue: svc.nonces.kv}
	s := &nonceStore{kv: kv}
	ctx := context.Background()

	kv.lost.Store(2)
	n := protocol.NewNonce()
	if aerr := s.record(ctx, n); aerr != nil {
		t.Fatalf("a nonce whose first two answers were lost: %v", aerr)
	}
	if aerr := s.record(ctx, n); aerr == nil || aerr.Code != protocol.APIReplayed {
		t.Errorf("the same nonce again: %v, want replayed", aerr)
	}
	kv.lost.Store(1)
	if aerr := s.record(ctx, n); aerr == nil || aerr.Code != protocol.APIReplayed {
		t.Errorf("the same nonce again, its answer lost on the way: %v, want replayed", aerr)
	}
	kv.lost.Store(jskv.Attempts)
	if aerr := s.record(ctx, protocol.NewNonce()); aerr == nil || aerr.Code != protocol.APIUnavailable {
		t.Errorf("every answer lost: %v, want unavailable", aerr)
	}
}

// TestGiveBackUse: a use a failed enrolment spent goes back to its token,
// unless the enrolment may be stored (a record write whose answer was
// lost, or a failure after the write): then the token would count one
// enrolment fewer than it made, and the use stays spent.
func TestGiveBackUse(t *testing.T) {
	gw := startService(t)
	ctx := context.Background()
	resp, err := gw.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Uses: 2}, "test")
	if err != nil {
		t.Fatal(err)
	}
	id, secret, err := protocol.ParseJoinToken(resp.Token)
	if err != nil {
		t.Fatal(err)
	}
	used := func() int {
		t.Helper()
		tok, _, err := gw.tokens.get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Used
	}
	if _, aerr := gw.tokens.consume(ctx, id, secret, gw.now, func(*tokenRecord) *protocol.APIError { return nil }); aerr != nil {
		t.Fatal(aerr)
	}
	lost := fmt.Errorf("enrol web-1: %w", context.DeadlineExceeded)
	gw.giveBackUse(ctx, id, "web-1", maybeStored{lost})
	if n := used(); n != 1 {
		t.Fatalf("after a failure that may be stored the token counts %d uses, want 1 (kept spent)", n)
	}
	gw.giveBackUse(ctx, id, "web-1", fmt.Errorf("enrol web-1: %w", ErrNameTaken))
	if n := used(); n != 0 {
		t.Fatalf("after a failure that wrote nothing the token counts %d uses, want 0 (given back)", n)
	}
	// The API error the host gets for either says to try again or why not.
	if aerr := enrolError("web-1", maybeStored{lost}); aerr.Code != protocol.APIUnavailable {
		t.Errorf("a failure that may be stored answers %s, want %s", aerr.Code, protocol.APIUnavailable)
	}
}
