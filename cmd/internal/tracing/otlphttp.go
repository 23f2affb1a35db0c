package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// httpClient posts OTLP export requests, protobuf-encoded, to a
// collector: the OTLP/HTTP protocol as its specification has it,
// retrying what it calls retryable (429, 502, 503, 504 and failed
// connections) with backoff, and honouring Retry-After.
type httpClient struct {
	cfg *exportConfig
	hc  *http.Client
}

func newHTTPClient(ec *exportConfig) (*httpClient, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	if ec.caFile != "" {
		pem, err := os.ReadFile(ec.caFile)
		if err != nil {
			return nil, fmt.Errorf("tracing: the collector's CA (OTEL_EXPORTER_OTLP_CERTIFICATE): %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_CERTIFICATE %s has no PEM certificate", ec.caFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	if ec.certFile != "" {
		cert, err := tls.LoadX509KeyPair(ec.certFile, ec.keyFile)
		if err != nil {
			return nil, fmt.Errorf("tracing: the client certificate (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE, _CLIENT_KEY): %w", err)
		}
		tr.TLSClientConfig.Certificates = []tls.Certificate{cert}
	}
	return &httpClient{cfg: ec, hc: &http.Client{
		Transport: tr,
		// A redirect could carry the headers (credentials) elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

func (c *httpClient) Start(context.Context) error { return nil }

func (c *httpClient) Stop(context.Context) error {
	c.hc.CloseIdleConnections()
	return nil
}

// Retries of one export: at most maxAttempts tries, waits doubling from
// firstBackoff up to maxBackoff (or what Retry-After asks, up to
// maxRetryAfter), all within the export's context.
const (
	maxAttempts   = 5
	firstBackoff  = 500 * time.Millisecond
	maxBackoff    = 5 * time.Second
	maxRetryAfter = 30 * time.Second
)

// UploadTraces sends one export request; it may be called concurrently.
func (c *httpClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	body, err := encodeExportRequest(spans)
	if err != nil {
		return err
	}
	if c.cfg.gzip {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		if err := zw.Close(); err != nil {
			return fmt.Errorf("gzip export request: %w", err)
		}
		body = buf.Bytes()
	}
	wait := firstBackoff
	for attempt := 1; ; attempt++ {
		retryAfter, err := c.post(ctx, body)
		if err == nil {
			return nil
		}
		var perm *permanentError
		if errors.As(err, &perm) || attempt == maxAttempts {
			return err
		}
		if retryAfter > 0 {
			wait = min(retryAfter, maxRetryAfter)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave up retrying: %v)", err, ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, maxBackoff)
	}
}

// permanentError is an answer that retrying cannot change.
type permanentError struct{ msg string }

func (e *permanentError) Error() string { return e.msg }

// post sends body once. A retryable failure returns the wait the
// collector asked for (0: none).
func (c *httpClient) post(ctx context.Context, body []byte) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.cfg.url, bytes.NewReader(body))
	if err != nil {
		return 0, &permanentError{fmt.Sprintf("export request to %s: %v", c.cfg.url, err)}
	}
	for k, v := range c.cfg.headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if c.cfg.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("export spans to %s: %w", c.cfg.url, err)
	}
	// The answer (an ExportTraceServiceResponse, or a Status) is not
	// needed: read a bounded part so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		return 0, nil
	case code == http.StatusTooManyRequests || code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
		return retryAfter(resp.Header.Get("Retry-After")), fmt.Errorf("export spans to %s: %s", c.cfg.url, resp.Status)
	default:
		return 0, &permanentError{fmt.Sprintf("export spans to %s: %s", c.cfg.url, resp.Status)}
	}
}

// retryAfter reads a Retry-After header of seconds (an HTTP date is
// taken as no advice).
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, int(maxRetryAfter/time.Second))) * time.Second
}

// encodeExportRequest encodes an ExportTraceServiceRequest, whose only
// field is `repeated ResourceSpans resource_spans = 1`: each element is
// marshalled by the OTLP types and framed here, which spares linking the
// collector service package (and, through it, gRPC).
func encodeExportRequest(spans []*tracepb.ResourceSpans) ([]byte, error) {
	var out []byte
	for _, rs := range spans {
		b, err := proto.Marshal(rs)
		if err != nil {
			return nil, fmt.Errorf("encode spans: %w", err)
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out, nil
}
