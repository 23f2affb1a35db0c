package protocol

import (
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file is the label grammar: what a host's label may be, wherever a
// label is given (a join token, `fleetctl agent label`, the admin API, an
// agent's enrolment file) or named (host selectors). Every label a
// gateway accepts can be named by a selector, and the selector key=value
// picks exactly the hosts with that value (a value never holds a glob
// character).
//
//	key    1 to MaxLabelKeyLen bytes of a-z A-Z 0-9 - _ . /
//	value  0 to MaxLabelValueLen bytes of printable characters, without
//	       white space or any of , = ! ( ) * ?
//
// A host has at most MaxLabels labels. The text form of a set of labels
// is "key=value,key2=value2" (ParseLabels, FormatLabels).

// LabelKeyGrammar and LabelValueGrammar say what a label key and value
// may hold, for messages.
const (
	LabelKeyGrammar   = "keys are 1 to 128 of a-z A-Z 0-9 - _ . /"
	LabelValueGrammar = "values are up to 256 printable characters without spaces or any of , = ! ( ) * ?"
)

// labelValueSyntax holds the characters a label value may not hold
// because selectors give them a meaning.
const labelValueSyntax = ",=!()*?"

// IsLabelKeyRune reports whether r may appear in a label key.
func IsLabelKeyRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' || r == '/'
}

// IsLabelValueRune reports whether r may appear in a label value.
func IsLabelValueRune(r rune) bool {
	return r != utf8.RuneError && unicode.IsGraphic(r) && !unicode.IsSpace(r) && !strings.ContainsRune(labelValueSyntax, r)
}

// ValidateLabelKey checks one label key against the grammar. The error
// quotes the key, names the first character not allowed and says what
// keys may hold.
func ValidateLabelKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("a label has an empty key: write key=value (%s)", LabelKeyGrammar)
	case len(k) > MaxLabelKeyLen:
		return fmt.Errorf("label key %s is %d bytes long; at most %d are allowed", Excerpt(Clip(k, 40)), len(k), MaxLabelKeyLen)
	}
	for i, r := range k {
		if !IsLabelKeyRune(r) {
			return fmt.Errorf("label key %q has %s at byte %d: %s", k, describeRune(k[i:]), i, LabelKeyGrammar)
		}
	}
	return nil
}

// ValidateLabelValue checks the value v of the label k against the
// grammar. The error names the label and the first character not
// allowed, and says what values may hold.
func ValidateLabelValue(k, v string) error {
	if len(v) > MaxLabelValueLen {
		return fmt.Errorf("the value of label %s is %d bytes long; at most %d are allowed", Excerpt(Clip(k, 40)), len(v), MaxLabelValueLen)
	}
	for i, r := range v {
		if !IsLabelValueRune(r) {
			why := ""
			if strings.ContainsRune("*?", r) {
				why = " (selectors read them as globs, so the value could not be named exactly)"
			}
			return fmt.Errorf("the value of label %s has %s at byte %d: %s%s", Excerpt(Clip(k, 40)), describeRune(v[i:]), i, LabelValueGrammar, why)
		}
	}
	return nil
}

// describeRune names the character s starts with: quoted, or as the byte
// that is not UTF-8.
func describeRune(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && n <= 1 {
		return fmt.Sprintf("the byte %#x, which is not UTF-8", s[0])
	}
	return fmt.Sprintf("%q", r)
}

// ValidateLabels checks a host's labels against the grammar: at most
// MaxLabels of them, every key and value as ValidateLabelKey and
// ValidateLabelValue require. It checks keys in sorted order, so the
// error is the same from one call to the next.
func ValidateLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels; at most %d are allowed", len(labels), MaxLabels)
	}
	for _, k := range sortedKeys(labels) {
		if err := ValidateLabelKey(k); err != nil {
			return err
		}
		if err := ValidateLabelValue(k, labels[k]); err != nil {
			return err
		}
	}
	return nil
}

// checkLabelLimits checks only the count and lengths of labels: what an
// announce is held to, since the labels an agent announces are ignored.
func checkLabelLimits(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%d labels; at most %d are allowed", len(labels), MaxLabels)
	}
	for k, v := range labels {
		if k == "" {
			return fmt.Errorf("a label has an empty key: write key=value (%s)", LabelKeyGrammar)
		}
		if err := checkLen("label key", k, MaxLabelKeyLen); err != nil {
			return err
		}
		if len(v) > MaxLabelValueLen {
			return checkLen("value of label "+Excerpt(Clip(k, 40)), v, MaxLabelValueLen)
		}
	}
	return nil
}

// ParseLabels reads labels in their text form, "key=value,key2=value2"
// (white space around items, keys and values ignored; empty or blank:
// no labels), and checks them with ValidateLabels. A key may appear
// once.
func ParseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return labels, nil
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("label %s has no '=': write key=value, several separated by commas (env=prod,role=web)", Excerpt(strings.TrimSpace(item)))
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if err := ValidateLabelKey(k); err != nil {
			return nil, err
		}
		if err := ValidateLabelValue(k, v); err != nil {
			return nil, err
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("label %q is given twice: give each key once", k)
		}
		labels[k] = v
	}
	if err := ValidateLabels(labels); err != nil {
		return nil, err
	}
	return labels, nil
}

// FormatLabels writes labels in their text form, sorted by key: what
// ParseLabels reads back to the same labels. No labels print as "".
func FormatLabels(labels map[string]string) string {
	var b strings.Builder
	for i, k := range sortedKeys(labels) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + labels[k])
	}
	return b.String()
}

func sortedKeys(labels map[string]string) []string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
