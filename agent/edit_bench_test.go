//go:build unix

package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// bigText is a file of about size bytes of numbered lines ending eol,
// and edits changing count of them, spread over the file, in order.
func bigText(size, count int, eol string) (string, []protocol.EditOp) {
	const width = 64
	lines := size / width
	var b strings.Builder
	b.Grow(lines * (width + 1))
	for i := range lines {
		line := fmt.Sprintf("line %08d: the quick brown fox jumps over the lazy dog", i)
		b.WriteString(line + strings.Repeat(" ", width-len(line)-len(eol)) + eol)
	}
	edits := make([]protocol.EditOp, count)
	for k := range edits {
		i := k * (lines / count)
		edits[k] = protocol.EditOp{OldString: fmt.Sprintf("line %08d: the quick", i), NewString: fmt.Sprintf("LINE %d:\nthe slow", i)}
	}
	return b.String(), edits
}

// BenchmarkEditManyEdits applies 1,000 edits to a 50 MiB file, with LF
// and with CRLF line endings.
func BenchmarkEditManyEdits(b *testing.B) {
	for _, eol := range []string{"\n", "\r\n"} {
		name := map[string]string{"\n": "LF", "\r\n": "CRLF"}[eol]
		content, edits := bigText(50<<20, 1000, eol)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(content)))
			for b.Loop() {
				if _, n, err := applyEdits(context.Background(), content, "f", edits); err != nil || n != len(edits) {
					b.Fatalf("applyEdits: %d, %v", n, err)
				}
			}
		})
	}
}
