// Package tracing sets up the optional OpenTelemetry tracing of the
// fleetmcp daemons: an SDK tracer provider whose spans go, in batches, to
// an OTLP/HTTP collector. It lives with the commands, not the libraries:
// it reads the standard OTEL_* environment variables, and the gateway and
// agent packages only take the tracer provider it returns.
//
// The spans are encoded by the OpenTelemetry OTLP trace exporter; they
// are sent by the small HTTP client in otlphttp.go rather than the
// exporter's own, which links gRPC and would nearly double fleet-agent.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config says where spans go and what made them.
type Config struct {
	// Endpoint is the --otlp_endpoint flag: the collector's OTLP/HTTP
	// URL. Empty: the endpoint the environment names
	// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT),
	// or none, and tracing is off.
	Endpoint string
	// Service and Version name the program (service.name and
	// service.version; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// override them). Host is host.name: the agent's host ID in the
	// fleet, or the gateway machine's name.
	Service, Version, Host string
	// Logger gets one line when exporting starts failing and one when it
	// works again.
	Logger *slog.Logger
}

// Provider is a running tracer provider; nil when tracing is off.
type Provider struct {
	tp       *sdktrace.TracerProvider
	endpoint string
}

// Start reads the exporter settings (cfg and the environment, through
// getenv) and starts the tracer provider. It returns nil, and no error,
// when tracing is off: no endpoint anywhere, OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none. Settings it cannot honour are errors that
// name the flag or variable.
func Start(cfg Config, getenv func(string) string) (*Provider, error) {
	ec, err := exporterConfig(cfg.Endpoint, getenv)
	if err != nil || ec == nil {
		return nil, err
	}
	client, err := newHTTPClient(ec)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	exp, err := otlptrace.New(context.Background(), client)
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	res, err := newResource(cfg)
	if err != nil {
		return nil, err
	}
	// The SDK reports what it cannot export or configure (a bad
	// OTEL_TRACES_SAMPLER, say) to the global handler; the exporter's
	// own failures are logged by loggingExporter, once per change.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	// The sampler is the SDK's: parent-based, always on, unless
	// OTEL_TRACES_SAMPLER says otherwise; so are the batch limits
	// (OTEL_BSP_*).
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(&loggingExporter{SpanExporter: exp, log: log, endpoint: ec.url}),
		sdktrace.WithResource(res),
	)
	return &Provider{tp: tp, endpoint: ec.url}, nil
}

// newResource describes the program; the environment's attributes win.
func newResource(cfg Config) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", cfg.Service)}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	if cfg.Host != "" {
		attrs = append(attrs, attribute.String("host.name", cfg.Host))
	}
	res, err := resource.New(context.Background(), resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return res, nil
}

// TracerProvider returns the provider the gateway and agent take; nil
// when tracing is off (p is nil).
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.tp
}

// Endpoint is the URL spans are sent to ("" when off).
func (p *Provider) Endpoint() string {
	if p == nil {
		return ""
	}
	return p.endpoint
}

// Shutdown sends the spans still queued, within ctx, and stops. It does
// nothing when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flush spans to %s: %w", p.endpoint, err)
	}
	return nil
}

// loggingExporter logs the first failed export and the first success
// after failures, not every batch: a collector that is down would
// otherwise add a line every few seconds. The spans of a failed export
// are dropped, as the SDK would drop them.
type loggingExporter struct {
	sdktrace.SpanExporter
	log      *slog.Logger
	endpoint string

	mu      sync.Mutex
	failing bool
	lost    int
}

func (e *loggingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := e.SpanExporter.ExportSpans(ctx, spans)
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err != nil && !e.failing:
		e.failing, e.lost = true, len(spans)
		e.log.Warn("tracing: cannot export spans; dropping them until the collector answers", "endpoint", e.endpoint, "err", err)
	case err != nil:
		e.lost += len(spans)
	case e.failing:
		e.failing = false
		e.log.Info("tracing: exporting spans again", "endpoint", e.endpoint, "spans_dropped", e.lost)
	}
	return nil
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
