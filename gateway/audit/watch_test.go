package audit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// sealedAuditor is s.auditor with the records sealed, as a gateway's are.
func (s *auditServer) sealedAuditor(t *testing.T, seal Sealer) *Trail {
	t.Helper()
	a, _ := s.auditor(t)
	a.seal = seal
	return a
}

func adminStream(t *testing.T, nc *nats.Conn) (jetstream.JetStream, context.Context) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return js, ctx
}

// Two gateways writing the same stream at once chain every record to the
// one stored before it: the chain reads whole, from records stored before
// chaining (an upgraded stream) to the last.
func TestAuditChainTwoWriters(t *testing.T) {
	s := newAuditServer(t)
	seal := testSeal(t)
	first := s.sealedAuditor(t, seal)
	// Records as a gateway stored them before chaining.
	nc := first.js.Conn()
	for i := range 3 {
		id := fmt.Sprintf("unchained-%d", i)
		data := recordJSON(id, "bash")
		m := &nats.Msg{Subject: protocol.AuditSubject(), Data: data, Header: nats.Header{auditSealHeader: {seal.Mark(false, id, data)}}}
		if _, err := first.js.PublishMsg(context.Background(), m, pubOpts(id)...); err != nil {
			t.Fatal(err)
		}
	}
	second := s.sealedAuditor(t, seal)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 100 {
		for j, a := range []*Trail{first, second} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- a.Commit(context.Background(), &Record{CallID: fmt.Sprintf("w%d-%d", j, i), Tool: "bash", Decision: DecisionAllowed})
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	rep, err := second.VerifyChain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Intact || rep.Records != 203 || rep.Chained != 200 || rep.Unchained != 3 {
		t.Fatalf("%+v\n%s", rep, rep.Summary())
	}
	_ = nc
}

// waitDamage waits up to 10 s for the watcher to report damage
// containing what, and returns how long it took.
func waitDamage(t *testing.T, a *Trail, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 10*time.Second {
		damages, _ := a.Damages()
		for _, d := range damages {
			if strings.Contains(d.What, what) {
				return time.Since(start)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	damages, n := a.Damages()
	t.Fatalf("no damage %q reported within 10 s; %d reported: %+v", what, n, damages)
	return 0
}

// A deleted stream is seen within 10 s, created again with its
// configuration, and the loss recorded as the new stream's first record;
// calls go on being recorded, and verify names the gap.
func TestAuditWatchDeleted(t *testing.T) {
	s := newAuditServer(t)
	a := s.sealedAuditor(t, testSeal(t))
	ctx := context.Background()
	for i := range 4 {
		if err := a.Commit(ctx, &Record{CallID: fmt.Sprintf("before-%d", i), Tool: "bash"}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(auditWatchEvery + 500*time.Millisecond) // the watcher has seen the four
	js, jctx := adminStream(t, a.js.Conn())
	if err := js.DeleteStream(jctx, protocol.AuditStream); err != nil {
		t.Fatal(err)
	}
	took := waitDamage(t, a, "deleted; lost sequences 1-4 (4 records when last read, 0 stored since)")
	t.Logf("deletion seen after %s", took)
	if err := a.Commit(ctx, &Record{CallID: "after", Tool: "bash"}); err != nil {
		t.Fatalf("a call after the deletion: %v", err)
	}
	info, err := a.stream.Info(jctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Config.DenyDelete || !info.Config.DenyPurge || info.Config.MaxAge != a.retention {
		t.Errorf("the stream was created again with %+v", info.Config)
	}
	rep, err := a.VerifyChain(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Intact || len(rep.Gaps) != 1 || !strings.Contains(rep.Gaps[0].Detail, "lost sequences 1-4") || rep.Records != 2 {
		t.Fatalf("%+v\n%s", rep, rep.Summary())
	}
}

// A stream cut to its last record by lowering max_msgs is seen, the cut
// named, and (with a credential allowed to) the configuration put back;
// without one, it is reported as not put back.
func TestAuditWatchTruncated(t *testing.T) {
	for _, restore := range []bool{false, true} {
		t.Run(fmt.Sprintf("restore=%v", restore), func(t *testing.T) {
			s := newAuditServer(t)
			a := s.sealedAuditor(t, testSeal(t))
			js, jctx := adminStream(t, a.js.Conn())
			if restore {
				a.watch.restore = func(ctx context.Context, cfg jetstream.StreamConfig) error {
					_, err := js.UpdateStream(ctx, cfg)
					return err
				}
			}
			ctx := context.Background()
			for i := range 6 {
				if err := a.Commit(ctx, &Record{CallID: fmt.Sprintf("r%d", i), Tool: "bash"}); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(auditWatchEvery + 500*time.Millisecond)
			cfg := a.watch.want
			cfg.MaxMsgs = 1
			if _, err := js.UpdateStream(jctx, cfg); err != nil {
				t.Fatal(err)
			}
			waitDamage(t, a, "max_msgs 1 (want -1)")
			waitDamage(t, a, "cut at its head: sequences 1-5 removed")
			damages, _ := a.Damages()
			put := strings.Contains(fmt.Sprint(damages), "stream put back")
			if put != restore {
				t.Errorf("restore %v, reported %+v", restore, damages)
			}
			if err := a.Commit(ctx, &Record{CallID: "after", Tool: "bash"}); err != nil {
				t.Fatal(err)
			}
			if restore {
				rep, err := a.VerifyChain(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Intact || !strings.Contains(problems(rep), "head_missing@6") || len(rep.Gaps) < 2 {
					t.Errorf("%s", rep.Summary())
				}
			}
		})
	}
}

// A stream kept with another retention than the gateway's: with a
// credential allowed to, the gateway updates it; without one, it keeps
// the stream's, and the watcher takes that for no damage.
func TestAuditExistingRetention(t *testing.T) {
	for _, canUpdate := range []bool{false, true} {
		t.Run(fmt.Sprintf("update=%v", canUpdate), func(t *testing.T) {
			s := newAuditServer(t)
			a, nc := s.auditor(t) // made the stream with the default retention
			js, ctx := adminStream(t, nc)
			var admin StreamUpdater
			if canUpdate {
				admin = func(ctx context.Context, cfg jetstream.StreamConfig) error {
					_, err := js.UpdateStream(ctx, cfg)
					return err
				}
			}
			cfg := Config{Retention: 180 * 24 * time.Hour}
			b, err := Open(nc, cfg, Options{MaxCall: time.Minute, Patience: StreamPatience, Admin: admin, Log: discardLogger()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close(context.Background()) })
			time.Sleep(auditWatchEvery + 500*time.Millisecond)
			info, err := b.stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := a.retention
			if canUpdate {
				want = cfg.Retention
			}
			if info.Config.MaxAge != want || b.retention != want {
				t.Errorf("stream max_age %s, the gateway's retention %s; want %s", info.Config.MaxAge, b.retention, want)
			}
			if damages, n := b.Damages(); n != 0 {
				t.Errorf("reported as damage: %+v", damages)
			}
		})
	}
}

// A gateway whose clock is off does not fool the watchers: records
// stored by a writer whose clock runs ten minutes ahead age out with no
// "cut" reported by a gateway whose clock is right (nor by the writer's
// own), and a cut of records stored by a writer whose clock runs 100 days
// behind is still seen. The chain links, and the watchers, go by the NATS
// server's clock.
func TestAuditWatchSkewedWriter(t *testing.T) {
	t.Run("ahead, records age out", func(t *testing.T) {
		s := newAuditServer(t)
		nc, err := nats.Connect(s.ns.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, ctx := adminStream(t, nc)
		// A stream kept 3 s, made before the gateways start: they take its
		// retention as the operator's choice.
		sc := auditStreamConfig(Config{Retention: 3 * time.Second})
		sc.Duplicates = time.Second
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
		seal := testSeal(t)
		writer := s.sealedAuditor(t, seal)
		writer.clock.local = func() time.Time { return time.Now().Add(10 * time.Minute) }
		right := s.sealedAuditor(t, seal)
		if writer.retention != 3*time.Second || right.retention != 3*time.Second {
			t.Fatalf("retention %s, %s", writer.retention, right.retention)
		}
		for _, id := range []string{"r0", "r1"} {
			if err := writer.Commit(ctx, &Record{CallID: id, Tool: "bash"}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * time.Second)
		if err := writer.Commit(ctx, &Record{CallID: "r2", Tool: "bash"}); err != nil {
			t.Fatal(err)
		}
		// r0 and r1 age out; the watchers read the stream beginning at r2,
		// whose link names r1, then empty.
		for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
			info, err := right.stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.FirstSeq >= 3 {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("records did not age out: %+v", info.State)
			}
		}
		time.Sleep(2*auditWatchEvery + time.Second)
		for name, a := range map[string]*Trail{"the gateway whose clock is right": right, "the writer": writer} {
			if damages, n := a.Damages(); n != 0 {
				t.Errorf("%s reported records that aged out as damage: %+v", name, damages)
			}
		}
	})
	t.Run("behind, a cut is seen", func(t *testing.T) {
		s := newAuditServer(t)
		writer, nc := s.auditor(t)
		writer.clock.local = func() time.Time { return time.Now().Add(-100 * 24 * time.Hour) }
		ctx := context.Background()
		for i := range 6 {
			if err := writer.Commit(ctx, &Record{CallID: fmt.Sprintf("r%d", i), Tool: "bash"}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(auditWatchEvery + 500*time.Millisecond)
		js, jctx := adminStream(t, nc)
		cfg := writer.watch.want
		cfg.MaxMsgs = 1
		if _, err := js.UpdateStream(jctx, cfg); err != nil {
			t.Fatal(err)
		}
		waitDamage(t, writer, "cut at its head: sequences 1-5 removed")
	})
}
