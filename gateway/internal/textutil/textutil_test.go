package textutil

import "testing"

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc... [3 more bytes]"},
		// é is two bytes: the cut does not split it.
		{"aé", 2, "a... [2 more bytes]"},
	} {
		if got := Truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestFormatLabels(t *testing.T) {
	if got := FormatLabels(map[string]string{"role": "web", "env": "prod"}); got != "env=prod,role=web" {
		t.Errorf("got %q", got)
	}
	if got := FormatLabels(nil); got != "" {
		t.Errorf("no labels: %q", got)
	}
}
