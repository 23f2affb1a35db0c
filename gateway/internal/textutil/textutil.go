// Package textutil holds the text helpers the gateway's packages share:
// cutting text short and writing labels. It knows no gateway concern and
// imports nothing from the module.
package textutil

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Truncate cuts s to at most n bytes, on a character boundary, and says
// how much was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	head := protocol.Clip(s, n)
	return head + fmt.Sprintf("... [%d more bytes]", len(s)-len(head))
}

// FormatLabels writes labels as k=v,k=v in key order.
func FormatLabels(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}
