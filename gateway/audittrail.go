package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// This file is the gateway's side of the audit trail (gateway/audit):
// the seal it gives the trail's records, and the admin-only audit tool,
// a thin adapter over the trail's reader that checks receipts again
// against the keys the gateway enrolled.

// auditSeal seals the audit records with the record seal (recordseal.go):
// an unchained record's seal is of kind sealAudit, a chained one's of
// sealAuditChained.
type auditSeal struct{ s *recordSeal }

func (a auditSeal) kind(chained bool) sealKind {
	if chained {
		return sealAuditChained
	}
	return sealAudit
}

func (a auditSeal) Mark(chained bool, callID string, data []byte) string {
	return a.s.mark(a.kind(chained), callID, data)
}

func (a auditSeal) Holds(chained bool, callID string, data []byte, seal string) bool {
	return a.s.holds(a.kind(chained), callID, data, seal)
}

const descAudit = "Admin only. Read the audit trail: one record per tool call (time, caller, host, tool, argument summary, decision, outcome, duration, " +
	"and the host's own signed receipt of the result: verified, or its problem), and one per message a host refused (caller unverified). " +
	"Returns the newest matching records, oldest first; filter by caller, host, tool, decision and time (since/until: RFC 3339 or a duration such as 2h). " +
	"At most 500 records, and at most the 20000 newest records before until are searched. " +
	"verify: true also reads the whole trail's hash chain from its first record and names every gap or broken link."

// auditTool is the admin-only audit tool; the access check is done by the
// call guard before it runs.
func (g *Gateway) auditTool(ctx context.Context, req *mcp.CallToolRequest, in audit.Filter) (*mcp.CallToolResult, any, error) {
	q, err := audit.ParseQuery(in, time.Now())
	if err != nil {
		return errorResult("audit: " + err.Error()), nil, nil
	}
	page, err := g.subsys.audit.Query(ctx, q)
	if err != nil {
		return errorResult("audit: " + err.Error()), nil, nil
	}
	if in.Verify {
		for i := range page.Records {
			g.recheckReceipt(&page.Records[i])
		}
		rep, err := g.subsys.audit.VerifyChain(ctx)
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
		b.WriteString(page.Chain.Summary())
	}
	for i := range page.Records {
		b.WriteString("\n")
		b.WriteString(page.Records[i].Line())
	}
	res := textResult(b.String())
	res.StructuredContent = page
	return res, nil, nil
}

// recheckReceipt checks a record's receipt again, against the keys the
// gateway enrolled for its host (its current key and those revoked since:
// a receipt stays the host's word after its key is replaced), and says
// the outcome in Recheck.
func (g *Gateway) recheckReceipt(r *audit.Record) {
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
	rec, ok := g.subsys.agentIndex.Record(host)
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
