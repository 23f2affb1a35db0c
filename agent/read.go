package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// readArgs are the arguments of the read tool.
type readArgs struct {
	hostArg
	Path   string `json:"path"`
	Offset int    `json:"offset"` // first line to show, from 1; 0 means 1
	Limit  int    `json:"limit"`  // most lines to show; 0 means no limit
	// BinaryBase64 returns the file's raw bytes, base64-encoded, whatever
	// they are (see readMedia).
	BinaryBase64 bool `json:"binary_base64"`
	anchorArgs
}

// sniffLen is how much of a file is inspected to tell text from binary.
const sniffLen = 8 << 10

// read returns lines of a text file, head-truncated to the output limits,
// with notes that say how to read on; images as images (see image.go).
func (t *toolbox) read(ctx context.Context, tc *toolCall) *protocol.Result {
	var a readArgs
	if r := decodeArgs(tc, "read", &a); r != nil {
		return r
	}
	switch {
	case a.Path == "":
		return toolFailure(tc, "path is empty; give the file to read")
	case a.Offset < 0:
		return toolFailure(tc, "offset %d is negative; lines are numbered from 1", a.Offset)
	case a.Limit < 0:
		return toolFailure(tc, "limit %d is negative; give a positive number of lines, or leave it out", a.Limit)
	}
	if r := a.anchorArgs.check(tc, a.Offset, a.Limit); r != nil {
		return r
	}
	path, target, r := t.checkedPath(tc, a.Path, policy.Read)
	if r != nil {
		return r
	}
	refusal := "read returns text only"
	if a.BinaryBase64 {
		refusal = "binary_base64 reads regular files only"
	}
	f, size, err := t.openRegular(path, target, refusal)
	if err != nil {
		return textFailure(tc, err)
	}
	defer f.Close()
	// Images (told by their first bytes) and binary_base64 reads.
	if r := t.readMedia(ctx, tc, &a, path, f, size); r != nil {
		return r
	}
	br, err := checkText(f, size, path, refusal)
	if err != nil {
		return textFailure(tc, err)
	}
	if a.Anchor != "" {
		return readAnchored(ctx, tc, path, br, a.anchorArgs)
	}
	first := max(a.Offset, 1)
	scan, err := scanLines(ctx, br, first, a.Limit)
	if r := scanFailure(ctx, tc, path, err); r != nil {
		return r
	}
	switch {
	case scan.total == 0 && first == 1:
		return readResult(tc, path, scan, "(empty file)", readInfo{})
	case first > scan.total:
		return toolFailure(tc, "offset %d is beyond the end of %s (%d lines)", a.Offset, path, scan.total)
	}
	return readResult(tc, path, scan, readText(path, scan, first, a.Limit), readInfo{})
}

// readInfo is the structured result of a read: what a later write or
// edit needs to refer to exactly this version of the file.
type readInfo struct {
	Path       string `json:"path"`
	SHA256     string `json:"sha256"` // of the whole file, not only the lines shown
	TotalLines int    `json:"total_lines"`
	// Anchored reads only: the line the anchor starts on and the first
	// line shown.
	AnchorLine int `json:"anchor_line,omitempty"`
	StartLine  int `json:"start_line,omitempty"`
}

// readResult is a successful read showing text, with info completed from
// scan as the structured result.
func readResult(tc *toolCall, path string, scan lineScan, text string, info readInfo) *protocol.Result {
	r := toolText(tc, text)
	info.Path, info.SHA256, info.TotalLines = path, scan.sum, scan.total
	r.Structured, _ = json.Marshal(info)
	return r
}

// scanFailure is the result for a scan that ended early, or nil when it
// did not.
func scanFailure(ctx context.Context, tc *toolCall, path string, err error) *protocol.Result {
	switch {
	case ctx.Err() != nil:
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "read "+path+": cancelled")
	case err != nil:
		return toolFailure(tc, "%s", fsProblem(path, err))
	}
	return nil
}

// problem is why a file cannot be used, worded for the model.
type problem string

func (p problem) Error() string { return string(p) }

// textFailure is the result for openText's and loadText's errors.
func textFailure(tc *toolCall, err error) *protocol.Result {
	if isDenied(err) {
		return deniedResult(tc, err)
	}
	return toolFailure(tc, "%s", err.Error())
}

// openText opens target, the resolved path of path, for reading and
// checks that it is a regular text file. It reaches the file without
// following links (see openDir). A problem says what is wrong with path;
// refusal says what the calling tool accepts.
func (t *toolbox) openText(path, target, refusal string) (*os.File, *bufio.Reader, error) {
	f, size, err := t.openRegular(path, target, refusal)
	if err != nil {
		return nil, nil, err
	}
	br, err := checkText(f, size, path, refusal)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, br, nil
}

// checkText returns a reader of f, a file openRegular opened and checked,
// of size bytes, after making sure that it holds text.
func checkText(f *os.File, size int64, path, refusal string) (*bufio.Reader, error) {
	// Small files get a small buffer: reads of short files are the common
	// case and a 64 KiB allocation each would dominate their cost.
	br := bufio.NewReaderSize(f, min(64<<10, max(sniffLen, int(size)+1)))
	head, err := br.Peek(sniffLen)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, problem(fsProblem(path, err))
	}
	if looksBinary(head, len(head) < sniffLen) {
		return nil, problem(fmt.Sprintf("%s is a binary file (%d bytes); %s", path, size, refusal))
	}
	return br, nil
}

// notRegular describes why a file of the given mode cannot be read as
// text, or returns "" for a regular file.
func notRegular(path string, mode fs.FileMode, refusal string) string {
	what := "not a regular file"
	switch {
	case mode.IsRegular():
		return ""
	case mode.IsDir():
		return path + " is a directory; use list to see what is in it"
	case mode&fs.ModeNamedPipe != 0:
		what = "a named pipe (FIFO), not a regular file"
	case mode&fs.ModeSocket != 0:
		what = "a socket, not a regular file"
	case mode&fs.ModeDevice != 0:
		what = "a device, not a regular file"
	}
	return path + " is " + what + "; " + refusal
}

// looksBinary reports whether p, the start of a file, is not text: it has
// a NUL byte or is not valid UTF-8. A multi-byte sequence cut off at the
// end of p does not count unless atEOF says p is the whole file.
func looksBinary(p []byte, atEOF bool) bool {
	if bytes.IndexByte(p, 0) >= 0 {
		return true
	}
	for len(p) > 0 {
		r, n := utf8.DecodeRune(p)
		if r == utf8.RuneError && n == 1 {
			return atEOF || utf8.FullRune(p)
		}
		p = p[n:]
	}
	return false
}

// lineScan is what scanLines learns about a file.
type lineScan struct {
	// window is the start of the selected lines: all of them when whole,
	// else enough to decide the truncation (see cutHead).
	window []byte
	whole  bool
	// total is the number of lines in the file.
	total int
	// sum is the hexadecimal SHA-256 of the whole file.
	sum string
	// firstLen is the length in bytes of the first selected line, without
	// its '\n'.
	firstLen int64
	// windowLines counts the complete lines in window.
	windowLines int
}

// scanLines reads r to the end, counting its lines and keeping the start
// of the limit lines (all when limit is 0) that begin at line first. It
// holds at most a little more than the output limits in memory.
func scanLines(ctx context.Context, r *bufio.Reader, first, limit int) (lineScan, error) {
	s := lineScan{whole: true}
	var err error
	s.total, s.sum, err = scanText(ctx, r, func(chunk []byte, line int, _ bool) {
		if line >= first && (limit == 0 || line < first+limit) {
			s.collect(chunk)
		}
		if line == first {
			s.firstLen += lineLen(chunk)
		}
	})
	return s, err
}

// scanText reads r to the end in one pass and hands each piece of a line
// to visit, with the line's number and whether the piece starts it. A
// line comes in one piece unless it is longer than r's buffer. It returns
// the number of lines and the SHA-256 of all that was read.
func scanText(ctx context.Context, r *bufio.Reader, visit func(chunk []byte, line int, start bool)) (total int, sum string, err error) {
	h := sha256.New()
	line, atLineStart := 1, true // the line the next byte belongs to
	for n := 0; ; n++ {
		chunk, err := r.ReadSlice('\n')
		if len(chunk) > 0 {
			h.Write(chunk)
			visit(chunk, line, atLineStart)
			atLineStart = chunk[len(chunk)-1] == '\n'
			if atLineStart {
				line++
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return 0, "", err
		}
		if n%64 == 0 && ctx.Err() != nil {
			return 0, "", ctx.Err()
		}
	}
	total = line - 1
	if !atLineStart {
		total++
	}
	return total, hex.EncodeToString(h.Sum(nil)), nil
}

// lineLen is the length of chunk, a piece of a line, without its '\n'.
func lineLen(chunk []byte) int64 {
	if len(chunk) > 0 && chunk[len(chunk)-1] == '\n' {
		return int64(len(chunk) - 1)
	}
	return int64(len(chunk))
}

// collect appends chunk, a piece of a selected line, to the window while
// the window is within the output limits, and notes when it stops.
func (s *lineScan) collect(chunk []byte) {
	if !s.whole {
		return
	}
	room := truncMaxBytes + 1 - len(s.window)
	if room <= 0 || s.windowLines > truncMaxLines {
		s.whole = false
		return
	}
	if len(chunk) > room {
		chunk, s.whole = chunk[:room], false
	}
	s.window = append(s.window, chunk...)
	if chunk[len(chunk)-1] == '\n' {
		s.windowLines++
	}
}

// readText renders the selected lines of the file at path and the note
// that says how to continue.
func readText(path string, scan lineScan, first, limit int) string {
	selected := scan.total - first + 1
	if limit > 0 {
		selected = min(selected, limit)
	}
	tr := cutHead(string(scan.window), selected, scan.whole, defaultLimits())
	last := first + tr.OutputLines - 1
	var note string
	switch {
	case tr.FirstLineTooLong:
		return fmt.Sprintf("[Line %d is %s, exceeds 50KB limit. Use bash: sed -n '%dp' %s | head -c %d]",
			first, humanSize(scan.firstLen), first, shellQuote(path), truncMaxBytes)
	case tr.Truncated && tr.By == "lines":
		note = fmt.Sprintf("[Showing lines %d-%d of %d. Use offset=%d to continue.]", first, last, scan.total, last+1)
	case tr.Truncated:
		note = fmt.Sprintf("[Showing lines %d-%d of %d (50KB limit). Use offset=%d to continue.]", first, last, scan.total, last+1)
	case last < scan.total:
		note = fmt.Sprintf("[%d more lines in file. Use offset=%d to continue.]", scan.total-last, last+1)
	default:
		return tr.Content
	}
	return strings.TrimSuffix(tr.Content, "\n") + "\n\n" + note
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	safe := s != ""
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("_./@%+=:,-", c)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
