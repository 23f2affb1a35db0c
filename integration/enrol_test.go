package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Two gateway replicas share one NATS cluster, its token bucket and one
// fleet CA. Twenty hosts enrol at once through both with one token of
// five uses: exactly five get in, every other is told the token is
// spent, and both replicas list it spent with five uses. A host enrolled
// through one replica renews over NATS, answered by either, and its
// credential connects.
func TestTokenUsesUnderConcurrentEnrolment(t *testing.T) {
	dataDir := t.TempDir()
	const credentialTTL = 4 * time.Second
	e := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.DataDir, c.AgentCredentialTTL = "127.0.0.1:0", dataDir, credentialTTL
	}})
	gw1 := e.Gateway
	gw2 := e.StartGateway(nil)
	if gw1.APICAPin() != gw2.APICAPin() || gw1.APICAPin() == "" {
		t.Fatalf("the replicas pin %q and %q: they share the data directory's CA", gw1.APICAPin(), gw2.APICAPin())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, err := gw1.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Uses: 5, NamePattern: "host-*", Labels: map[string]string{"role": "load"}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	clients := []*enrolclient.Client{enrolclient.New("https://"+gw1.APIAddr(), tok.CAPin, 20), enrolclient.New("https://"+gw2.APIAddr(), tok.CAPin, 20)}
	defer clients[0].Close()
	defer clients[1].Close()

	const hosts = 20
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		enrolled = map[string]*protocol.EnrolResponse{}
		keys     = map[string]nkeys.KeyPair{}
		codes    = map[protocol.APICode]int{}
	)
	start := make(chan struct{})
	for i := range hosts {
		kp, _ := nkeys.CreateUser()
		host := fmt.Sprintf("host-%02d", i)
		wg.Go(func() {
			<-start
			resp, err := clients[i%2].Enrol(ctx, kp, tok.Token, host)
			mu.Lock()
			defer mu.Unlock()
			var aerr *protocol.APIError
			switch {
			case err == nil:
				enrolled[host], keys[host] = resp, kp
			case errors.As(err, &aerr):
				codes[aerr.Code]++
			default:
				t.Errorf("enrol %s: %v", host, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(enrolled) != 5 || codes[protocol.APITokenSpent] != hosts-5 || len(codes) != 1 {
		t.Fatalf("%d enrolled, refusals %v; want 5 enrolled and %d token_spent", len(enrolled), codes, hosts-5)
	}
	for _, gw := range []*gateway.Gateway{gw1, gw2} {
		recs, err := gw.Agents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) != 5 {
			t.Errorf("%d agent records, want 5", len(recs))
		}
	}
	// A sixth host through either replica: spent.
	kp, _ := nkeys.CreateUser()
	var aerr *protocol.APIError
	if _, err := clients[1].Enrol(ctx, kp, tok.Token, "host-99"); !errors.As(err, &aerr) || aerr.Code != protocol.APITokenSpent {
		t.Errorf("after five: %v", err)
	}

	// Renewal over NATS, with the credential from the fleet API.
	var host string
	for h := range enrolled {
		host = h
		break
	}
	resp := enrolled[host]
	if resp.Labels["role"] != "load" || len(resp.NATSURLs) == 0 {
		t.Errorf("enrolment answer %+v", resp)
	}
	seed, _ := keys[host].Seed()
	// A credential is renewed once past half its life (credentialTTL
	// here), each time with the newest one.
	token, expires := resp.JWT, resp.Expires
	for i := range 3 { // the queue group hands them to either replica
		time.Sleep(time.Until(expires.Add(-credentialTTL/2)) + 100*time.Millisecond)
		nc, err := nats.Connect(e.NATSURL(), nats.UserJWTAndSeed(token, string(seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host)))
		if err != nil {
			t.Fatalf("connect with credential %d: %v", i, err)
		}
		r := &protocol.RenewRequest{Host: host}
		if err := enrolclient.Sign(keys[host], &r.Proof, time.Now(), r.SigningBytes); err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(r)
		m, err := nc.Request(protocol.RenewSubject(host), data, 10*time.Second)
		nc.Close()
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		var rr protocol.RenewResponse
		if err := json.Unmarshal(m.Data, &rr); err != nil || rr.JWT == "" {
			t.Fatalf("renewal %d answered %s", i, m.Data)
		}
		token, expires = rr.JWT, rr.Expires
	}
}

// Two hosts enrol under the same name at the same moment, each with its
// own token that gives the name, through two gateway replicas: exactly
// one gets it, the other is told the name is taken, and the record holds
// the winner's key; the loser's token keeps its use. Ten names, each
// raced once.
func TestSameNameTwoTokensConcurrently(t *testing.T) {
	dataDir := t.TempDir()
	e := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.DataDir = "127.0.0.1:0", dataDir
	}})
	gws := []*gateway.Gateway{e.Gateway, e.StartGateway(nil)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := []*enrolclient.Client{enrolclient.New("https://"+gws[0].APIAddr(), gws[0].APICAPin(), 4), enrolclient.New("https://"+gws[1].APIAddr(), gws[1].APICAPin(), 4)}
	defer clients[0].Close()
	defer clients[1].Close()
	for i := range 10 {
		host := fmt.Sprintf("race-%d", i)
		var toks [2]*protocol.TokenCreateResponse
		var kps [2]nkeys.KeyPair
		for j := range 2 {
			tok, err := gws[j].CreateJoinToken(ctx, &protocol.TokenCreateRequest{Name: host}, "test")
			if err != nil {
				t.Fatal(err)
			}
			toks[j] = tok
			kps[j], _ = nkeys.CreateUser()
		}
		var errs [2]error
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j := range 2 {
			wg.Go(func() {
				<-start
				_, errs[j] = clients[j].Enrol(ctx, kps[j], toks[j].Token, host)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for j, err := range errs {
			var aerr *protocol.APIError
			switch {
			case err == nil:
				if winner >= 0 {
					t.Fatalf("%s: both hosts enrolled", host)
				}
				winner = j
			case errors.As(err, &aerr) && aerr.Code == protocol.APINameTaken:
			default:
				t.Fatalf("%s: enrolment %d: %v, want success or name_taken", host, j, err)
			}
		}
		if winner < 0 {
			t.Fatalf("%s: neither host enrolled: %v", host, errs)
		}
		rec, err := gws[0].Agent(ctx, host)
		if err != nil {
			t.Fatal(err)
		}
		if pub, _ := kps[winner].PublicKey(); rec.PublicKey != pub || rec.TokenID != toks[winner].Info.ID {
			t.Errorf("%s: the record holds key %s of token %s, the winner is %s of %s", host, rec.PublicKey, rec.TokenID, pub, toks[winner].Info.ID)
		}
		if ti := tokenInfo(t, gws[0], toks[1-winner].Info.ID); ti.Used != 0 || ti.State != protocol.TokenActive {
			t.Errorf("%s: the loser's token %+v; want its use given back", host, ti)
		}
	}
}
