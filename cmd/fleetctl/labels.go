package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// parseLabels reads the --labels of a join token: "k=v,k2=v2" (empty:
// none). A key may appear once.
func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return labels, nil
	}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			return nil, fmt.Errorf("label %q has no '=': write key=value, several separated by commas (env=prod,role=web)", item)
		}
		if err := checkLabelKey(k); err != nil {
			return nil, err
		}
		if err := checkLabelValue(k, v); err != nil {
			return nil, err
		}
		if _, dup := labels[k]; dup {
			return nil, fmt.Errorf("label %q is given twice: give each key once", k)
		}
		labels[k] = v
	}
	if err := protocol.ValidateLabels(labels); err != nil {
		return nil, err
	}
	return labels, nil
}

// labelEdits is what `agent label` changes: labels to set and keys to
// remove.
type labelEdits struct {
	Set    map[string]string
	Remove []string
}

// parseLabelEdits reads the arguments of `agent label NAME ...` the way
// kubectl does: "k=v" sets label k to v, "k-" removes label k. A key may
// appear once across all of them.
func parseLabelEdits(args []string) (labelEdits, error) {
	e := labelEdits{Set: map[string]string{}}
	if len(args) == 0 {
		return e, errors.New("no label changes: give key=value to set a label, key- to remove one")
	}
	seen := map[string]bool{}
	for _, arg := range args {
		k, v, set := strings.Cut(arg, "=")
		if !set {
			var ok bool
			if k, ok = strings.CutSuffix(arg, "-"); !ok {
				return labelEdits{}, fmt.Errorf("%q is neither key=value (set a label) nor key- (remove one)", arg)
			}
		}
		if err := checkLabelKey(k); err != nil {
			return labelEdits{}, err
		}
		if err := checkLabelValue(k, v); err != nil {
			return labelEdits{}, err
		}
		if seen[k] {
			return labelEdits{}, fmt.Errorf("label %q is changed twice: give each key once", k)
		}
		seen[k] = true
		if set {
			e.Set[k] = v
		} else {
			e.Remove = append(e.Remove, k)
		}
	}
	if err := protocol.ValidateLabels(e.Set); err != nil {
		return labelEdits{}, err
	}
	sort.Strings(e.Remove)
	return e, nil
}

// checkLabelKey refuses keys that could not be written back the way
// they were read: empty, with '=' or ',' or white space, too long.
func checkLabelKey(k string) error {
	if k == "" {
		return errors.New("a label has an empty key: write key=value")
	}
	if len(k) > protocol.MaxLabelKeyLen {
		return fmt.Errorf("label key %.20q... is %d bytes; at most %d are allowed", k, len(k), protocol.MaxLabelKeyLen)
	}
	if !utf8.ValidString(k) {
		return fmt.Errorf("label key %q is not UTF-8 text", k)
	}
	if i := strings.IndexFunc(k, func(r rune) bool { return r == '=' || r == ',' || unicode.IsSpace(r) || !unicode.IsPrint(r) }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(k[i:])
		return fmt.Errorf("label key %q has %q: keys are made of letters, digits and punctuation other than '=' and ','", k, r)
	}
	return nil
}

// checkLabelValue refuses control characters in the value of label k
// (they would garble every list that shows it), and commas (host
// selectors, env=prod,role=web, could never name the value).
func checkLabelValue(k, v string) error {
	if strings.Contains(v, ",") {
		return fmt.Errorf("the value of label %q has a ',': host selectors separate terms with commas, so it could never be selected", k)
	}
	if i := strings.IndexFunc(v, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return fmt.Errorf("the value of label %q has the control character %q: values are one line of text", k, r)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("the value of label %q is not UTF-8 text", k)
	}
	return nil
}

// formatLabels writes labels as "k=v,k2=v2", sorted by key ("-": none).
func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + labels[k])
	}
	return b.String()
}
