package ha

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/integration/hacheck"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestClusterFailover is the checker (package hacheck) in its short form,
// one round of faults; FLEET_HA_ROUNDS=N runs N rounds, the long form
// whose figures integration/README.md quotes: three gateways with their
// embedded NATS servers as one cluster, a dozen simulated hosts, MCP
// clients of both eras spread over the gateways making calls, and
// enrolments through every gateway's fleet API with one join token,
// while the gateway that holds the audit stream's leader stops, comes
// back on its old store and catches up, and then two gateways stop at
// once (the last one has no quorum) and come back. Afterwards every call
// a client saw answered has exactly one audit record, none has two, no
// record belongs to no call, every acknowledged enrolment is in the agent
// records and counted once on the token, and every gateway lists the
// same hosts, all online. A background task on a real agent runs
// throughout: it ends while the quorum is lost, when no replica can read
// it, and every replica reads its whole output afterwards.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of faults on a cluster")
	}
	c := startGatewayCluster(t, 3, nil)
	hosts := make([]string, 12)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("sim-%02d", i)
	}
	c.simFleet(hosts, nil)
	for i := range 3 {
		waitOnline(t, c.gw(i), hosts)
	}
	endTask, checkTask := failoverTask(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, err := c.gw(0).CreateJoinToken(ctx, &protocol.TokenCreateRequest{Uses: 10000, TTL: "1h"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	apiURLs := make([]string, 3)
	for i := range 3 {
		apiURLs[i] = c.gw(i).APIURL()
	}
	run, stopRun := context.WithCancel(context.Background())
	defer stopRun()
	h, wait := hacheck.Run(run, hacheck.Config{
		Gateways: c.mcpURLs(), Hosts: hosts, Workers: 6, CallTimeout: 30 * time.Second, Think: 20 * time.Millisecond,
		EnrolEvery: 150 * time.Millisecond,
		Enrol: func(ctx context.Context, replica int, host string) error {
			return enrolThrough(ctx, apiURLs[replica], tok.CAPin, tok.Token, host)
		},
	})
	time.Sleep(2 * time.Second) // warm-up: the workload runs meanwhile
	rounds := 1
	if v := os.Getenv("FLEET_HA_ROUNDS"); v != "" {
		if rounds, err = strconv.Atoi(v); err != nil || rounds < 1 {
			t.Fatalf("FLEET_HA_ROUNDS=%q: want a number of rounds, 1 or more", v)
		}
	}
	for round := 1; round <= rounds; round++ {
		var onQuorumLost func()
		if round == 1 {
			onQuorumLost = endTask
		}
		failoverRound(t, c, h, round, onQuorumLost)
	}
	stopRun()
	wait()
	checkTask()

	st := clusterState(t, c, hosts, tok.Info.ID)
	r := hacheck.Verify(h, st, hosts)
	t.Log("\n" + r.String())
	if !r.OK() {
		t.Error("the checker found problems (above)")
	}
	if r.ByOutcome[hacheck.OK] < 50 || r.Enrolled < 5 {
		t.Errorf("too little work to judge: %d calls answered, %d enrolments", r.ByOutcome[hacheck.OK], r.Enrolled)
	}
	logFaultFigures(t, r.Faults)
	for _, f := range r.Faults {
		if strings.Contains(f.What, "leader") && f.Recovery > 15*time.Second {
			t.Errorf("%s: clients waited %s to be served again; want within 15s", f.What, f.Recovery)
		}
	}
}

// enrolThrough enrols a fresh key as host with token at the fleet API at
// url; a refusal is a definite answer (the workload counts it as such).
// "Unavailable" is not one: the gateway may have stored the enrolment
// before it lost JetStream's answer, and says to try again.
func enrolThrough(ctx context.Context, url, pin, token, host string) error {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	return enrolThroughAs(ctx, url, pin, token, host, kp)
}

// enrolThroughAs is enrolThrough with the host's key kp. A retry after
// "unavailable" must send the same key: if the first attempt was stored,
// the host name is that key's, and another key is refused as name_taken.
func enrolThroughAs(ctx context.Context, url, pin, token, host string, kp nkeys.KeyPair) error {
	ec := enrolclient.New(url, pin, 1)
	defer ec.Close()
	_, err := ec.Enrol(ctx, kp, token, host)
	var apiErr *protocol.APIError
	if errors.As(err, &apiErr) && apiErr.Code != protocol.APIUnavailable {
		return refusal{err}
	}
	return err
}

// refusal is an answer that says the operation was not done.
type refusal struct{ error }

func (refusal) Refused() bool { return true }

func (r refusal) Unwrap() error { return r.error }

// waitOnline waits until gw lists every host online.
func waitOnline(t testing.TB, gw *gateway.Gateway, hosts []string) {
	t.Helper()
	integration.WaitFor(t, 30*time.Second, "hosts online at "+gw.MCPURL(), func() bool {
		for _, h := range hosts {
			if info, ok := gw.Host(h); !ok || !info.Online {
				return false
			}
		}
		return true
	})
}

// auditLeader returns the gateway whose node leads the audit stream.
func auditLeader(t testing.TB, c *gwCluster, via int) int {
	t.Helper()
	nc := c.conn(via)
	defer nc.Close()
	var leader string
	integration.WaitFor(t, 20*time.Second, "the audit stream's leader", func() bool {
		info, err := streamInfo(nc, protocol.AuditStream)
		if err != nil || info.Cluster == nil {
			return false
		}
		leader = info.Cluster.Leader
		return leader != ""
	})
	for i, cfg := range c.cfgs {
		if cfg.Name == leader {
			return i
		}
	}
	t.Fatalf("the audit stream's leader %q is no gateway of the cluster", leader)
	return -1
}

func streamInfo(nc *nats.Conn, name string) (*jetstream.StreamInfo, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// waitCurrent waits until gateway i's node holds a current copy of every
// replicated stream (the registry, the agent records, the tokens, the
// audit trail), as its peers see it.
func waitCurrent(t testing.TB, c *gwCluster, i int) {
	t.Helper()
	name := c.cfgs[i].Name
	nc := c.conn((i + 1) % len(c.cfgs))
	defer nc.Close()
	start := time.Now()
	integration.WaitFor(t, 60*time.Second, name+" current on every stream", func() bool { return streamsCurrent(nc, name) })
	t.Logf("%s caught up on every stream in %s", name, time.Since(start).Round(time.Millisecond))
}

// waitServed waits until every worker has had a call answered after the
// last mark.
func waitServed(t testing.TB, h *hacheck.History, d time.Duration, what string) {
	t.Helper()
	marks := h.Marks()
	at := marks[len(marks)-1].At
	workers := map[int]bool{}
	integration.WaitFor(t, d, what, func() bool {
		served := map[int]bool{}
		for _, op := range h.Ops() {
			if op.Kind != "call" {
				continue
			}
			workers[op.Worker] = true
			if op.Outcome == hacheck.OK && op.Start.After(at) {
				served[op.Worker] = true
			}
		}
		return len(workers) > 0 && len(served) == len(workers)
	})
	t.Logf("%s: %s", what, time.Since(at).Round(time.Millisecond))
}

// clusterState reads what the fleet holds, once every gateway runs
// again: the audit stream, each gateway's hosts, the agent records and
// the join token's count.
func clusterState(t testing.TB, c *gwCluster, hosts []string, tokenID string) *hacheck.State {
	t.Helper()
	st := &hacheck.State{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range c.cfgs {
		waitOnline(t, c.gw(i), hosts)
		m, err := hacheck.HostStates(ctx, c.gw(i).MCPURL())
		if err != nil {
			t.Fatal(err)
		}
		// Enrolled hosts of the workload run no agent; only the
		// simulated ones announce themselves.
		st.Hosts = append(st.Hosts, m)
	}
	nc := c.conn(0)
	defer nc.Close()
	var err error
	if st.Records, err = hacheck.ReadRecords(ctx, nc); err != nil {
		t.Fatal(err)
	}
	agents, err := c.gw(0).Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range agents {
		st.Agents = append(st.Agents, a.Host)
	}
	toks, err := c.gw(0).JoinTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(toks, func(ti protocol.TokenInfo) bool { return ti.ID == tokenID })
	if i < 0 {
		t.Fatalf("join token %s is gone", tokenID)
	}
	st.TokenUsed = toks[i].Used
	return st
}

// streamsCurrent reports whether node name holds a current copy of every
// replicated stream, as the leaders nc reaches see it.
func streamsCurrent(nc *nats.Conn, name string) bool {
	for _, s := range []string{protocol.AuditStream, "KV_fleet_hosts", "KV_fleet_agents", "KV_fleet_tokens"} {
		info, err := streamInfo(nc, s)
		if err != nil || info.Cluster == nil {
			return false
		}
		ok := info.Cluster.Leader == name
		for _, r := range info.Cluster.Replicas {
			if r.Name == name && r.Current && r.Lag == 0 {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// failoverRound is one round of TestClusterFailover's faults: the
// gateway whose node leads the audit stream stops and comes back on its
// old store, then two gateways stop at once and come back one by one.
func failoverRound(t *testing.T, c *gwCluster, h *hacheck.History, round int, onQuorumLost func()) {
	t.Helper()
	settle := func(what string, d time.Duration) {
		t.Helper()
		time.Sleep(d) // the workload runs meanwhile; what it saw is checked at the end
		t.Logf("round %d, %s: %d operations so far", round, what, len(h.Ops()))
	}

	// The stream leader's gateway stops; the others carry on.
	leader := auditLeader(t, c, 0)
	h.Mark(fmt.Sprintf("round %d: gateway %d (audit stream leader) stopped", round, leader+1))
	c.stop(leader)
	waitServed(t, h, 20*time.Second, "every worker served again after the leader's gateway stopped")
	settle("after the leader's loss", time.Second)

	// It comes back on its old store and catches up.
	h.Mark(fmt.Sprintf("round %d: gateway %d restarted on its old store", round, leader+1))
	c.restart(leader)
	waitCurrent(t, c, leader)
	settle("after the restart", time.Second)

	// Two stop: the last one has no quorum. Its calls are refused, not
	// run, and no client sees a result without its record.
	keep := (leader + 1) % 3
	h.Mark(fmt.Sprintf("round %d: quorum lost: only gateway %d left", round, keep+1))
	lostAt := time.Now()
	lost := []int{(keep + 1) % 3, (keep + 2) % 3}
	for _, i := range lost {
		c.stop(i)
	}
	integration.WaitFor(t, 40*time.Second, "a call refused for want of the audit trail", func() bool {
		for _, op := range h.Ops() {
			if op.Outcome == hacheck.Refused && op.End.After(lostAt) {
				return true
			}
		}
		return false
	})
	if onQuorumLost != nil {
		onQuorumLost()
	}
	h.Mark(fmt.Sprintf("round %d: quorum back: a second gateway restarted", round))
	c.restart(lost[0])
	waitServed(t, h, 40*time.Second, "every worker served again once the quorum was back")
	h.Mark(fmt.Sprintf("round %d: all three gateways back", round))
	c.restart(lost[1])
	waitCurrent(t, c, lost[1])
	settle("after the quorum's return", time.Second)
}

// logFaultFigures logs, for each kind of fault (its mark without numbers),
// the median and the worst of what it cost over the rounds.
func logFaultFigures(t *testing.T, faults []hacheck.FaultReport) {
	digits := regexp.MustCompile(`[0-9]+`)
	var kinds []string
	recovery, failed := map[string][]time.Duration{}, map[string][]int{}
	for _, f := range faults {
		k := digits.ReplaceAllString(f.What, "N")
		if _, ok := failed[k]; !ok {
			kinds = append(kinds, k)
		}
		recovery[k] = append(recovery[k], f.Recovery)
		failed[k] = append(failed[k], f.Failed)
	}
	for _, k := range kinds {
		r, f := recovery[k], failed[k]
		slices.Sort(r)
		slices.Sort(f)
		t.Logf("%s (%d times): every worker served again after %s median, %s at worst; calls not answered with their result %d median, %d at worst",
			k, len(r), r[len(r)/2].Round(10*time.Millisecond), r[len(r)-1].Round(10*time.Millisecond), f[len(f)/2], f[len(f)-1])
	}
}
