package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestExporterConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flag    string
		env     map[string]string
		wantURL string // "" with no error: tracing off
		wantErr string
	}{
		{name: "off by default"},
		{name: "flag, bare", flag: "http://127.0.0.1:4318", wantURL: "http://127.0.0.1:4318/v1/traces"},
		{name: "flag, slash", flag: "https://otel.example.com/", wantURL: "https://otel.example.com/v1/traces"},
		{name: "flag, path kept", flag: "https://otel.example.com/ingest/traces", wantURL: "https://otel.example.com/ingest/traces"},
		{name: "flag wins over env", flag: "http://a:4318", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318"}, wantURL: "http://a:4318/v1/traces"},
		{name: "base endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318/otlp/"}, wantURL: "http://b:4318/otlp/v1/traces"},
		{name: "traces endpoint as is", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318"}, wantURL: "http://c:4318"},
		{name: "sdk disabled", flag: "http://a:4318", env: map[string]string{"OTEL_SDK_DISABLED": "TRUE"}},
		{name: "exporter none", flag: "http://a:4318", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}},
		{name: "exporter otlp", flag: "http://a:4318", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, wantURL: "http://a:4318/v1/traces"},
		{name: "exporter zipkin", flag: "http://a:4318", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "grpc protocol", flag: "http://a:4317", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "http/protobuf only"},
		{name: "traces protocol", flag: "http://a:4318", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, wantURL: "http://a:4318/v1/traces"},
		{name: "no scheme", flag: "127.0.0.1:4318", wantErr: "--otlp_endpoint"},
		{name: "grpc scheme", flag: "grpc://a:4317", wantErr: "http:// or https://"},
		{name: "no host", flag: "http:///v1/traces", wantErr: "no host"},
		{name: "credentials", flag: "https://u:secret@a/", wantErr: "OTEL_EXPORTER_OTLP_HEADERS"},
		{name: "credentials in a bad URL", flag: "https://u:secret@a b/", wantErr: "not a URL"},
		{name: "bad env endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://a"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "bad timeout", flag: "http://a", env: map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, wantErr: "OTEL_EXPORTER_OTLP_TIMEOUT"},
		{name: "bad compression", flag: "http://a", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"}, wantErr: "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"},
		{name: "bad headers", flag: "http://a", env: map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "Bearer xyz"}, wantErr: "item 1"},
		{name: "client cert alone", flag: "http://a", env: map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/c.pem"}, wantErr: "set both or neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ec, err := exporterConfig(tc.flag, envOf(tc.env))
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "xyz") {
					t.Errorf("the error quotes a secret: %v", err)
				}
			case err != nil:
				t.Fatal(err)
			case tc.wantURL == "" && ec != nil:
				t.Fatalf("tracing on (%s), want off", ec.url)
			case tc.wantURL != "" && (ec == nil || ec.url != tc.wantURL):
				t.Fatalf("config %+v, want URL %s", ec, tc.wantURL)
			}
		})
	}
}

func TestExporterConfigSettings(t *testing.T) {
	ec, err := exporterConfig("http://a:4318", envOf(map[string]string{
		"OTEL_EXPORTER_OTLP_HEADERS":        "authorization=Bearer%20abc, x-tenant = one",
		"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-tenant=two",
		"OTEL_EXPORTER_OTLP_TIMEOUT":        "2500",
		"OTEL_EXPORTER_OTLP_COMPRESSION":    "gzip",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if ec.headers["Authorization"] != "Bearer abc" || ec.headers["X-Tenant"] != "two" || len(ec.headers) != 2 {
		t.Errorf("headers %v", ec.headers)
	}
	if ec.timeout != 2500*time.Millisecond || !ec.gzip {
		t.Errorf("timeout %s, gzip %v", ec.timeout, ec.gzip)
	}
}

func TestParseHeadersErrors(t *testing.T) {
	for _, in := range []string{"=v", "a b=c", "k=%zz", "k=a%0Ab", strings.Repeat("a", maxHeadersLen+1)} {
		if _, err := parseHeaders(in); err == nil {
			t.Errorf("parseHeaders(%.40q) accepted it", in)
		}
	}
}

func FuzzParseHeaders(f *testing.F) {
	for _, s := range []string{"", "a=b", "authorization=Bearer%20x,k=v", "k==v", ",,,", "k=%"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := parseHeaders(s)
		if err != nil {
			return
		}
		req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1/", nil)
		for k, v := range h {
			if !validHeaderName(k) || strings.ContainsAny(v, "\r\n\x00") {
				t.Fatalf("parseHeaders(%q) let %q: %q through", s, k, v)
			}
			req.Header.Set(k, v)
		}
	})
}

func FuzzEndpoint(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:4318", "https://a/b", "http://u@a", "a:1", "http://[::1]:4318/", "http://a#f"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, bare := range []bool{true, false} {
			u, err := endpointURL(s, bare)
			if err != nil {
				continue
			}
			req, err := http.NewRequest(http.MethodPost, u, nil)
			if err != nil {
				t.Fatalf("endpointURL(%q) = %q, which is no request URL: %v", s, u, err)
			}
			if req.URL.User != nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") {
				t.Fatalf("endpointURL(%q) = %q", s, u)
			}
		}
	})
}

// collector is an OTLP/HTTP collector stand-in: it decodes every export
// request with the OTLP collector types.
type collector struct {
	mu       sync.Mutex
	requests []*coltracepb.ExportTraceServiceRequest
	headers  []http.Header
	// status, when set, answers the next requests with these codes.
	status []int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(data, &req)
	}
	if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad export request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.headers = append(c.headers, r.Header.Clone())
	if len(c.status) > 0 {
		code := c.status[0]
		c.status = c.status[1:]
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(code)
		return
	}
	c.requests = append(c.requests, &req)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// spans returns the names of the spans received, and the resource
// attributes of the last.
func (c *collector) spans() (names []string, resource map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resource = map[string]string{}
	for _, req := range c.requests {
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				resource[kv.Key] = kv.GetValue().GetStringValue()
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names = append(names, s.Name)
				}
			}
		}
	}
	return names, resource
}

func TestExportToCollector(t *testing.T) {
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	var logs bytes.Buffer
	p, err := Start(Config{Endpoint: srv.URL, Service: "fleet-agent", Version: "1.2.3", Host: "web-1", Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		envOf(map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0k", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}))
	if err != nil {
		t.Fatal(err)
	}
	if p.Endpoint() != srv.URL+"/v1/traces" {
		t.Errorf("endpoint %s", p.Endpoint())
	}
	tr := p.TracerProvider().Tracer("test")
	ctx, parent := tr.Start(context.Background(), "parent")
	_, child := tr.Start(ctx, "child")
	child.End()
	parent.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	names, res := col.spans()
	if strings.Join(names, ",") != "child,parent" {
		t.Errorf("spans %v, want child,parent", names)
	}
	if res["service.name"] != "fleet-agent" || res["service.version"] != "1.2.3" || res["host.name"] != "web-1" {
		t.Errorf("resource %v", res)
	}
	if h := col.headers[0]; h.Get("Authorization") != "Bearer t0k" || h.Get("Content-Encoding") != "gzip" {
		t.Errorf("request headers %v", h)
	}
	if logs.Len() != 0 {
		t.Errorf("logs: %s", logs.String())
	}
}

func TestExportOff(t *testing.T) {
	p, err := Start(Config{Service: "fleet-agent"}, envOf(nil))
	if err != nil || p != nil {
		t.Fatalf("Start with no endpoint = %v, %v; want nil, nil", p, err)
	}
	if p.TracerProvider() != nil || p.Shutdown(context.Background()) != nil || p.Endpoint() != "" {
		t.Error("a nil Provider must do nothing")
	}
}

func TestExportRetries(t *testing.T) {
	col := &collector{status: []int{http.StatusServiceUnavailable}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	ec, err := exporterConfig(srv.URL, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	c, err := newHTTPClient(ec)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UploadTraces(context.Background(), nil); err != nil {
		t.Fatalf("a 503 then a 200: %v", err)
	}
	if len(col.headers) != 2 || len(col.requests) != 1 {
		t.Errorf("%d requests, %d taken; want 2 and 1", len(col.headers), len(col.requests))
	}

	col.status = []int{http.StatusBadRequest, http.StatusBadRequest}
	if err := c.UploadTraces(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a 400: %v", err)
	}
	if len(col.headers) != 3 {
		t.Errorf("a 400 was retried: %d requests", len(col.headers))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	col.status = []int{503, 503, 503, 503, 503}
	if err := c.UploadTraces(ctx, nil); err == nil || !strings.Contains(err.Error(), "gave up retrying") {
		t.Fatalf("retries past the export's deadline: %v", err)
	}
}

// TestExportFailureLogs: a collector that is down is logged once, and
// once when it answers again, however many batches fail in between.
func TestExportFailureLogs(t *testing.T) {
	col := &collector{status: []int{400, 400, 400}}
	srv := httptest.NewServer(col)
	defer srv.Close()
	var logs bytes.Buffer
	p, err := Start(Config{Endpoint: srv.URL, Service: "fleet-gateway", Logger: slog.New(slog.NewTextHandler(&logs, nil))}, envOf(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	tr := p.TracerProvider().Tracer("test")
	for range 4 {
		_, s := tr.Start(context.Background(), "s")
		s.End()
		if err := p.tp.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	got := logs.String()
	if strings.Count(got, "cannot export spans") != 1 || strings.Count(got, "exporting spans again") != 1 || !strings.Contains(got, "spans_dropped=3") {
		t.Errorf("logs:\n%s", got)
	}
}
