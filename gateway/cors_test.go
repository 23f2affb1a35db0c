package gateway

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestValidateCORSOrigins(t *testing.T) {
	for _, tc := range []struct {
		origin, want string
	}{
		{"https://app.example.com", ""},
		{"http://localhost:6274", ""},
		{"http://[::1]:6274", ""},
		{"*", "would admit any page"},
		{"null", "would admit any page"},
		{"app.example.com", "want an origin"},
		{"ftp://app.example.com", "want an origin"},
		{"https://user@app.example.com", "want an origin"},
		{"https://app.example.com/", "use https://app.example.com"},
		{"https://app.example.com/mcp", "no path"},
		{"https://App.Example.com", "lower case"},
		{"https://app.example.com?", "no path"},
		{"https://app.example.com#", "no path"},
	} {
		err := errors.Join(validateCORSOrigins([]string{tc.origin})...)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%q: %v", tc.origin, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--cors_origins")):
			t.Errorf("%q: err = %v, want one saying %q", tc.origin, err, tc.want)
		}
	}
}

// FuzzValidateCORSOrigins: whatever is given, an origin accepted is one a
// browser can send: http(s)://host[:port] in lower case, nothing more.
func FuzzValidateCORSOrigins(f *testing.F) {
	for _, s := range []string{"https://app.example.com", "http://localhost:6274", "*", "https://a/b", "HTTPS://A", "https://u@h", "http://[::1]:1", "javascript:alert(1)", "https://a.b?", "https://a.b#"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, origin string) {
		if len(validateCORSOrigins([]string{origin})) > 0 {
			return
		}
		u, err := url.Parse(origin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil ||
			strings.ToLower(origin) != origin || u.Scheme+"://"+u.Host != origin {
			t.Fatalf("accepted %q", origin)
		}
	})
}
