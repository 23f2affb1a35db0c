package agent

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Output limits of read and bash, whichever is reached first. They match
// the pi coding agent so that models trained on it see the same notes.
const (
	truncMaxLines = protocol.MaxOutputLines
	truncMaxBytes = protocol.MaxOutputBytes // 51200
)

// outputLimits bounds a truncated text. Both fields must be positive.
type outputLimits struct {
	lines int
	bytes int
}

// Bounds of the bash output limits an agent may set.
const (
	bashMaxLinesLimit = 100_000
	bashMinBytes      = 1 << 10
	bashMaxBytesLimit = 4 << 20
)

// setBashLimits defaults and checks the bash output limits.
func (c *toolboxConfig) setBashLimits() error {
	if c.BashMaxLines == 0 {
		c.BashMaxLines = truncMaxLines
	}
	if c.BashMaxBytes == 0 {
		c.BashMaxBytes = truncMaxBytes
	}
	var errs []error
	if c.BashMaxLines < 1 || c.BashMaxLines > bashMaxLinesLimit {
		errs = append(errs, fmt.Errorf("toolbox: bash output limit of %d lines (--bash_max_lines) is out of range: use 1 to %d (default %d)",
			c.BashMaxLines, bashMaxLinesLimit, truncMaxLines))
	}
	if c.BashMaxBytes < bashMinBytes || c.BashMaxBytes > bashMaxBytesLimit {
		errs = append(errs, fmt.Errorf("toolbox: bash output limit of %d bytes (--bash_max_bytes) is out of range: use %d (1 KiB) to %d (4 MiB) (default %d)",
			c.BashMaxBytes, bashMinBytes, bashMaxBytesLimit, truncMaxBytes))
	}
	return errors.Join(errs...)
}

// bashLimits returns the limits bash results are shown within.
func (c *toolboxConfig) bashLimits() outputLimits {
	return outputLimits{lines: c.BashMaxLines, bytes: c.BashMaxBytes}
}

// sizeLabel names a byte limit as the notes do: "50KB" for 51,200.
func sizeLabel(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%dKB", n/1024)
	}
	return fmt.Sprintf("%d bytes", n)
}

// defaultLimits returns the limits the tools apply.
func defaultLimits() outputLimits {
	return outputLimits{lines: truncMaxLines, bytes: truncMaxBytes}
}

// A line is a run of bytes ended by '\n' or by the end of the text, so
// "a\nb\n" and "a\nb" both have two lines and "" has none. Kept text
// includes the '\n' of every kept line that has one.

// truncation describes how a text was cut to fit outputLimits.
type truncation struct {
	// Content is the kept text: a prefix of the input for truncateHead, a
	// suffix for truncateTail. It never ends inside a UTF-8 sequence the
	// input did not.
	Content string
	// Truncated reports whether Content is shorter than the input.
	Truncated bool
	// By names the limit that cut the text: "lines" or "bytes"; empty when
	// nothing was cut.
	By string
	// TotalLines is the number of lines in the input.
	TotalLines int
	// OutputLines is the number of lines, whole or partial, in Content.
	OutputLines int
	// StartLine and EndLine are the 1-based numbers of the first and last
	// input line in Content; both are 0 when Content is empty.
	StartLine, EndLine int
	// LastLinePartial (tail only) reports that the last line alone exceeds
	// the byte limit and Content is its end, cut on a UTF-8 boundary.
	LastLinePartial bool
	// FirstLineTooLong (head only) reports that the first line alone
	// exceeds the byte limit, so Content is empty.
	FirstLineTooLong bool
}

// countTextLines returns the number of lines in s.
func countTextLines(s string) int {
	n := strings.Count(s, "\n")
	if s != "" && s[len(s)-1] != '\n' {
		n++
	}
	return n
}

// truncateHead keeps the first lines of s that fit the default limits; read
// uses it. Only whole lines are kept.
func truncateHead(s string) truncation {
	return cutHead(s, countTextLines(s), true, defaultLimits())
}

// truncateTail keeps the last lines of s that fit the default limits; bash
// uses it. Only whole lines are kept, except that when the last line alone
// is too long its end is kept.
func truncateTail(s string) truncation {
	return cutTail(s, countTextLines(s), true, defaultLimits())
}

// untruncated is the truncation of a text that fits the limits whole.
func untruncated(s string, totalLines int) truncation {
	t := truncation{TotalLines: totalLines, Content: s, OutputLines: totalLines}
	if totalLines > 0 {
		t.StartLine, t.EndLine = 1, totalLines
	}
	return t
}

// cutHead is truncateHead for a text of which s is a prefix: whole reports
// whether s is the entire text, and totalLines counts the lines of the
// entire text. When s is not whole it must hold more than lim.bytes bytes
// or at least lim.lines complete lines, so that the cut can be decided from
// s alone.
func cutHead(s string, totalLines int, whole bool, lim outputLimits) truncation {
	t := truncation{TotalLines: totalLines}
	if whole && totalLines <= lim.lines && len(s) <= lim.bytes {
		return untruncated(s, totalLines)
	}
	end, kept, by := 0, 0, "lines"
	for kept < lim.lines && end < len(s) {
		next := len(s)
		if i := strings.IndexByte(s[end:], '\n'); i >= 0 {
			next = end + i + 1
		} else if !whole {
			by = "bytes" // a line cut off by the end of the prefix
			break
		}
		if next > lim.bytes {
			by = "bytes"
			break
		}
		end, kept = next, kept+1
	}
	t.Content, t.OutputLines = s[:end], kept
	if kept > 0 {
		t.StartLine, t.EndLine = 1, kept
	}
	if kept < totalLines {
		t.Truncated, t.By = true, by
		t.FirstLineTooLong = kept == 0
	}
	return t
}

// cutTail is truncateTail for a text of which s is a suffix: whole reports
// whether s is the entire text, and totalLines counts the lines of the
// entire text. When s is not whole it must hold more than lim.bytes bytes.
func cutTail(s string, totalLines int, whole bool, lim outputLimits) truncation {
	t := truncation{TotalLines: totalLines}
	if whole && totalLines <= lim.lines && len(s) <= lim.bytes {
		return untruncated(s, totalLines)
	}
	start, kept, by := len(s), 0, "lines"
	for kept < lim.lines && start > 0 {
		prev := strings.LastIndexByte(s[:start-1], '\n') + 1
		if (prev == 0 && !whole) || len(s)-prev > lim.bytes {
			by = "bytes"
			break
		}
		start, kept = prev, kept+1
	}
	if kept == 0 && len(s) > 0 {
		return lastLineTail(s, totalLines, lim)
	}
	t.Content, t.OutputLines = s[start:], kept
	if kept > 0 {
		t.StartLine, t.EndLine = totalLines-kept+1, totalLines
	}
	if kept < totalLines {
		t.Truncated, t.By = true, by
	}
	return t
}

// lastLineTail keeps the last lim.bytes bytes of s, whose last line alone
// is longer than that, moving the cut forward to a UTF-8 boundary.
func lastLineTail(s string, totalLines int, lim outputLimits) truncation {
	cut := len(s) - lim.bytes
	for i := 0; i < utf8.UTFMax-1 && cut < len(s) && !utf8.RuneStart(s[cut]); i++ {
		cut++
	}
	return truncation{
		Content:         s[cut:],
		Truncated:       true,
		By:              "bytes",
		TotalLines:      totalLines,
		OutputLines:     1,
		StartLine:       totalLines,
		EndLine:         totalLines,
		LastLinePartial: true,
	}
}

// humanSize formats a byte count the way the pi coding agent does: 512B,
// 50.0KB, 1.5MB.
func humanSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%dB", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1fKB", float64(n)/(1<<10))
	default:
		return fmt.Sprintf("%.1fMB", float64(n)/(1<<20))
	}
}
