package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// auditServer is a JetStream server on a fixed loopback port and store,
// so that a test can stop it and start it again.
type auditServer struct {
	t     *testing.T
	port  int
	store string
	ns    *server.Server
}

func newAuditServer(t *testing.T) *auditServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &auditServer{t: t, port: port, store: t.TempDir()}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *auditServer) start() {
	s.t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: s.port, NoSigs: true, NoLog: true, JetStream: true, StoreDir: s.store})
	if err != nil {
		s.t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		s.t.Fatal("NATS server not ready")
	}
	s.ns = ns
}

func (s *auditServer) stop() {
	if s.ns != nil {
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
		s.ns = nil
	}
}

func (s *auditServer) auditor(t *testing.T) (*Trail, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(s.port), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := Config{}
	cfg.SetDefaults()
	a, err := Open(nc, cfg, Options{MaxCall: time.Minute, Patience: StreamPatience, Log: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a, nc
}

// streamCount returns the messages in the audit stream per call ID.
func streamCount(t *testing.T, nc *nats.Conn) map[string]int {
	t.Helper()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, protocol.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			CallID string `json:"call_id"`
		}
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			t.Fatalf("seq %d: %v", seq, err)
		}
		out[rec.CallID]++
	}
	return out
}

// Concurrent commits are each stored once, and each returns once its own
// record is in the stream.
func TestAuditCommitStoresEachOnce(t *testing.T) {
	s := newAuditServer(t)
	a, nc := s.auditor(t)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			errs <- a.Commit(context.Background(), &Record{Time: time.Now(), CallID: fmt.Sprintf("c-%d", i), Tool: "bash", Decision: DecisionAllowed, Outcome: OutcomeOK})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := streamCount(t, nc)
	if len(got) != 200 {
		t.Fatalf("the stream holds %d call IDs, want 200", len(got))
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s stored %d times", id, n)
		}
	}
	if n := a.pending.Load(); n != 0 {
		t.Errorf("%d records pending after every commit returned", n)
	}
}

// A record sent again within the duplicate window is stored once (the
// stream drops the second); one whose window has passed is looked for
// first: found, it is not sent again; not found, it is sent; found under
// its ID but not itself (someone else's message), it is sent under a new
// ID and the message reported.
func TestAuditResendBeyondWindow(t *testing.T) {
	s := newAuditServer(t)
	a := s.sealedAuditor(t, testSeal(t))
	nc := a.js.Conn()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	longAgo := time.Now().Add(-auditResendSafe - 10*time.Second)
	rec := func(id string, since time.Time) *pendingRecord {
		return &pendingRecord{id: id, data: []byte(`{"call_id":"` + id + `"}`), ticket: newTicket(), since: since, msgID: newAuditMsgID()}
	}
	recs := []*pendingRecord{rec("landed-recent", time.Now().Add(-time.Second)), rec("landed-long-ago", longAgo), rec("lost-long-ago", longAgo), rec("forged-long-ago", longAgo)}
	// As if the first sends had been stored and their acknowledgements
	// lost.
	for _, r := range recs[:2] {
		tail, err := a.chainTail()
		if err != nil {
			t.Fatal(err)
		}
		m, opts := a.chained(r, tail)
		if _, err := js.PublishMsg(ctx, m, opts...); err != nil {
			t.Fatal(err)
		}
		a.forgetTail()
	}
	// Someone else's message under the last one's ID.
	if _, err := js.Publish(ctx, protocol.AuditSubject(), []byte(`{"call_id":"forged-long-ago","tool":"junk"}`), pubOpts(recs[3].msgID)...); err != nil {
		t.Fatal(err)
	}
	a.pending.Add(int64(len(recs)))
	if left := a.send(recs); len(left) != 0 {
		t.Fatalf("%d records left unstored", len(left))
	}
	for _, r := range recs {
		if err := waitStored(ctx, time.Second, r.ticket); err != nil {
			t.Errorf("%s: %v", r.id, err)
		}
	}
	got := streamCount(t, nc)
	want := map[string]int{"landed-recent": 1, "landed-long-ago": 1, "lost-long-ago": 1, "forged-long-ago": 2}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("%s stored %d times, want %d", id, got[id], n)
		}
	}
	if len(got) != len(want) {
		t.Errorf("the stream holds %v", got)
	}
	if damages, n := a.Damages(); n != 1 || !strings.Contains(damages[0].What, "record of call forged-long-ago (seq 3)") {
		t.Errorf("%d damages reported, want the forged one: %+v", n, damages)
	}
	rep, err := a.VerifyChain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p := problems(rep); p != "unchained@3 unsealed@3" {
		t.Errorf("verify names %q, want the forged message only\n%s", p, rep.Summary())
	}
}

// While the stream takes no records, a call's record is not stored in
// time (its call is answered with an error) and new calls wait, then are
// refused without waiting; once it is back, the record is stored (once)
// and calls go on.
func TestAuditUnavailable(t *testing.T) {
	s := newAuditServer(t)
	a, nc := s.auditor(t)
	a.commitWait = time.Second
	ctx := context.Background()
	if err := a.Commit(ctx, &Record{CallID: "before", Tool: "bash"}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	ticket := a.Write(&Record{CallID: "during", Tool: "bash"})
	if err := waitStored(ctx, a.commitWait, ticket); err == nil {
		t.Fatal("a record was reported stored while the server was down")
	}
	// The writer finds the stream down once a send goes unacknowledged
	// (auditAttempt), which on a busy machine may be after the record's
	// own wait ended.
	waitUntil(t, "the writer to find the stream down for longer than the commit wait", func() bool {
		up, since, _ := a.health.state()
		select {
		case <-up:
			return false
		default:
		}
		return time.Since(since) > a.commitWait
	})
	var unavailable *UnavailableError
	start := time.Now()
	if err := a.Ready(ctx); !errors.As(err, &unavailable) {
		t.Fatalf("ready while the stream is down: %v; want UnavailableError", err)
	}
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Errorf("ready took %s to refuse a stream down for longer than the commit wait; want at once", took)
	}
	t.Logf("refusal: %v", unavailable)
	s.start()
	if err := waitStored(ctx, 20*time.Second, ticket); err != nil {
		t.Fatalf("the record of the outage was not stored once the server was back: %v", err)
	}
	waitUntil(t, "the stream takes records again", func() bool { return a.Ready(ctx) == nil })
	if err := a.Commit(ctx, &Record{CallID: "after", Tool: "bash"}); err != nil {
		t.Fatal(err)
	}
	got := streamCount(t, nc)
	for _, id := range []string{"before", "during", "after"} {
		if got[id] != 1 {
			t.Errorf("%s stored %d times, want once", id, got[id])
		}
	}
}
