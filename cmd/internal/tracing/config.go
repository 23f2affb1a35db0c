package tracing

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// exportConfig is where and how the client sends spans.
type exportConfig struct {
	url     string // the full URL export requests are posted to
	headers map[string]string
	timeout time.Duration // per request
	gzip    bool
	// caFile verifies the collector's certificate (default: the
	// system's roots); certFile and keyFile are a client certificate.
	caFile, certFile, keyFile string
}

// defaultTimeout is OTLP's default export timeout.
const defaultTimeout = 10 * time.Second

// tracesPath is where an OTLP/HTTP collector takes spans.
const tracesPath = "/v1/traces"

// exporterConfig resolves the exporter settings from the --otlp_endpoint
// flag and the OTLP environment variables, the traces-specific variable
// winning over the general one. It returns nil when tracing is off.
func exporterConfig(flagEndpoint string, getenv func(string) string) (*exportConfig, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	if off, err := exporterOff(getenv("OTEL_TRACES_EXPORTER")); off || err != nil {
		return nil, err
	}
	env := func(name string) (string, string) {
		if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_" + name)); v != "" {
			return v, "OTEL_EXPORTER_OTLP_TRACES_" + name
		}
		return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + name)), "OTEL_EXPORTER_OTLP_" + name
	}
	var ec exportConfig
	var err error
	switch flagEndpoint = strings.TrimSpace(flagEndpoint); {
	case flagEndpoint != "":
		ec.url, err = endpointURL(flagEndpoint, true)
		if err != nil {
			return nil, fmt.Errorf("--otlp_endpoint %q: %w", redacted(flagEndpoint), err)
		}
	case strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) != "":
		v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
		if ec.url, err = endpointURL(v, false); err != nil {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT %q: %w", redacted(v), err)
		}
	case strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) != "":
		v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
		if ec.url, err = baseURL(v); err != nil {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT %q: %w", redacted(v), err)
		}
	default:
		return nil, nil
	}
	if v, name := env("PROTOCOL"); v != "" && v != "http/protobuf" {
		return nil, fmt.Errorf("%s=%q: fleetmcp sends spans as http/protobuf only; set it to http/protobuf or unset it, and point the endpoint at the collector's OTLP/HTTP port (4318 by default)", name, v)
	}
	if ec.headers, err = parseHeaders(getenv("OTEL_EXPORTER_OTLP_HEADERS")); err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_HEADERS: %w", err)
	}
	traces, err := parseHeaders(getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS"))
	if err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_TRACES_HEADERS: %w", err)
	}
	for k, v := range traces {
		ec.headers[k] = v
	}
	ec.timeout = defaultTimeout
	if v, name := env("TIMEOUT"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(time.Hour/time.Millisecond) {
			return nil, fmt.Errorf("%s=%q: want milliseconds, 1 to 3600000", name, v)
		}
		ec.timeout = time.Duration(ms) * time.Millisecond
	}
	switch v, name := env("COMPRESSION"); v {
	case "", "none":
	case "gzip":
		ec.gzip = true
	default:
		return nil, fmt.Errorf("%s=%q: want gzip or none", name, v)
	}
	ec.caFile, _ = env("CERTIFICATE")
	ec.certFile, _ = env("CLIENT_CERTIFICATE")
	ec.keyFile, _ = env("CLIENT_KEY")
	if (ec.certFile == "") != (ec.keyFile == "") {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY (or their TRACES_ forms) go together: set both or neither")
	}
	return &ec, nil
}

// exporterOff reads OTEL_TRACES_EXPORTER: a list of otlp or none.
func exporterOff(v string) (bool, error) {
	names := splitList(v)
	off := len(names) > 0
	for _, n := range names {
		switch n {
		case "otlp":
			off = false
		case "none":
		default:
			return false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: fleetmcp exports traces over OTLP only; want otlp or none", v)
		}
	}
	return off, nil
}

// endpointURL checks a collector URL. With bare, a URL without a path
// (or only "/") gets the OTLP traces path, as a collector's address
// usually is given; a path is kept as it is.
func endpointURL(raw string, bare bool) (string, error) {
	u, err := checkURL(raw)
	if err != nil {
		return "", err
	}
	if bare && (u.Path == "" || u.Path == "/") {
		u.Path = tracesPath
	}
	return u.String(), nil
}

// baseURL is OTEL_EXPORTER_OTLP_ENDPOINT's rule: the traces path is
// appended to whatever path the URL has.
func baseURL(raw string) (string, error) {
	u, err := checkURL(raw)
	if err != nil {
		return "", err
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + tracesPath
	u.RawPath = ""
	return u.String(), nil
}

func checkURL(raw string) (*url.URL, error) {
	const want = "want an http:// or https:// URL of the collector's OTLP/HTTP endpoint, such as http://127.0.0.1:4318"
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		// Not err's text: it quotes the URL whole, password and all.
		return nil, fmt.Errorf("not a URL: %s", want)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New(want)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("the URL names no host")
	case u.User != nil:
		return nil, fmt.Errorf("the URL carries credentials: give them as a header in OTEL_EXPORTER_OTLP_HEADERS (authorization=...), which is not logged")
	case u.Fragment != "":
		return nil, fmt.Errorf("the URL has a fragment (#...), which a request cannot carry")
	}
	return u, nil
}

// redacted is raw for an error message: a password in it is replaced.
func redacted(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err == nil && u.User != nil:
		return u.Redacted()
	case err == nil:
		return raw
	}
	// Unparsed: whatever comes before an @ may be a password.
	if at := strings.LastIndexByte(raw, '@'); at >= 0 {
		scheme, _, _ := strings.Cut(raw, "://")
		return scheme + "://xxxxx" + raw[at:]
	}
	return raw
}

// parseHeaders reads the OTLP headers list: key=value pairs separated
// by commas, values percent-decoded (W3C baggage's form, which the OTLP
// exporters use).
func parseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	if len(s) > maxHeadersLen {
		return nil, fmt.Errorf("longer than %d bytes", maxHeadersLen)
	}
	for i, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			// Not quoted: the item may be a secret given without its key.
			return nil, fmt.Errorf("item %d: want key=value pairs separated by commas", i+1)
		}
		if !validHeaderName(k) {
			return nil, fmt.Errorf("%q is not a header name", protocol.Ellipsis(k, 40))
		}
		val, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("value of %s: %w", k, err)
		}
		if strings.ContainsAny(val, "\r\n\x00") {
			return nil, fmt.Errorf("value of %s has a line break or NUL", k)
		}
		out[http.CanonicalHeaderKey(k)] = val
	}
	return out, nil
}

// maxHeadersLen bounds an OTLP headers variable.
const maxHeadersLen = 16 << 10

// validHeaderName reports whether k is an HTTP token (RFC 9110).
func validHeaderName(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return k != ""
}
