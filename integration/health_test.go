package integration

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// get returns the status and body of GET url.
func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// /readyz follows the NATS server: ready while it runs, 503 naming NATS
// while it is down, ready again once it is back; /healthz answers
// throughout.
func TestReadinessFollowsNATS(t *testing.T) {
	setup := filepath.Join(t.TempDir(), "setup")
	if _, err := gateway.NATSSetup(setup, 0); err != nil {
		t.Fatal(err)
	}
	nats := startNATSProcess(t, setup)
	env := NewEnv(t, Options{ServerURL: nats.url(), ServerSetup: setup})
	base := strings.TrimSuffix(env.Gateway.MCPURL(), "/mcp")
	ready := func(want int, body string) func() bool {
		return func() bool {
			code, b := get(t, base+"/readyz")
			return code == want && strings.Contains(b, body)
		}
	}
	waitFor(t, 10*time.Second, "/readyz 200", ready(http.StatusOK, "ready"))

	nats.stop()
	waitFor(t, 20*time.Second, "/readyz 503 naming NATS", ready(http.StatusServiceUnavailable, "NATS: not connected"))
	if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz with NATS down: %d %q", code, body)
	}
	_, body := get(t, base+"/readyz")
	if !strings.HasPrefix(body, "not ready:\n") {
		t.Fatalf("/readyz body %q", body)
	}

	nats.start()
	waitFor(t, 30*time.Second, "/readyz 200 again", ready(http.StatusOK, "ready"))
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
}
