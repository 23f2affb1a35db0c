package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

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
		if err := protocol.ValidateLabelKey(k); err != nil {
			return labelEdits{}, err
		}
		if err := protocol.ValidateLabelValue(k, v); err != nil {
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

// formatLabels writes labels as "k=v,k2=v2", sorted by key ("-": none).
func formatLabels(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	return protocol.FormatLabels(labels)
}
