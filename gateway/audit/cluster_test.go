package audit

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// freeTCPPort returns a port free at the time of the call.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startNATSCluster starts n clustered JetStream servers and returns their
// client URLs.
func startNATSCluster(t *testing.T, n int) []string {
	t.Helper()
	var routes, urls []string
	routePorts := make([]int, n)
	for i := range n {
		routePorts[i] = freeTCPPort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
	}
	var servers []*server.Server
	for i := range n {
		port := freeTCPPort(t)
		opts := &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true,
			JetStream: true, StoreDir: t.TempDir(), Routes: server.RoutesFromStr(strings.Join(routes, ",")),
			Cluster: server.ClusterOpts{Name: "audit", Host: "127.0.0.1", Port: routePorts[i]}}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		servers = append(servers, ns)
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", port))
	}
	t.Cleanup(func() {
		for _, ns := range servers {
			ns.Shutdown()
			ns.WaitForShutdown()
		}
	})
	for _, ns := range servers {
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("NATS server not ready")
		}
	}
	return urls
}

// Three gateways, each on its own node of a 3-node cluster, write a
// replicated stream at once: every record is stored once, each chained to
// the one before it.
func TestAuditChainReplicated(t *testing.T) {
	urls := startNATSCluster(t, 3)
	seal := testSeal(t)
	var auditors []*Trail
	for i := range 3 {
		nc, err := nats.Connect(urls[i], nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		cfg := Config{Replicas: 3}
		cfg.SetDefaults()
		a, err := Open(nc, cfg, Options{MaxCall: time.Minute, Patience: time.Minute, Log: discardLogger()})
		if err != nil {
			t.Fatal(err)
		}
		a.seal = seal
		t.Cleanup(func() { _ = a.Close(context.Background()) })
		auditors = append(auditors, a)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := range 100 {
		for j, a := range auditors {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- a.Commit(context.Background(), &Record{CallID: fmt.Sprintf("g%d-%d", j, i), Tool: "bash", Decision: DecisionAllowed})
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
	rep, err := auditors[0].VerifyChain(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Intact || rep.Records != 300 || rep.Chained != 300 {
		t.Fatalf("%+v\n%s", rep, rep.Summary())
	}
}
