package gateway

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// This file turns a tool call's arguments into the summary kept in the
// audit trail: what was done and where (command text, paths, sizes),
// never file contents, and with secret-looking values blanked. Redaction
// is best effort: it catches the common shapes (KEY=value assignments,
// --password flags, Authorization headers, URL credentials, well-known
// token formats, private keys), not every secret a command might hold.

const (
	// maxSummaryText bounds one string kept in a summary.
	maxSummaryText = 2000
	redacted       = "[redacted]"
)

// isContentArg reports arguments that carry file contents or edits: only
// their size is kept.
func isContentArg(name string) bool {
	switch name {
	case "content", "data", "edits", "old_string", "new_string", "patch", "diff":
		return true
	}
	return false
}

// redactor blanks secrets. Build one with newRedactor and share it; it is
// safe for concurrent use.
type redactor struct {
	// secretKey matches argument names whose values are secrets.
	secretKey *regexp.Regexp
	// patterns rewrite secret-looking parts of free text, in order.
	patterns []redaction
}

type redaction struct {
	re   *regexp.Regexp
	repl string
}

func newRedactor() *redactor {
	knownTokens := `\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|` +
		apiTokenPrefix + `[A-Za-z0-9_-]{20,}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)`
	return &redactor{
		secretKey: regexp.MustCompile(`(?i)pass(word|wd|phrase)?$|secret|token|api_?key|credential|private_?key|^auth`),
		patterns: []redaction{
			{regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)`), "[redacted private key]"},
			{regexp.MustCompile(`(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie)(\s*:\s*)[^'"\r\n]+`), "$1$2" + redacted},
			{regexp.MustCompile(`(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}`), "$1 " + redacted},
			{regexp.MustCompile(`(://[^/\s:@]+:)[^@\s/]+@`), "${1}" + redacted + "@"},
			{regexp.MustCompile(`(?i)\b([A-Za-z0-9_]*(?:pass(?:word|wd)?|secret|token|api_?key|access_?key|credential)[A-Za-z0-9_]*=)("[^"]*"|'[^']*'|[^\s;&|<>()]+)`), "${1}" + redacted},
			{regexp.MustCompile(`(?i)(\s--?[A-Za-z0-9-]*(?:pass(?:word)?|secret|token|api-?key)[A-Za-z0-9-]*)(\s+|=)("[^"]*"|'[^']*'|[^\s;&|<>()-][^\s;&|<>()]*)`), "${1}${2}" + redacted},
			{regexp.MustCompile(knownTokens), redacted},
		},
	}
}

// text blanks secret-looking parts of s and bounds its length.
func (r *redactor) text(s string) string {
	// Bound the regexp work first; what is cut here is cut below anyway.
	s = truncateText(s, 4*maxSummaryText)
	for _, p := range r.patterns {
		s = p.re.ReplaceAllString(s, p.repl)
	}
	return truncateText(s, maxSummaryText)
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("... [%d more bytes]", len(s)-cut)
}

// args returns the audit summary of a call's arguments: scalars
// as they are (strings redacted and bounded), contents and nested values
// by size only, secret-named arguments blanked. Arguments that are not a
// JSON object are summarised by size.
func (r *redactor) args(raw json.RawMessage) map[string]any {
	return r.shrunkArgs(raw, nil)
}

// shrunkArgs is args for arguments whose long strings were cut
// (shrinkArgs): sizes gives each top-level value's size in full.
func (r *redactor) shrunkArgs(raw json.RawMessage, sizes map[string]int) map[string]any {
	if len(raw) == 0 {
		return nil
	}
	var args map[string]any
	if err := json.Unmarshal(raw, &args); err != nil {
		return map[string]any{"unreadable_bytes": len(raw)}
	}
	out := make(map[string]any, len(args))
	for k, v := range args {
		size, ok := sizes[k]
		if !ok {
			size = jsonSize(v)
		}
		switch {
		case r.secretKey.MatchString(k):
			out[k] = redacted
		case isContentArg(k):
			out[k+"_bytes"] = size
		default:
			out[k] = r.value(v, size)
		}
	}
	return out
}

// value summarises v, whose size in full is size.
func (r *redactor) value(v any, size int) any {
	switch v := v.(type) {
	case string:
		if size > len(v) {
			// Cut already: keep what the summary keeps, and say how
			// much there was.
			return truncateText(r.text(v), maxSummaryText-40) + fmt.Sprintf(" [%d bytes in all]", size)
		}
		return r.text(v)
	case float64, bool, nil:
		return v
	case []any:
		return fmt.Sprintf("[%d items, %d bytes]", len(v), size)
	default:
		return fmt.Sprintf("[object, %d bytes]", size)
	}
}

func jsonSize(v any) int {
	if s, ok := v.(string); ok {
		return len(s)
	}
	data, _ := json.Marshal(v)
	return len(data)
}

// lastLine returns the last non-empty line of s, redacted and bounded:
// the status line of a bash result, or a one-line error message.
func (r *redactor) lastLine(s string) string {
	s = strings.TrimRight(s, "\n ")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return truncateText(r.text(s), 300)
}
