//go:build unix

package integration

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// The tracing tests run real processes and stop them with signals, as
// the other process tests do: on Unix.

// otlpCollector is an OTLP/HTTP collector stand-in on loopback: it takes
// export requests as a collector does (POST /v1/traces, protobuf) and
// decodes them with the OTLP collector types.
type otlpCollector struct {
	t   testing.TB
	srv *httptest.Server

	mu       sync.Mutex
	spans    []gotSpan
	requests int
}

// gotSpan is a received span with what the tests look at.
type gotSpan struct {
	service           string // the exporter's service.name
	name              string
	trace, id, parent string // hex
	attrs             map[string]string
	statusError       bool
}

func newCollector(t testing.TB) *otlpCollector {
	c := &otlpCollector{t: t}
	c.srv = httptest.NewServer(http.HandlerFunc(c.export))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *otlpCollector) url() string { return c.srv.URL }

func (c *otlpCollector) export(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil || r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		c.t.Errorf("bad export request: %s %s %s: %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err)
		http.Error(w, "bad export request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	for _, rs := range req.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				g := gotSpan{service: service, name: s.Name, trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), attrs: map[string]string{}, statusError: s.GetStatus().GetCode() == 2}
				for _, kv := range s.Attributes {
					v := kv.GetValue()
					if v.GetStringValue() != "" {
						g.attrs[kv.Key] = v.GetStringValue()
					} else {
						g.attrs[kv.Key] = fmt.Sprint(v.GetIntValue())
					}
				}
				c.spans = append(c.spans, g)
			}
		}
	}
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans received of trace id.
func (c *otlpCollector) trace(id string) []gotSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gotSpan
	for _, s := range c.spans {
		if s.trace == id {
			out = append(out, s)
		}
	}
	return out
}

func (c *otlpCollector) counts() (requests, spans int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.requests, len(c.spans)
}

// waitTrace waits until trace id has n spans, and returns them.
func (c *otlpCollector) waitTrace(id string, n int) []gotSpan {
	c.t.Helper()
	waitFor(c.t, 20*time.Second, fmt.Sprintf("%d spans of trace %s", n, id), func() bool { return len(c.trace(id)) >= n })
	spans := c.trace(id)
	if len(spans) != n {
		c.t.Errorf("trace %s has %d spans, want %d: %s", id, len(spans), n, spanList(spans))
	}
	return spans
}

func spanList(spans []gotSpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "\n  %s %q id %s parent %s %v", s.service, s.name, s.id, s.parent, s.attrs)
	}
	return b.String()
}

// one returns the only span of spans named name whose parent is parent,
// failing otherwise.
func one(t testing.TB, spans []gotSpan, name, parent string) gotSpan {
	t.Helper()
	var found []gotSpan
	for _, s := range spans {
		if s.name == name && s.parent == parent {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one span %q with parent %s, found %d among: %s", name, parent, len(found), spanList(spans))
	}
	return found[0]
}

// startAgentProcess runs a fleet-agent process called name against the
// gateway process, with extra flags, and waits until it is online. It
// returns the process, which is stopped (SIGTERM) at the test's end
// unless it has been already.
func (p *gatewayProc) startAgentProcess(name string, extra ...string) (*exec.Cmd, <-chan struct{}) {
	p.t.Helper()
	dir := p.t.TempDir()
	state := filepath.Join(dir, ".state")
	creds, resp := p.Enrol(name)
	token, _ := creds.JWT()
	store := identity.Open(state)
	err := os.MkdirAll(store.Dir(), 0o700)
	if err == nil {
		err = os.WriteFile(filepath.Join(store.Dir(), identity.KeyFile), append(creds.Seed, '\n'), 0o600)
	}
	if err == nil {
		err = store.SaveJWT(token)
	}
	if err == nil {
		err = store.SaveEnrolment(&identity.Enrolment{Host: name, NATSURLs: []string{p.NATSURL}, SigningKeys: resp.SigningKeys,
			SigningKeySerial: resp.SigningKeySerial, EnrolledAt: time.Now().UTC(), Expires: time.Now().Add(time.Hour)})
	}
	if err != nil {
		p.t.Fatalf("write the identity of %s: %v", name, err)
	}
	args := append([]string{"--cwd", dir, "--state_dir", state, "--heartbeat", "500ms", "--log_level", "warn"}, extra...)
	cmd := exec.Command(agentBinary(p.t), args...)
	cmd.Stderr = testWriter{p.t}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start agent process: %v", err)
	}
	done := waitProcess(cmd)
	p.t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	cs := p.Client()
	waitFor(p.t, 20*time.Second, name+" online", func() bool {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{"filter": name}})
		return err == nil && strings.Contains(text(res), name+"\tonline")
	})
	return cmd, done
}

// A client's trace context: the span IDs are the client's own.
const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
)

// TestTracingOneTrace: with --otlp_endpoint on the gateway and on the
// agents, a tool call makes one trace across the two processes, in the
// trace the client started: the gateway's tools/call span is the child
// of the client's span, its host-call span the parent of the agent's
// spans; a fan-out's span has one host-call child per host.
func TestTracingOneTrace(t *testing.T) {
	// Batches go out every 100 ms instead of every 5 s (the SDK reads
	// OTEL_BSP_SCHEDULE_DELAY in both processes).
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	col := newCollector(t)
	gw := startGatewayProcess(t, "--otlp_endpoint", col.url())
	gw.startAgentProcess("alpha", "--otlp_endpoint", col.url())
	gw.startAgentProcess("beta", "--otlp_endpoint", col.url()+"/v1/traces")
	readOnly, err := filepath.Abs("../deploy/policies/read-only.yaml")
	if err != nil {
		t.Fatal(err)
	}
	gw.startAgentProcess("gamma", "--otlp_endpoint", col.url(), "--policy", readOnly)
	cs := gw.Client()

	t.Run("single call, trace context in _meta", func(t *testing.T) {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash",
			Arguments: map[string]any{"host": "alpha", "command": "echo hi"},
			Meta:      mcp.Meta{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}})
		if err != nil || res.IsError {
			t.Fatalf("bash: %v %s", err, text(res))
		}
		spans := col.waitTrace(clientTrace, 5)
		top := one(t, spans, "tools/call bash", clientSpan)
		hc := one(t, spans, "fleet.call bash", top.id)
		serve := one(t, spans, "fleet.serve bash", hc.id)
		pol := one(t, spans, "fleet.policy", serve.id)
		tool := one(t, spans, "fleet.tool bash", serve.id)
		for _, s := range []gotSpan{top, hc} {
			if s.service != "fleet-gateway" {
				t.Errorf("%s from %q, want fleet-gateway", s.name, s.service)
			}
		}
		for _, s := range []gotSpan{serve, pol, tool} {
			if s.service != "fleet-agent" {
				t.Errorf("%s from %q, want fleet-agent", s.name, s.service)
			}
		}
		if top.attrs["fleet.tool"] != "bash" || top.attrs["fleet.host"] != "alpha" || top.attrs["fleet.outcome"] != "ok" || top.attrs["fleet.caller"] == "" {
			t.Errorf("tools/call attributes %v", top.attrs)
		}
		if hc.attrs["fleet.host"] != "alpha" || hc.attrs["fleet.outcome"] != "ok" || hc.attrs["fleet.call_id"] != serve.attrs["fleet.call_id"] {
			t.Errorf("host call %v, agent %v", hc.attrs, serve.attrs)
		}
		if pol.attrs["fleet.decision"] != "allowed" || tool.attrs["fleet.outcome"] != "ok" || serve.attrs["fleet.caller"] != top.attrs["fleet.caller"] {
			t.Errorf("policy %v, tool %v, serve %v", pol.attrs, tool.attrs, serve.attrs)
		}
	})

	t.Run("failing command, trace context in the HTTP header", func(t *testing.T) {
		const trace, span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
		hc := &http.Client{Transport: headerTransport{"Traceparent": "00-" + trace + "-" + span + "-01"}}
		c := mcp.NewClient(&mcp.Implementation{Name: "traced", Version: "1"}, nil)
		tcs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: gw.MCPURL, HTTPClient: hc, DisableStandaloneSSE: true},
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatal(err)
		}
		defer tcs.Close()
		mustErr(t, call(t, tcs, "bash", map[string]any{"host": "beta", "command": "exit 3"}), "Command exited with code 3")
		spans := col.waitTrace(trace, 5)
		top := one(t, spans, "tools/call bash", span)
		serve := one(t, spans, "fleet.serve bash", one(t, spans, "fleet.call bash", top.id).id)
		tool := one(t, spans, "fleet.tool bash", serve.id)
		if top.attrs["fleet.outcome"] != "error" || !top.statusError || tool.attrs["fleet.outcome"] != "tool_error" || !tool.statusError {
			t.Errorf("a failed command: tools/call %v, tool %v", top.attrs, tool.attrs)
		}
	})

	t.Run("fan-out", func(t *testing.T) {
		const trace = "11111111111111111111111111111111"
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fleet_bash",
			Arguments: map[string]any{"selector": "*", "command": "echo hi"},
			Meta:      mcp.Meta{"traceparent": "00-" + trace + "-" + clientSpan + "-01"}})
		if err != nil || res.IsError {
			t.Fatalf("fleet_bash: %v %s", err, text(res))
		}
		spans := col.waitTrace(trace, 1+3*4)
		top := one(t, spans, "tools/call fleet_bash", clientSpan)
		if top.attrs["fleet.fanout.hosts"] != "3" || top.attrs["fleet.fanout.succeeded"] != "3" {
			t.Errorf("fan-out attributes %v", top.attrs)
		}
		var hosts []string
		for _, s := range spans {
			if s.name != "fleet.call bash" {
				continue
			}
			if s.parent != top.id {
				t.Errorf("host call %v is not the fan-out's child", s.attrs)
			}
			hosts = append(hosts, s.attrs["fleet.host"])
			serve := one(t, spans, "fleet.serve bash", s.id)
			if serve.attrs["fleet.host"] != s.attrs["fleet.host"] {
				t.Errorf("the call to %s was served by %s", s.attrs["fleet.host"], serve.attrs["fleet.host"])
			}
			one(t, spans, "fleet.policy", serve.id)
			one(t, spans, "fleet.tool bash", serve.id)
		}
		slices.Sort(hosts)
		if strings.Join(hosts, ",") != "alpha,beta,gamma" {
			t.Errorf("host calls to %v, want alpha, beta and gamma", hosts)
		}
	})

	t.Run("refused by the host policy, no client trace", func(t *testing.T) {
		mustErr(t, call(t, cs, "write", map[string]any{"host": "gamma", "path": "x", "content": "y"}), "write")
		var serve gotSpan
		waitFor(t, 20*time.Second, "the span of the refused write at the agent", func() bool {
			s := col.byName("fleet.serve write")
			if len(s) == 1 {
				serve = s[0]
			}
			return len(s) == 1
		})
		spans := col.waitTrace(serve.trace, 4)
		top := one(t, spans, "tools/call write", "") // the gateway started the trace
		hc := one(t, spans, "fleet.call write", top.id)
		if serve.parent != hc.id {
			t.Errorf("the agent's span is not the host call's child: %s", spanList(spans))
		}
		pol := one(t, spans, "fleet.policy", serve.id)
		if pol.attrs["fleet.decision"] != "denied" || !pol.statusError || serve.attrs["fleet.outcome"] != "denied" ||
			hc.attrs["fleet.outcome"] != "denied" || top.attrs["fleet.decision"] != "denied" || top.attrs["fleet.outcome"] != "refused" {
			t.Errorf("a write the host policy refuses: tools/call %v, host call %v, serve %v, policy %v", top.attrs, hc.attrs, serve.attrs, pol.attrs)
		}
	})
}

// byName returns the spans received called name.
func (c *otlpCollector) byName(name string) []gotSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []gotSpan
	for _, s := range c.spans {
		if s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// headerTransport adds headers to every request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestTracingOff: a gateway without --otlp_endpoint sends no trace
// context, so an agent that would export spans has none to export.
func TestTracingOff(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
	col := newCollector(t)
	gw := startGatewayProcess(t)
	agentCmd, agentDone := gw.startAgentProcess("alpha", "--otlp_endpoint", col.url())
	cs := gw.Client()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash",
		Arguments: map[string]any{"host": "alpha", "command": "echo hi"},
		Meta:      mcp.Meta{"traceparent": "00-" + clientTrace + "-" + clientSpan + "-01"}})
	if err != nil || res.IsError {
		t.Fatalf("bash: %v %s", err, text(res))
	}
	mustOK(t, call(t, cs, "fleet_bash", map[string]any{"selector": "*", "command": "echo hi"}))
	// The agent flushes what it has on SIGTERM: once it has exited,
	// every span it made has been sent.
	_ = agentCmd.Process.Signal(os.Interrupt)
	select {
	case <-agentDone:
	case <-time.After(20 * time.Second):
		t.Fatal("agent did not stop")
	}
	if requests, spans := col.counts(); requests != 0 || spans != 0 {
		t.Errorf("tracing off at the gateway: the collector got %d requests with %d spans", requests, spans)
	}
}
