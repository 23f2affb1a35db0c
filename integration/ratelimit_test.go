package integration

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// Each caller has its own bucket: a token limited to 3 calls a minute is
// refused on its 4th call with a message saying when to retry, the refusal
// is audited, and another caller under the gateway default is unaffected.
func TestPerCallerRateLimit(t *testing.T) {
	slow, slowLine, err := access.NewAPIToken("slow")
	if err != nil {
		t.Fatal(err)
	}
	fast, fastLine, err := access.NewAPIToken("fast")
	if err != nil {
		t.Fatal(err)
	}
	slowLine = strings.Replace(slowLine, "tools: [read]}", `tools: [bash], rate_limit: "3/min"}`, 1)
	fastLine = strings.Replace(fastLine, "tools: [read]}", "tools: [bash]}", 1)
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+slowLine+"\n  "+fastLine+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	auditLog := t.TempDir() + "/audit.jsonl"
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: tokens}
		c.RateLimit = access.RateLimit{N: 1000, Period: time.Minute}
		c.Audit.File = auditLog
	}})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			// Each era gets fresh buckets' worth of calls by using its own
			// session; the bucket is per caller, so the second era starts
			// where the first left off and is refused at once.
			cs := env.ClientAs(era.Version, slow)
			ok := 0
			var refusal string
			for range 4 {
				res := call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"})
				if !res.IsError {
					ok++
					continue
				}
				refusal = text(res)
				break
			}
			if era.Name == eras[0].Name && ok != 3 {
				t.Fatalf("%d calls allowed before the refusal, want 3", ok)
			}
			m := regexp.MustCompile(`^rate limit reached: token slow may make 3 calls per minute \(token slow\); retry in ([0-9.]+) s$`).FindStringSubmatch(refusal)
			if m == nil {
				t.Fatalf("refusal = %q", refusal)
			}
			if wait, _ := strconv.ParseFloat(m[1], 64); wait <= 0 || wait > 20.1 {
				t.Errorf("retry in %v s; one call refills every 20 s", wait)
			}
			other := env.ClientAs(era.Version, fast)
			for range 5 {
				mustOK(t, call(t, other, "bash", map[string]any{"host": "alpha", "command": "true"}))
			}
		})
	}
	// Records are stored asynchronously, within milliseconds.
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, err := os.ReadFile(auditLog)
		if err == nil && strings.Contains(string(data), `"reason":"rate limit"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no audit record of the refusal in %s (%v)", data, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
