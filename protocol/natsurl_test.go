package protocol

import (
	"net/url"
	"strings"
	"testing"
)

func TestValidateNATSURL(t *testing.T) {
	for _, ok := range []string{
		"nats://127.0.0.1:4222", "tls://nats.example:4222", "ws://n1:8080", "wss://n1/nats",
		"127.0.0.1:4222", "nats.example", "NATS://N1:4222", "nats://user:pass@n1:4222", "nats://[::1]:4222",
	} {
		if err := ValidateNATSURL(ok); err != nil {
			t.Errorf("ValidateNATSURL(%q) = %v, want nil", ok, err)
		}
	}
	for _, tc := range []struct{ url, want string }{
		{"http://127.0.0.1:8080/mcp", "HTTP URL, not a NATS one"},
		{"https://fleet.example", "HTTP URL, not a NATS one"},
		{"HTTP://fleet.example:4222", "HTTP URL"},
		{"ftp://n1:4222", `unknown scheme "ftp"`},
		{"nats://", "names no host"},
		{"nats://:4222", "names no host"},
		{"nats://n1:port", "does not parse"},
		{"", "empty NATS URL"},
		{"  ", "empty NATS URL"},
	} {
		err := ValidateNATSURL(tc.url)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "nats://HOST:4222") {
			t.Errorf("ValidateNATSURL(%q) = %v, want an error mentioning %q and nats://HOST:4222", tc.url, err, tc.want)
		}
	}
}

// FuzzValidateNATSURL: no input panics, and every URL accepted names a
// host under a scheme a NATS client dials as NATS.
func FuzzValidateNATSURL(f *testing.F) {
	for _, s := range []string{"nats://127.0.0.1:4222", "http://h:8080/mcp", "h:4222", "tls://[::1]:4222", "wss://h/p", "nats://%zz", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateNATSURL(s) != nil {
			return
		}
		full := strings.TrimSpace(s)
		if !strings.Contains(full, "://") {
			full = "nats://" + full
		}
		u, err := url.Parse(full)
		if err != nil {
			t.Fatalf("accepted %q, which does not parse: %v", s, err)
		}
		if u.Hostname() == "" {
			t.Fatalf("accepted %q, which names no host", s)
		}
		switch strings.ToLower(u.Scheme) {
		case "nats", "tls", "ws", "wss":
		default:
			t.Fatalf("accepted %q with scheme %q", s, u.Scheme)
		}
	})
}
