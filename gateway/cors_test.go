package gateway

import (
	"errors"
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
