package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file chains the audit records. Each record a gateway stores names
// its predecessor in the stream, in the auditPrevHeader: the
// predecessor's stream sequence, its digest (chainDigest: over its
// sequence, its own link, its seal and its data) and when it was stored,
// by the NATS server's clock (serverClock).
// The record's seal covers that link, so no one without the sealing key
// can move a record or change what it follows. The gateways store a record
// only right after the one it names: each publish expects the stream's
// last sequence to be the predecessor's (and, inside a group, the last
// message ID to be the previous record's), so two replicas writing at
// once never chain to the same record; the one that loses re-reads the
// stream's last record and chains again.
//
// Reading the chain from the stream's first record (chainVerifier) then
// proves the trail: a record removed, changed, or put out of place breaks
// a link, and the break names the sequences. Records stored before the
// gateways chained them carry no link and are counted as such, not as
// breaks. A stream that begins with a record whose predecessor is gone
// before retention could have removed it was cut at its head.

// auditPrevHeader carries a record's link to its predecessor.
const auditPrevHeader = "Fleet-Audit-Prev"

// chainLink names a stored message: its stream sequence, its digest
// ("" when unknown: not in the stream any more) and when it was stored
// (zero when unknown). The zero link is the start of a chain.
type chainLink struct {
	seq    uint64
	digest string
	time   time.Time
}

// header encodes l for auditPrevHeader: "<seq> <digest or -> <unix nanoseconds or ->".
func (l chainLink) header() string {
	d, t := "-", "-"
	if l.digest != "" {
		d = l.digest
	}
	if !l.time.IsZero() {
		t = strconv.FormatInt(l.time.UnixNano(), 10)
	}
	return fmt.Sprintf("%d %s %s", l.seq, d, t)
}

// parseChainLink reads an auditPrevHeader.
func parseChainLink(s string) (chainLink, error) {
	f := strings.Split(s, " ")
	if len(f) != 3 {
		return chainLink{}, fmt.Errorf("chain link %.80q: want three fields, \"<seq> <sha256 hex or -> <unix ns or ->\"", s)
	}
	seq, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return chainLink{}, fmt.Errorf("chain link %.80q: sequence: %w", s, err)
	}
	l := chainLink{seq: seq}
	if f[1] != "-" {
		if b, err := hex.DecodeString(f[1]); err != nil || len(b) != sha256.Size {
			return chainLink{}, fmt.Errorf("chain link %.80q: digest is not 64 hex digits", s)
		}
		l.digest = f[1]
	}
	if f[2] != "-" {
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || ns <= 0 {
			return chainLink{}, fmt.Errorf("chain link %.80q: time is not positive Unix nanoseconds", s)
		}
		l.time = time.Unix(0, ns)
	}
	if seq == 0 && (l.digest != "" || !l.time.IsZero()) {
		return chainLink{}, fmt.Errorf("chain link %.80q: sequence 0 (the start of the chain) names no digest or time", s)
	}
	return l, nil
}

// chainDigest is the digest of the message stored at seq with the link
// prev (its auditPrevHeader, "" for none), the seal seal and data.
func chainDigest(seq uint64, prev, seal string, data []byte) string {
	h := sha256.New()
	fmt.Fprintf(h, "fleetmcp audit chain v1\x00%d\x00%s\x00%s\x00", seq, prev, seal)
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// chainSealInput is what a chained record's seal covers: its link and
// its data.
func chainSealInput(prev string, data []byte) []byte {
	return append(append([]byte(prev), '\n'), data...)
}

// chainMsg is one message of the audit stream as the verifier reads it.
type chainMsg struct {
	Seq        uint64
	Time       time.Time
	Prev, Seal string // headers ("": absent)
	Data       []byte
}

// ChainProblem is one break in the audit chain.
type ChainProblem struct {
	// Seq is where it shows: the first record after it, or the record
	// itself.
	Seq uint64 `json:"seq"`
	// Kind: missing (sequences not in the stream), head_missing (the
	// stream's first records removed before retention could), broken_link
	// (a record names another predecessor than the one before it: a record
	// changed, replaced or out of place), unsealed (no gateway stored it as
	// it reads), unchained (no link after chaining began: not written by a
	// chaining gateway), bad_link (an unreadable link).
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// ChainGap is a gap record: what a gateway found lost, and when.
type ChainGap struct {
	Seq    uint64 `json:"seq"`
	Detail string `json:"detail"`
}

// ChainReport is the outcome of reading the whole chain.
type ChainReport struct {
	// Intact is set when no record is missing, changed or out of place
	// from First to Last.
	Intact  bool   `json:"intact"`
	First   uint64 `json:"first_seq,omitempty"`
	Last    uint64 `json:"last_seq,omitempty"`
	Records int    `json:"records"`
	// Chained records carry a link; Unchained ones were stored before the
	// gateways chained records (older gateways), and cannot be proved.
	Chained   int `json:"chained"`
	Unchained int `json:"unchained,omitempty"`
	// AgedOut is set when the first record's predecessor was removed by
	// retention, as it should be.
	AgedOut  bool           `json:"aged_out,omitempty"`
	Problems []ChainProblem `json:"problems,omitempty"`
	// Gaps are the gap records the gateways stored on finding the stream
	// damaged.
	Gaps []ChainGap `json:"gaps,omitempty"`
	// Incomplete: the stream holds more records than were read.
	Incomplete bool `json:"incomplete,omitempty"`
}

// maxChainProblems bounds the problems one report lists.
const maxChainProblems = 100

// chainVerifier reads the chain one message at a time, in stream order.
type chainVerifier struct {
	seal      Sealer // nil: seals are not checked
	retention time.Duration
	now       time.Time

	last    *chainLink // the message read last
	chained bool       // a chained record was read
	rep     ChainReport
	dropped int // problems beyond maxChainProblems
}

func newChainVerifier(seal Sealer, retention time.Duration, now time.Time) *chainVerifier {
	return &chainVerifier{seal: seal, retention: retention, now: now}
}

func (v *chainVerifier) problem(seq uint64, kind, format string, args ...any) {
	if len(v.rep.Problems) >= maxChainProblems {
		v.dropped++
		return
	}
	v.rep.Problems = append(v.rep.Problems, ChainProblem{Seq: seq, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

// add reads the next message.
func (v *chainVerifier) add(m chainMsg) {
	v.rep.Records++
	if v.rep.First == 0 {
		v.rep.First = m.Seq
	}
	v.rep.Last = m.Seq
	if v.last != nil && m.Seq != v.last.seq+1 {
		v.problem(m.Seq, "missing", "sequences %s are not in the stream: records deleted", seqRange(v.last.seq+1, m.Seq-1))
	}
	var rec Record
	_ = json.Unmarshal(m.Data, &rec)
	v.checkLink(m, rec.CallID)
	if rec.Tool == auditGapTool {
		// The gateways found records lost here: the trail is not whole,
		// whatever the links say.
		v.rep.Gaps = append(v.rep.Gaps, ChainGap{Seq: m.Seq, Detail: rec.Reason})
		v.problem(m.Seq, "recorded_gap", "a gateway recorded lost records: %s", rec.Reason)
	}
	v.last = &chainLink{seq: m.Seq, digest: chainDigest(m.Seq, m.Prev, m.Seal, m.Data), time: m.Time}
}

// checkLink checks m's link and seal.
func (v *chainVerifier) checkLink(m chainMsg, callID string) {
	if m.Prev == "" {
		if v.chained {
			v.problem(m.Seq, "unchained", "seq %d carries no chain link, after chaining began: no chaining gateway stored it", m.Seq)
		} else {
			v.rep.Unchained++
		}
		if v.seal != nil && !v.seal.Holds(false, callID, m.Data, m.Seal) {
			v.problem(m.Seq, "unsealed", "seq %d: its seal does not hold: no gateway of this fleet stored it as it reads", m.Seq)
		}
		return
	}
	v.chained = true
	v.rep.Chained++
	if v.seal != nil && !v.seal.Holds(true, callID, chainSealInput(m.Prev, m.Data), m.Seal) {
		v.problem(m.Seq, "unsealed", "seq %d: its seal does not hold: no gateway of this fleet stored it as it reads (changed, or forged)", m.Seq)
	}
	l, err := parseChainLink(m.Prev)
	switch {
	case err != nil:
		v.problem(m.Seq, "bad_link", "seq %d: %v", m.Seq, err)
	case v.last == nil:
		v.checkHead(m, l)
	case l.seq != v.last.seq:
		v.problem(m.Seq, "broken_link", "seq %d names seq %d as its predecessor, but the record before it is seq %d: records removed or out of place", m.Seq, l.seq, v.last.seq)
	case l.digest != v.last.digest:
		v.problem(m.Seq, "broken_link", "seq %d names seq %d with digest %.16s…, but seq %d reads as %.16s…: seq %d was changed or replaced", m.Seq, l.seq, l.digest, l.seq, v.last.digest, l.seq)
	}
}

// checkHead checks the link of the stream's first record, l: the start
// of the chain, or a predecessor that retention may have removed.
func (v *chainVerifier) checkHead(m chainMsg, l chainLink) {
	switch {
	case l.seq == 0:
		return
	case !l.time.IsZero() && !linkTime(l, m.Time).Add(v.retention).After(v.now):
		v.rep.AgedOut = true
	case l.time.IsZero():
		v.problem(m.Seq, "head_missing", "the first record, seq %d, follows seq %d, which is not in the stream (when it was stored is not known): sequences up to %d were removed", m.Seq, l.seq, l.seq)
	default:
		v.problem(m.Seq, "head_missing", "the first record, seq %d, follows seq %d, stored %s, which retention (%s) would have kept until %s: sequences up to %d were removed",
			m.Seq, l.seq, l.time.UTC().Format(time.RFC3339), v.retention, l.time.Add(v.retention).UTC().Format(time.RFC3339), l.seq)
	}
}

// finish returns the report, given the stream's last sequence (0: not
// known) to find records removed at its tail.
func (v *chainVerifier) finish(streamLast uint64) ChainReport {
	if v.last != nil && streamLast > v.last.seq {
		v.problem(streamLast, "missing", "sequences %s are not in the stream: records deleted", seqRange(v.last.seq+1, streamLast))
	}
	if v.dropped > 0 {
		v.rep.Problems = append(v.rep.Problems, ChainProblem{Kind: "more", Detail: fmt.Sprintf("%d more problems not listed", v.dropped)})
	}
	v.rep.Intact = len(v.rep.Problems) == 0 && !v.rep.Incomplete
	return v.rep
}

func seqRange(from, to uint64) string {
	if from == to {
		return strconv.FormatUint(from, 10)
	}
	return fmt.Sprintf("%d-%d", from, to)
}

// summary says the report in a line.
func (r *ChainReport) Summary() string {
	var b strings.Builder
	switch {
	case r.Records == 0:
		b.WriteString("chain: the stream holds no records")
	case r.Intact:
		fmt.Fprintf(&b, "chain: INTACT from seq %d to %d (%d records, %d chained", r.First, r.Last, r.Records, r.Chained)
	default:
		fmt.Fprintf(&b, "chain: BROKEN between seq %d and %d (%d records, %d chained", r.First, r.Last, r.Records, r.Chained)
	}
	if r.Records > 0 {
		if r.Unchained > 0 {
			fmt.Fprintf(&b, ", %d stored before chaining and not provable", r.Unchained)
		}
		b.WriteString(")")
	}
	if r.AgedOut {
		b.WriteString("; the records before it aged out under retention")
	}
	if r.Incomplete {
		b.WriteString("; not read to its end")
	}
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "\n  %s at seq %d: %s", p.Kind, p.Seq, p.Detail)
	}
	return b.String()
}

// chainTail returns the stream's last message as a link, reading it from
// the stream when the writer does not know it.
func (a *Trail) chainTail() (chainLink, error) {
	a.tailMu.Lock()
	defer a.tailMu.Unlock()
	if a.tailOK {
		return a.tail, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
	defer cancel()
	l, err := readChainTail(ctx, a.stream)
	if err != nil {
		return chainLink{}, err
	}
	a.tail, a.tailOK = l, true
	return l, nil
}

// readChainTail reads the last message of stream as a link.
func readChainTail(ctx context.Context, stream jetstream.Stream) (chainLink, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return chainLink{}, fmt.Errorf("read the audit chain's last record: %w", err)
	}
	st := info.State
	if st.LastSeq == 0 {
		return chainLink{}, nil
	}
	l := chainLink{seq: st.LastSeq, time: st.LastTime}
	if st.Msgs == 0 {
		return l, nil // aged out: it names the sequence and time only
	}
	m, err := stream.GetMsg(ctx, st.LastSeq)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return l, nil
	case err != nil:
		return chainLink{}, fmt.Errorf("read the audit chain's last record: %w", err)
	}
	l.time = m.Time
	l.digest = chainDigest(m.Sequence, m.Header.Get(auditPrevHeader), m.Header.Get(auditSealHeader), m.Data)
	return l, nil
}

func (a *Trail) setTail(l chainLink) {
	a.tailMu.Lock()
	a.tail, a.tailOK = l, true
	a.tailMu.Unlock()
}

// forgetTail makes the writer read the tail from the stream again.
func (a *Trail) forgetTail() {
	a.tailMu.Lock()
	a.tailOK = false
	a.tailMu.Unlock()
}

// auditClockEvery is how often the writer reads the server's clock.
const auditClockEvery = 30 * time.Second

// serverClock tells the time by the NATS server's clock, which stamps
// the stored messages and ages them out: a chain link names when its
// predecessor was stored by that clock, so that a gateway whose own
// clock is off does not make the watchers and verify take a record that
// aged out for one removed early (or the other way round). Only the
// writer's goroutine uses it.
type serverClock struct {
	// local is this gateway's clock (nil: time.Now).
	local  func() time.Time
	offset time.Duration // the server's clock minus local
	read   time.Time     // when offset was read (local; zero: never)
}

func (c *serverClock) localNow() time.Time {
	if c.local != nil {
		return c.local()
	}
	return time.Now()
}

// serverNow returns the server's time now, reading the server's clock
// from stream's info at most every auditClockEvery; until it can, it
// goes by the local clock.
func (c *serverClock) serverNow(stream jetstream.Stream) time.Time {
	now := c.localNow()
	if c.read.IsZero() || now.Sub(c.read) > auditClockEvery || now.Before(c.read) {
		c.read = now
		ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
		info, err := stream.Info(ctx)
		cancel()
		after := c.localNow()
		if err == nil && !info.TimeStamp.IsZero() {
			c.offset = info.TimeStamp.Sub(now.Add(after.Sub(now) / 2))
		}
		now = after
	}
	return now.Add(c.offset)
}

// linkTime is when l's predecessor was stored, as a link read from a
// message stored at stored says: never after stored, as a predecessor is
// stored before its successor (a link written by a gateway whose clock
// ran ahead, before links went by the server's clock, says later).
func linkTime(l chainLink, stored time.Time) time.Time {
	if !stored.IsZero() && l.time.After(stored) {
		return stored
	}
	return l.time
}

// serverTime returns the server's time in info, or the local time when
// the server did not say.
func serverTime(info *jetstream.StreamInfo) time.Time {
	if info != nil && !info.TimeStamp.IsZero() {
		return info.TimeStamp
	}
	return time.Now()
}
