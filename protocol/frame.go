package protocol

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Header names carried on every fleet message that is not plain JSON.
const (
	HeaderCall = "Fleet-Call" // call ID
	HeaderKind = "Fleet-Kind" // FrameKind
	HeaderSeq  = "Fleet-Seq"  // per-call sequence number of the frame (0 on keepalives of a call still queued); for tracing, not read by the receivers
	HeaderPart = "Fleet-Part" // "i/n" for a message split into n parts
)

// ChunkSize is the largest body a fleet message carries. NATS servers
// default to a 1 MiB max_payload and may be configured lower, so everything
// bigger is split; 32 KiB keeps latency low and fits any sane server.
const ChunkSize = 32 << 10

// MaxParts bounds how many parts one message may be split into
// (MaxParts × ChunkSize = 256 MiB).
const MaxParts = 8192

// FrameKind says what a reply frame carries.
type FrameKind string

const (
	// KindOutput carries raw output bytes (bash stdout+stderr in arrival
	// order). It may be dropped under pressure.
	KindOutput FrameKind = "output"
	// KindProgress carries a human-readable progress note. It may be
	// dropped.
	KindProgress FrameKind = "progress"
	// KindKeepalive says the call is still running. It may be dropped.
	KindKeepalive FrameKind = "keepalive"
	// KindResult carries a part of an encoded Result (EncodeResult). The call is
	// finished when all parts have arrived; none may be missing.
	KindResult FrameKind = "result"
	// KindCall carries a part of a JSON-encoded Call (gateway to agent).
	KindCall FrameKind = "call"
)

// Frame is one message of a call's stream, in either direction.
type Frame struct {
	Kind   FrameKind
	CallID string
	Seq    uint64
	// Part and Parts are set on KindResult and KindCall frames: this is
	// part Part (1-based) of Parts.
	Part, Parts int
	// Auth is the signed envelope (HeaderAuth) of a call's first part;
	// Receipt the receipt (HeaderReceipt) of a result's last part.
	Auth, Receipt string
	Data          []byte
}

// Header is a NATS message header (nats.Header has this underlying type).
type Header = map[string][]string

// Encode returns the header and body that carry f.
func (f Frame) Encode() (Header, []byte) {
	h := Header{
		HeaderKind: {string(f.Kind)},
		HeaderCall: {f.CallID},
		HeaderSeq:  {strconv.FormatUint(f.Seq, 10)},
	}
	if f.Parts > 0 {
		h[HeaderPart] = []string{strconv.Itoa(f.Part) + "/" + strconv.Itoa(f.Parts)}
	}
	if f.Auth != "" {
		h[HeaderAuth] = []string{f.Auth}
	}
	if f.Receipt != "" {
		h[HeaderReceipt] = []string{f.Receipt}
	}
	return h, f.Data
}

// ErrNotFrame reports a message without fleet frame headers.
var ErrNotFrame = errors.New("not a fleet frame: missing " + HeaderKind + " header")

// DecodeFrame parses a message produced by Frame.Encode. It checks
// everything a peer could get wrong and never panics.
func DecodeFrame(h Header, body []byte) (Frame, error) {
	var f Frame
	kind := first(h, HeaderKind)
	if kind == "" {
		return f, ErrNotFrame
	}
	f.Kind = FrameKind(kind)
	switch f.Kind {
	case KindOutput, KindProgress, KindKeepalive, KindResult, KindCall:
	default:
		return f, fmt.Errorf("frame kind %q is not one of output, progress, keepalive, result, call", kind)
	}
	f.CallID = first(h, HeaderCall)
	if err := ValidateCallID(f.CallID); err != nil {
		return f, err
	}
	seq, err := strconv.ParseUint(first(h, HeaderSeq), 10, 64)
	if err != nil {
		return f, fmt.Errorf("frame %s of call %s: bad %s header: %w", kind, f.CallID, HeaderSeq, err)
	}
	f.Seq = seq
	if p := first(h, HeaderPart); p != "" {
		f.Part, f.Parts, err = parsePart(p)
		if err != nil {
			return f, fmt.Errorf("frame %s of call %s: %w", kind, f.CallID, err)
		}
	} else if f.Kind == KindResult || f.Kind == KindCall {
		return f, fmt.Errorf("frame %s of call %s has no %s header", kind, f.CallID, HeaderPart)
	}
	f.Auth, f.Receipt = first(h, HeaderAuth), first(h, HeaderReceipt)
	f.Data = body
	return f, nil
}

func parsePart(p string) (part, parts int, err error) {
	a, b, ok := strings.Cut(p, "/")
	if !ok {
		return 0, 0, fmt.Errorf("bad %s header %q: want i/n", HeaderPart, p)
	}
	part, err1 := strconv.Atoi(a)
	parts, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || parts < 1 || parts > MaxParts || part < 1 || part > parts {
		return 0, 0, fmt.Errorf("bad %s header %q: want i/n with 1 <= i <= n <= %d", HeaderPart, p, MaxParts)
	}
	return part, parts, nil
}

func first(h Header, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Split cuts data into parts of at most size bytes; empty data is one empty
// part. It returns an error when more than MaxParts would be needed.
func Split(data []byte, size int) ([][]byte, error) {
	if size <= 0 {
		size = ChunkSize
	}
	n := (len(data) + size - 1) / size
	if n == 0 {
		n = 1
	}
	if n > MaxParts {
		return nil, fmt.Errorf("message of %d bytes needs %d parts of %d bytes; at most %d are allowed", len(data), n, size, MaxParts)
	}
	parts := make([][]byte, 0, n)
	for len(data) > size {
		parts = append(parts, data[:size:size])
		data = data[size:]
	}
	return append(parts, data), nil
}

// MaxCallIDLen bounds call IDs.
const MaxCallIDLen = 64

// ValidateCallID checks a call ID received from a peer: 1 to 64 characters
// of letters, digits, '-' and '_'.
func ValidateCallID(id string) error {
	if id == "" || len(id) > MaxCallIDLen {
		return fmt.Errorf("call id %q must be 1 to %d characters", id, MaxCallIDLen)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("call id %q has %q: only letters, digits, '-' and '_' are allowed", id, string(c))
		}
	}
	return nil
}

// Assembly collects the parts of one split message in order. Parts must
// arrive in order (NATS keeps order per publisher); a gap or a change in
// the part count is an error, after which the message is lost and must be
// fetched or sent again.
type Assembly struct {
	parts int
	next  int
	buf   []byte
	limit int
}

// NewAssembly returns an Assembly that refuses messages larger than limit
// bytes (0: no limit beyond MaxParts).
func NewAssembly(limit int) *Assembly { return &Assembly{limit: limit, next: 1} }

// Add appends f's data. It returns true when the last part has arrived.
func (a *Assembly) Add(f Frame) (done bool, err error) {
	if a.parts == 0 {
		a.parts = f.Parts
	}
	if f.Parts != a.parts {
		return false, fmt.Errorf("call %s: part count changed from %d to %d", f.CallID, a.parts, f.Parts)
	}
	if f.Part != a.next {
		return false, fmt.Errorf("call %s: got part %d of %d, expected part %d (a part was lost)", f.CallID, f.Part, f.Parts, a.next)
	}
	if a.limit > 0 && len(a.buf)+len(f.Data) > a.limit {
		return false, fmt.Errorf("call %s: message exceeds %d bytes", f.CallID, a.limit)
	}
	a.buf = append(a.buf, f.Data...)
	a.next++
	return a.next > a.parts, nil
}

// Grow makes room for n more bytes at least, so that a message whose size
// the caller knows (and has allowed for) is not copied as it grows.
func (a *Assembly) Grow(n int) {
	if n > cap(a.buf)-len(a.buf) {
		a.buf = append(make([]byte, 0, len(a.buf)+n), a.buf...)
	}
}

// Bytes returns the assembled message.
func (a *Assembly) Bytes() []byte { return a.buf }
