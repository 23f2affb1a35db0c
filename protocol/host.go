package protocol

import (
	"fmt"
	"strings"
)

// MaxHostLen bounds a host ID so subjects stay short.
const MaxHostLen = 64

// ValidateHost reports whether id can name a host on the wire. A host ID is
// 1 to 64 characters of ASCII letters, digits, '-' and '_', starting with a
// letter or digit. That excludes every character NATS gives meaning to ('.',
// '*', '>', whitespace) and keeps IDs readable in logs and paths.
func ValidateHost(id string) error {
	if id == "" {
		return fmt.Errorf("host name is empty: give the machine's name, e.g. web-1")
	}
	if len(id) > MaxHostLen {
		return fmt.Errorf("host name %.20q... is %d characters; at most %d are allowed", id, len(id), MaxHostLen)
	}
	for i, r := range []rune(id) {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case (r == '-' || r == '_') && i > 0:
		default:
			return fmt.Errorf("host name %q has %q at position %d: use letters, digits, '-' and '_' only, starting with a letter or digit", id, string(r), i+1)
		}
	}
	return nil
}

// HostFromName turns a machine's hostname into a valid host ID: it keeps the
// first DNS label, lower-cases it and replaces anything not allowed with '-'.
// It returns "host" when nothing usable remains.
func HostFromName(name string) string {
	name, _, _ = strings.Cut(name, ".")
	var b strings.Builder
	for i := 0; i < len(name) && b.Len() < MaxHostLen; i++ {
		c := name[i]
		switch {
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			b.WriteByte(c)
		case b.Len() > 0:
			b.WriteByte('-')
		}
	}
	if b.Len() == 0 {
		return "host"
	}
	return b.String()
}
