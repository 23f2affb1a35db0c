// Package clip shortens text quoted back in errors, logs and records, so
// that a long or hostile input cannot make them long: String and Bytes cut
// at a UTF-8 character boundary and mark the cut. It imports only the
// standard library, so any package of the module may use it.
package clip

import "unicode/utf8"

// Marker follows text that was cut.
const Marker = "..."

// String returns s when it holds at most n bytes, else its longest prefix
// of at most n bytes that ends on a character boundary, followed by
// Marker.
func String(s string, n int) string {
	head, dropped := Cut(s, n)
	if dropped == 0 {
		return s
	}
	return head + Marker
}

// Bytes is String for a byte slice.
func Bytes(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	// String looks at most one byte past the cut.
	return String(string(b[:max(n, 0)+1]), n)
}

// Cut returns the longest prefix of s of at most n bytes that ends on a
// character boundary, and how many bytes of s it leaves out.
func Cut(s string, n int) (head string, dropped int) {
	if n < 0 {
		n = 0
	}
	if len(s) <= n {
		return s, 0
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], len(s) - cut
}
