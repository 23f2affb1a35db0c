package goclient

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
)

// startFleet starts a gateway (embedded NATS, auth off, on loopback) and
// an in-process agent enrolled as host, waits until the gateway sees the
// host online, and returns the gateway's MCP URL and a function that
// stops both and removes their files. An example has no *testing.T: a
// failure panics.
func startFleet(host string) (endpoint string, stop func()) {
	dir, err := os.MkdirTemp("", "goclient-")
	must(err)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	gw, err := gateway.Start(ctx, gateway.Config{
		Listen: "127.0.0.1:0", AuthDisabled: true, DataDir: filepath.Join(dir, "gateway"),
		NATSListen: "127.0.0.1:0", Logger: quiet,
	})
	must(err)
	kp, err := nkeys.CreateUser()
	must(err)
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	creds, err := gw.EnrolLocal(ctx, host, pub, map[string]string{"env": "example"})
	must(err)
	work := filepath.Join(dir, "agent")
	a, err := agent.New(agent.Config{
		Servers:     []string{gw.NATSURL()},
		Name:        host,
		Credentials: agent.Credentials{JWT: func() (string, error) { return creds.JWT, nil }, Seed: seed, CA: creds.CAPEM},
		GatewayKeys: creds.SigningKeys, GatewayKeySerial: creds.SigningKeySerial,
		Cwd:      work,
		StateDir: filepath.Join(work, ".state"),
		Logger:   quiet,
	})
	must(err)
	runCtx, stopAgent := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = a.Run(runCtx)
	}()
	stop = func() {
		stopAgent()
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		must(gw.Shutdown(ctx))
		must(os.RemoveAll(dir))
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if h, ok := gw.Host(host); ok && h.Online {
			return gw.MCPURL(), stop
		}
		if time.Now().After(deadline) {
			stop()
			panic(fmt.Sprintf("host %s did not come online at the gateway within 20s", host))
		}
	}
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}
