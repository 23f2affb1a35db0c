package protocol

import (
	"fmt"
	"net/url"
	"strings"
)

// ValidateNATSURL reports whether s is a URL a NATS client can dial:
// nats://, tls://, ws:// or wss:// with a host, or a bare HOST[:PORT],
// which means nats://. Anything else is refused with what to give
// instead: NATS clients dial any other scheme as plain NATS, so an
// http:// URL (the gateway's MCP endpoint, say) would otherwise fail only
// with i/o timeouts, retried for ever.
func ValidateNATSURL(s string) error {
	const want = "give a NATS URL such as nats://HOST:4222 (tls://HOST:4222 for TLS)"
	s = strings.TrimSpace(s)
	if s == "" {
		return fmt.Errorf("empty NATS URL: %s", want)
	}
	full := s
	if !strings.Contains(s, "://") {
		full = "nats://" + s
	}
	u, err := url.Parse(full)
	if err != nil {
		return fmt.Errorf("NATS URL %q does not parse (%w): %s", s, err, want)
	}
	switch strings.ToLower(u.Scheme) {
	case "nats", "tls", "ws", "wss":
	case "http", "https":
		return fmt.Errorf("%q is an HTTP URL, not a NATS one (the gateway's MCP endpoint is for MCP clients; agents dial its NATS port, 4222 by default): %s", s, want)
	default:
		return fmt.Errorf("NATS URL %q has the unknown scheme %q: %s", s, u.Scheme, want)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("NATS URL %q names no host: %s", s, want)
	}
	return nil
}
