package integration

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// gatewayConfig is a gateway with its own embedded NATS on dataDir, auth
// off, on free loopback ports.
func gatewayConfig(t *testing.T, dataDir string) gateway.Config {
	return gateway.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:0", DataDir: dataDir, AuthDisabled: true,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// TestGatewayDataDirHeldByOne: a second gateway on the data directory of
// a running one is refused with the reason, and leaves the first alone;
// once the first has shut down, the directory is free again.
func TestGatewayDataDirHeldByOne(t *testing.T) {
	dir := t.TempDir()
	cfg := gatewayConfig(t, dir)
	first, err := gateway.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := gateway.Start(t.Context(), cfg)
	if err == nil {
		_ = second.Shutdown(context.Background())
		_ = first.Shutdown(context.Background())
		t.Fatal("a second gateway started on the data directory of a running one")
	}
	var inUse *gateway.DataDirInUseError
	want := "data directory " + dir + " is in use by another fleet-gateway (pid " + strconv.Itoa(os.Getpid()) + ")"
	if !errors.As(err, &inUse) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--data_dir") {
		t.Errorf("second gateway: %v; want %q and a hint at --data_dir", err, want)
	}
	// The first still serves its agents.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	creds, err := first.EnrolLocal(ctx, "alpha", pub, nil)
	if err != nil {
		t.Fatalf("the first gateway no longer enrols agents: %v", err)
	}
	if err := first.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	third, err := gateway.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("a gateway on the data directory after the first shut down: %v", err)
	}
	defer third.Shutdown(ctx)
	// The fleet's identity is the data directory's: a credential the
	// first gateway issued is good with the third.
	nc, err := nats.Connect(third.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed)))
	if err != nil {
		t.Fatalf("a credential issued before the restart: %v", err)
	}
	nc.Close()
}

// TestGatewayAddressInUse: a NATS, MCP or fleet API address another
// process holds is reported as such, at once, with the flag that chooses
// another; the refused gateway leaves nothing behind, so one on the same
// data directory starts at once.
func TestGatewayAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	for _, tc := range []struct {
		name string
		mod  func(*gateway.Config)
		want []string
	}{
		{"NATS", func(c *gateway.Config) { c.NATSListen = addr }, []string{"address " + addr + " for the embedded NATS server is already in use", "--nats_listen"}},
		{"MCP", func(c *gateway.Config) { c.Listen = addr }, []string{"address " + addr + " for the MCP endpoint is already in use", "--listen"}},
		{"fleet API", func(c *gateway.Config) { c.APIListen = addr }, []string{"address " + addr + " for the fleet API is already in use", "--api_listen"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			cfg := gatewayConfig(t, dataDir)
			tc.mod(&cfg)
			start := time.Now()
			gw, err := gateway.Start(t.Context(), cfg)
			if err == nil {
				_ = gw.Shutdown(context.Background())
				t.Fatal("the gateway started on an address in use")
			}
			took := time.Since(start)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if took > 3*time.Second {
				t.Errorf("the refusal took %s; want it at once", took.Round(time.Millisecond))
			}
			t.Logf("refused after %s: %v", took.Round(time.Millisecond), err)
			again, err := gateway.Start(t.Context(), gatewayConfig(t, dataDir))
			if err != nil {
				t.Fatalf("a gateway on the same data directory after the refusal: %v", err)
			}
			if err := again.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestGatewayStartCancelled: a start waiting on an issuer that never
// answers its discovery request ends as soon as its context does, with
// the cause, instead of after the discovery timeout.
func TestGatewayStartCancelled(t *testing.T) {
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer stuck.Close()
	cfg := gatewayConfig(t, t.TempDir())
	cfg.AuthDisabled = false
	cfg.Auth = access.AuthConfig{Issuer: stuck.URL, Audience: "fleet"}
	rules, err := access.ParseRules("access.yaml", []byte(accessRules))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Access = rules
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	gw, err := gateway.Start(ctx, cfg)
	if err == nil {
		_ = gw.Shutdown(context.Background())
		t.Fatal("the gateway started against an issuer that never answers")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Start returned %s after its context ended; want it at once", took.Round(time.Millisecond))
	}
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "OIDC discovery") {
		t.Errorf("Start: %v; want the cancellation of the OIDC discovery", err)
	}
}

// TestGatewayFailedStartLeavesNothing: a start that fails late — on the
// MCP endpoint's certificate, after NATS, JetStream, the stores and the
// fleet API are up — stops all of them again: every address it listened
// on is free, and a gateway on the same data directory and addresses
// starts.
func TestGatewayFailedStartLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	cfg := gatewayConfig(t, dir)
	addr := func() string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }
	cfg.Listen, cfg.NATSListen, cfg.APIListen = addr(), addr(), addr()
	bad := cfg
	bad.TLSCert, bad.TLSKey = filepath.Join(dir, "missing.pem"), filepath.Join(dir, "missing.key")
	gw, err := gateway.Start(t.Context(), bad)
	if err == nil {
		_ = gw.Shutdown(context.Background())
		t.Fatal("started with a certificate that does not exist")
	}
	if !strings.Contains(err.Error(), "--tls_cert") {
		t.Fatalf("Start: %v; want the MCP certificate's flag named", err)
	}
	for _, a := range []string{cfg.Listen, cfg.NATSListen, cfg.APIListen} {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Errorf("after the failed start, %s is still taken: %v", a, err)
			continue
		}
		ln.Close()
	}
	gw, err = gateway.Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("a gateway on the same data directory and addresses after the failed start: %v", err)
	}
	if err := gw.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}
