package clip

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"exactly", 7, "exactly"},
		{"abcdefgh", 3, "abc..."},
		{"héllo", 2, "h..."}, // é is two bytes: not cut in half
		{"héllo", 3, "hé..."},
		{"日本語", 4, "日..."},
		{"abc", 0, "..."},
		{"abc", -1, "..."},
	} {
		if got := String(tc.s, tc.n); got != tc.want {
			t.Errorf("String(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
		if got := Bytes([]byte(tc.s), tc.n); got != tc.want {
			t.Errorf("Bytes(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
	if head, dropped := Cut("héllo", 2); head != "h" || dropped != 5 {
		t.Errorf("Cut = %q, %d", head, dropped)
	}
}

// FuzzString: whatever the input, the result is at most n bytes and the
// marker, valid UTF-8 when the input is, and a prefix of the input.
func FuzzString(f *testing.F) {
	f.Add("héllo wörld", 4)
	f.Add("\xff\xfeabc", 1)
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 1 << 16
		got := String(s, n)
		head := strings.TrimSuffix(got, Marker)
		if got == s {
			return
		}
		if len(head) > max(n, 0) || !strings.HasPrefix(s, head) {
			t.Fatalf("String(%q, %d) = %q", s, n, got)
		}
		if utf8.ValidString(s) && !utf8.ValidString(got) {
			t.Fatalf("String(%q, %d) = %q: not valid UTF-8", s, n, got)
		}
		if b := Bytes([]byte(s), n); b != got {
			t.Fatalf("Bytes = %q, String = %q", b, got)
		}
	})
}
