package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file reads the audit trail back for the admin-only audit tool.

// auditIn are the audit tool's filters.
type auditIn struct {
	Caller   string `json:"caller,omitempty" jsonschema:"only records whose caller sub, email or client_id contains this text (an API token's sub reads token NAME here)"`
	Host     string `json:"host,omitempty" jsonschema:"only records that name this host"`
	Tool     string `json:"tool,omitempty" jsonschema:"only records of this tool"`
	Decision string `json:"decision,omitempty" jsonschema:"allowed or denied"`
	Since    string `json:"since,omitempty" jsonschema:"only records at or after this time: RFC 3339, or a duration back from now such as 1h"`
	Until    string `json:"until,omitempty" jsonschema:"only records before this time: RFC 3339, or a duration back from now"`
	Limit    int    `json:"limit,omitempty" jsonschema:"how many of the newest matching records to return (default 50, at most 500)"`
	Receipt  string `json:"receipt,omitempty" jsonschema:"only records whose host receipt is verified, has a problem (invalid or missing: the result was refused), or none (no result came)"`
	Verify   bool   `json:"verify,omitempty" jsonschema:"check each returned record's host receipt again against the keys enrolled for its host (current and revoked), and read the whole trail's hash chain from its first record: report whether it is intact and name every gap or broken link"`
}

const descAudit = "Admin only. Read the audit trail: one record per tool call (time, caller, host, tool, argument summary, decision, outcome, duration, " +
	"and the host's own signed receipt of the result: verified, or its problem), and one per message a host refused (caller unverified). " +
	"Returns the newest matching records, oldest first; filter by caller, host, tool, decision and time (since/until: RFC 3339 or a duration such as 2h). " +
	"At most 500 records, and at most the 20000 newest records before until are searched. " +
	"verify: true also reads the whole trail's hash chain from its first record and names every gap or broken link."

const (
	defaultAuditLimit = 50
	maxAuditLimit     = 500
	// maxAuditScan bounds the records one query reads.
	maxAuditScan = 20000
)

// auditQuery is a parsed auditIn.
type auditQuery struct {
	caller, host, tool, decision, receipt string
	since, until                          time.Time
	limit                                 int
}

// Receipt filters of the audit tool.
const (
	receiptVerified = "verified"
	receiptProblem  = "problem"
	receiptNone     = "none"
)

func parseAuditQuery(in auditIn, now time.Time) (auditQuery, error) {
	q := auditQuery{caller: strings.ToLower(in.Caller), host: in.Host, tool: in.Tool, decision: in.Decision, receipt: in.Receipt, limit: in.Limit}
	if q.decision != "" && q.decision != decisionAllowed && q.decision != decisionDenied {
		return q, fmt.Errorf("decision %q: use allowed or denied", in.Decision)
	}
	switch q.receipt {
	case "", receiptVerified, receiptProblem, receiptNone:
	default:
		return q, fmt.Errorf("receipt %q: use verified, problem or none", in.Receipt)
	}
	switch {
	case q.limit < 0:
		return q, fmt.Errorf("limit %d: must be positive", in.Limit)
	case q.limit == 0:
		q.limit = defaultAuditLimit
	case q.limit > maxAuditLimit:
		q.limit = maxAuditLimit
	}
	var err error
	if q.since, err = parseWhen(in.Since, now); err != nil {
		return q, fmt.Errorf("since: %w", err)
	}
	if q.until, err = parseWhen(in.Until, now); err != nil {
		return q, fmt.Errorf("until: %w", err)
	}
	if !q.since.IsZero() && !q.until.IsZero() && !q.since.Before(q.until) {
		return q, fmt.Errorf("since (%s) is not before until (%s)", q.since.Format(time.RFC3339), q.until.Format(time.RFC3339))
	}
	return q, nil
}

// parseWhen reads an RFC 3339 time or a duration back from now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor a duration (90m, 24h)", s)
}

func (q *auditQuery) match(r *AuditRecord) bool {
	switch {
	case q.host != "" && !slices.Contains(r.Hosts, q.host),
		q.tool != "" && r.Tool != q.tool,
		q.decision != "" && r.Decision != q.decision,
		q.receipt != "" && receiptState(r.Receipt) != q.receipt,
		!q.since.IsZero() && r.Time.Before(q.since),
		!q.until.IsZero() && !r.Time.Before(q.until):
		return false
	case q.caller == "":
		return true
	}
	name := r.Caller.Subject
	if r.Caller.Kind == KindAPIToken {
		name = "token " + name // "token deploy" finds the API token only
	}
	for _, s := range []string{name, r.Caller.Email, r.Caller.ClientID} {
		if strings.Contains(strings.ToLower(s), q.caller) {
			return true
		}
	}
	return false
}

// auditPage is one query's answer.
type auditPage struct {
	Records []AuditRecord `json:"records"`
	// Scanned is how many records were read; Incomplete is set when older
	// records in the requested range were not read.
	Scanned    int  `json:"scanned"`
	Incomplete bool `json:"incomplete,omitempty"`
	// Unsealed counts the records shown whose seal does not hold.
	Unsealed int `json:"unsealed,omitempty"`
	// Chain is, with verify, the whole stream's chain read from its
	// first record.
	Chain *ChainReport `json:"chain,omitempty"`
}

// query reads the newest records matching q.
func (a *auditor) query(ctx context.Context, q auditQuery) (*auditPage, error) {
	// Records are stored asynchronously; include those of calls that
	// have already answered.
	sctx, scancel := context.WithTimeout(ctx, 2*jskv.Timeout)
	err := a.sync(sctx)
	scancel()
	if err != nil {
		return nil, fmt.Errorf("audit trail is behind: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	info, err := a.stream.Info(ictx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("audit stream: %w", err)
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	page := &auditPage{Records: []AuditRecord{}}
	if info.State.Msgs == 0 {
		return page, nil
	}
	end, start := last, first
	if !q.until.IsZero() {
		// A record carries its call's start time but is stored when the
		// call ends: calls that started before until may be stored up to
		// the longest call (plus queueing) later. match filters exactly.
		if end, err = a.firstAtOrAfter(ctx, first, last, q.until.Add(a.storeLag)); err != nil {
			return nil, err
		}
		end-- // the last record stored before that
	}
	if !q.since.IsZero() {
		if start, err = a.firstAtOrAfter(ctx, first, end, q.since); err != nil {
			return nil, err
		}
	}
	if end < start {
		return page, nil
	}
	if end-start+1 > maxAuditScan {
		start, page.Incomplete = end-maxAuditScan+1, true
	}
	return page, a.scan(ctx, start, end, q, page)
}

// firstAtOrAfter returns the first sequence in [lo, hi] stored at or after
// t, or hi+1 when there is none (a binary search; stream time only grows).
func (a *auditor) firstAtOrAfter(ctx context.Context, lo, hi uint64, t time.Time) (uint64, error) {
	for lo <= hi {
		mid := lo + (hi-lo)/2
		gctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		m, err := a.stream.GetMsg(gctx, mid)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound): // aged out meanwhile
			lo = mid + 1
		case err != nil:
			return 0, fmt.Errorf("audit stream: %w", err)
		case m.Time.Before(t):
			lo = mid + 1
		default:
			hi = mid - 1
		}
	}
	return lo, nil
}

// scan reads records start..end and keeps the newest q.limit that match.
func (a *auditor) scan(ctx context.Context, start, end uint64, q auditQuery, page *auditPage) error {
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	cons, err := a.stream.CreateConsumer(cctx, jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     protocol.AuditSubject(),
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("audit stream: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
		defer cancel()
		_ = a.stream.DeleteConsumer(dctx, cons.CachedInfo().Name)
	}()
	for done := false; !done && ctx.Err() == nil; {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			return fmt.Errorf("audit stream: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			if meta.Sequence.Stream > end {
				done = true
				continue
			}
			page.Scanned++
			a.keep(meta.Sequence.Stream, m.Data(), m.Headers(), q, page)
			done = done || meta.Sequence.Stream == end
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("audit stream: %w", err)
		}
		done = done || n == 0
	}
	return ctx.Err()
}

// keep adds the record data, stored at seq with headers hdr, to page
// when it matches q.
func (a *auditor) keep(seq uint64, data []byte, hdr nats.Header, q auditQuery, page *auditPage) {
	var r AuditRecord
	if err := json.Unmarshal(data, &r); err != nil || !q.match(&r) {
		return
	}
	r.Seq = seq
	r.Unsealed = a.seal != nil && !a.sealHolds(r.CallID, data, hdr)
	page.Records = append(page.Records, r)
	if len(page.Records) > q.limit {
		page.Records = page.Records[1:]
	}
}

// auditTool is the admin-only audit tool; the access check is done by the
// call guard before it runs.
func (g *Gateway) auditTool(ctx context.Context, req *mcp.CallToolRequest, in auditIn) (*mcp.CallToolResult, any, error) {
	q, err := parseAuditQuery(in, time.Now())
	if err != nil {
		return errorResult("audit: " + err.Error()), nil, nil
	}
	page, err := g.audit.query(ctx, q)
	if err != nil {
		return errorResult("audit: " + err.Error()), nil, nil
	}
	if in.Verify {
		for i := range page.Records {
			g.recheckReceipt(&page.Records[i])
		}
		rep, err := g.audit.verifyChain(ctx)
		if err != nil {
			return errorResult("audit: verify the chain: " + err.Error()), nil, nil
		}
		page.Chain = &rep
	}
	for _, r := range page.Records {
		if r.Unsealed {
			page.Unsealed++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d records (searched %d)", len(page.Records), page.Scanned)
	if page.Unsealed > 0 {
		fmt.Fprintf(&b, "; %d of them UNSEALED: no gateway of this fleet stored them as they read (forged by another user of the fleet's NATS account, changed, or written by a gateway older than sealed records)", page.Unsealed)
	}
	if page.Incomplete {
		b.WriteString("; older records in this range were not searched: narrow it with until")
	}
	if page.Chain != nil {
		b.WriteString("\n")
		b.WriteString(page.Chain.summary())
	}
	for i := range page.Records {
		b.WriteString("\n")
		b.WriteString(page.Records[i].line())
	}
	res := textResult(b.String())
	res.StructuredContent = page
	return res, nil, nil
}

// line formats a record for the audit tool's text.
func (r *AuditRecord) line() string {
	var b strings.Builder
	who := r.Caller.Subject
	switch {
	case r.Caller.Kind == KindAPIToken:
		// As Identity.Name: the API token deploy is not the identity
		// provider's user "deploy".
		who = "token " + r.Caller.Subject
	case r.Caller.Email != "":
		who = r.Caller.Email
	}
	fmt.Fprintf(&b, "%s\t%s\t%s", r.Time.UTC().Format(time.RFC3339), who, r.Tool)
	// One column for where the call went, whatever it was, so the
	// columns after it stay in place.
	where := strings.Join(r.Hosts, ",")
	if r.Target != "" {
		where = strings.TrimSpace(where + " target " + r.Target)
	}
	fmt.Fprintf(&b, "\t%s", cmp.Or(where, "-"))
	fmt.Fprintf(&b, "\t%s", r.Decision)
	if r.Rule != "" {
		fmt.Fprintf(&b, " (%s)", r.Rule)
	}
	fmt.Fprintf(&b, "\t%s", r.Outcome)
	if r.ExitCode != nil {
		fmt.Fprintf(&b, " exit %d", *r.ExitCode)
	}
	fmt.Fprintf(&b, "\t%dms", r.DurationMS)
	if r.Unsealed {
		b.WriteString("\tUNSEALED")
	}
	if rc := r.Receipt; rc != nil {
		switch {
		case rc.Problem != "":
			fmt.Fprintf(&b, "\treceipt INVALID: %s", rc.Problem)
		default:
			fmt.Fprintf(&b, "\treceipt verified (%s", rc.Outcome)
			if rc.ExitCode != nil {
				fmt.Fprintf(&b, " exit %d", *rc.ExitCode)
			}
			fmt.Fprintf(&b, ", %d bytes sha256:%.12s…, by %.10s…)", rc.ResultBytes, rc.ResultSHA256, rc.Key)
		}
		if rc.Recheck != "" {
			fmt.Fprintf(&b, "; checked again: %s", rc.Recheck)
		}
	}
	if args, err := json.Marshal(r.Args); err == nil && len(r.Args) > 0 {
		fmt.Fprintf(&b, "\t%s", args)
	}
	return b.String()
}

// receiptState classifies a record's receipt for the receipt filter.
func receiptState(rc *AuditReceipt) string {
	switch {
	case rc == nil:
		return receiptNone
	case rc.Verified && rc.Problem == "":
		return receiptVerified
	}
	return receiptProblem
}

// recheckReceipt checks a record's receipt again, against the keys the
// gateway enrolled for its host (its current key and those revoked since:
// a receipt stays the host's word after its key is replaced), and says
// the outcome in Recheck.
func (g *Gateway) recheckReceipt(r *AuditRecord) {
	rc := r.Receipt
	if rc == nil {
		return
	}
	if rc.Key == "" {
		rc.Recheck = "no receipt to check"
		return
	}
	host := rc.Host
	if len(r.Hosts) != 1 || r.Hosts[0] != host {
		rc.Recheck = fmt.Sprintf("FAILED: the receipt is for host %s, the record for %s", host, strings.Join(r.Hosts, ","))
		return
	}
	if rc.CallID != r.CallID {
		rc.Recheck = fmt.Sprintf("FAILED: the receipt is for call %s, the record for %s", rc.CallID, r.CallID)
		return
	}
	rec, ok := g.agentIndex.Record(host)
	if !ok {
		rc.Recheck = "FAILED: no agent record of host " + host
		return
	}
	keys := []string{rec.PublicKey}
	for _, k := range rec.RevokedKeys {
		keys = append(keys, k.PublicKey)
	}
	if !slices.Contains(keys, rc.Key) {
		rc.Recheck = fmt.Sprintf("FAILED: signed by %s, a key never enrolled for %s", rc.Key, host)
		return
	}
	if err := rc.Receipt.Verify(rc.Key); err != nil {
		rc.Recheck = "FAILED: " + err.Error()
		return
	}
	rc.Recheck = "signature valid, by the key enrolled for " + host
	if rc.Key != rec.PublicKey {
		rc.Recheck += " before its current one"
	}
}

// sealHolds reports whether the record data of callID, stored with
// headers hdr, carries a seal of this fleet's gateways: over its chain
// link and data when chained, over its data alone when stored before
// chaining.
func (a *auditor) sealHolds(callID string, data []byte, hdr nats.Header) bool {
	seal := hdr.Get(auditSealHeader)
	if prev := hdr.Get(auditPrevHeader); prev != "" {
		return a.seal.holds(sealAuditChained, callID, chainSealInput(prev, data), seal)
	}
	return a.seal.holds(sealAudit, callID, data, seal)
}

// maxChainScan bounds the records one chain verification reads.
const maxChainScan = 2_000_000

// verifyChain reads the whole stream from its first record and checks
// its chain (auditchain.go).
func (a *auditor) verifyChain(ctx context.Context) (ChainReport, error) {
	sctx, scancel := context.WithTimeout(ctx, 2*jskv.Timeout)
	err := a.sync(sctx)
	scancel()
	if err != nil {
		return ChainReport{}, fmt.Errorf("audit trail is behind: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	info, err := a.stream.Info(ictx)
	cancel()
	if err != nil {
		return ChainReport{}, fmt.Errorf("audit stream: %w", err)
	}
	v := newChainVerifier(a.seal, a.retention, serverTime(info))
	if info.State.Msgs == 0 {
		return v.finish(0), nil
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	cons, err := a.stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.AuditSubject()}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: first,
	})
	cancel()
	if err != nil {
		return ChainReport{}, fmt.Errorf("audit stream: %w", err)
	}
	for read := 0; ctx.Err() == nil; {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			return ChainReport{}, fmt.Errorf("audit stream: %w", err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			meta, err := m.Metadata()
			if err != nil || meta.Sequence.Stream > last {
				done = true
				continue
			}
			n++
			read++
			h := m.Headers()
			v.add(chainMsg{Seq: meta.Sequence.Stream, Time: meta.Timestamp, Prev: h.Get(auditPrevHeader), Seal: h.Get(auditSealHeader), Data: m.Data()})
			done = done || meta.Sequence.Stream == last || meta.NumPending == 0
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return ChainReport{}, fmt.Errorf("audit stream: %w", err)
		}
		if read >= maxChainScan {
			v.rep.Incomplete = true
			return v.finish(0), nil
		}
		if done {
			return v.finish(last), nil
		}
		if n == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	return ChainReport{}, fmt.Errorf("audit stream: %w", ctx.Err())
}
