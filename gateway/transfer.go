package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/semaphore"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// This file bounds the memory that large transfers — a write of a big
// file, a read of one with binary_base64 — take in the gateway at once,
// and keeps each from costing more than it must.
//
// A large request (over largeTransfer) is admitted only when its size fits
// in the transfer budget (Config.MaxTransferBytes), waiting at most
// Config.TransferWait for room and otherwise answered "busy". Its body is
// read once, into a buffer of its exact size; when it is a call of a
// per-host tool, the MCP SDK is handed the request with every long string
// of the arguments cut (shrinkArgs), so that it decodes, validates and
// copies only a few kilobytes, and the tool call finds the arguments in
// full, a part of that buffer, through the request's state; the router
// streams them to the agent in parts. A large result takes room from the
// budget as its parts arrive (see waiter.reserve), or waits for room for
// all of it with its parts left with the agent, which keeps results, and
// fetches them once there is; it holds its room until the response
// carrying it is written.

// largeTransfer is the size from which a request or a result counts as a
// large transfer.
const largeTransfer = 1 << 20

// stateHeader carries, inside the gateway only, the ID of a POST's
// requestState.
const stateHeader = "X-Fleet-Transfer"

// transfers is the gateway's budget for large transfers.
type transfers struct {
	sem  *semaphore.Weighted
	max  int64
	wait time.Duration
	// inUse counts the bytes taken from the budget.
	inUse atomic.Int64

	mu       sync.Mutex
	next     uint64
	requests map[string]*requestState
}

// requestState is what the tool call of one POST finds of its transfer:
// its arguments in full when they were shrunk, and what its results hold
// of the budget until the POST is answered.
type requestState struct {
	args *callArgs
	hold transferHold
}

func newTransfers(max int64, wait time.Duration) *transfers {
	return &transfers{sem: semaphore.NewWeighted(max), max: max, wait: wait, requests: make(map[string]*requestState)}
}

// acquire takes n bytes from the budget, waiting while ctx lasts.
func (t *transfers) acquire(ctx context.Context, n int64) error {
	if err := t.sem.Acquire(ctx, n); err != nil {
		return err
	}
	t.inUse.Add(n)
	return nil
}

// tryAcquire takes n bytes from the budget if there is room now.
func (t *transfers) tryAcquire(n int64) bool {
	if !t.sem.TryAcquire(n) {
		return false
	}
	t.inUse.Add(n)
	return true
}

func (t *transfers) release(n int64) {
	t.inUse.Add(-n)
	t.sem.Release(n)
}

// busy says why a transfer of n bytes found no room within the wait.
func (t *transfers) busy(what string, n int64) string {
	return fmt.Sprintf("the gateway is busy: %s of %.1f MiB did not fit within %s in its budget for large transfers (%.1f of %d MiB in use; --max_transfer_mib, --transfer_wait). Retry shortly.",
		what, float64(n)/(1<<20), t.wait, float64(t.inUse.Load())/(1<<20), t.max>>20)
}

// begin registers a POST's state until end.
func (t *transfers) begin(rs *requestState) string {
	rs.hold.t = t
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	id := strconv.FormatUint(t.next, 36)
	t.requests[id] = rs
	return id
}

// end forgets a POST's state and gives back what its results held.
func (t *transfers) end(id string, rs *requestState) {
	t.mu.Lock()
	delete(t.requests, id)
	t.mu.Unlock()
	rs.hold.close()
}

// stateOf returns the state of the POST that carried req (nil when there
// is none: a call that did not come over HTTP).
func (t *transfers) stateOf(req *mcp.CallToolRequest) *requestState {
	if t == nil || req.Extra == nil || req.Extra.Header == nil {
		return nil
	}
	id := req.Extra.Header.Get(stateHeader)
	if id == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.requests[id]
}

// admit serves a POST to the MCP endpoint through next, as the file
// comment says. maxBody is the largest request body allowed.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request, next http.Handler, maxBody int64) {
	r.Header.Del(stateHeader) // only the gateway sets it
	if r.Method != http.MethodPost {
		next.ServeHTTP(w, r)
		return
	}
	t := g.calling.transfers
	var rs requestState
	id := t.begin(&rs)
	r.Header.Set(stateHeader, id)
	large := r.ContentLength < 0 || r.ContentLength > largeTransfer
	var admitted int64
	defer func() {
		if large || rs.hold.held() > 0 {
			// The transfer's buffers are garbage once it is answered:
			// collect them before its room goes to the next large
			// transfer, or the process would grow by the garbage of
			// those before it.
			runtime.GC()
		}
		t.end(id, &rs)
		if admitted > 0 {
			t.release(admitted)
		}
	}()
	if !large {
		next.ServeHTTP(w, r)
		return
	}
	n := r.ContentLength
	if n < 0 || n > maxBody {
		n = maxBody // unknown: as large as it may be; larger: refused below
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.wait)
	err := t.acquire(ctx, n)
	cancel()
	if err != nil {
		g.refuseBusy(w, r, n)
		return
	}
	admitted = n
	body, err := readBody(r, maxBody)
	if err != nil {
		http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	if small, args := shrinkRequest(body); args != nil {
		rs.args = args
		body = small
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	next.ServeHTTP(w, r)
	r.Body = http.NoBody // so that the collection above can free it
}

// readBody reads a request's body whole: into a buffer of its size when it
// says its size, and never more than max bytes.
func readBody(r *http.Request, max int64) ([]byte, error) {
	defer r.Body.Close()
	tooLarge := fmt.Errorf("request body larger than %d bytes", max)
	if n := r.ContentLength; n >= 0 {
		if n > max {
			return nil, tooLarge
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, fmt.Errorf("read request body: %w", err)
		}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read request body: %w", err)
	case int64(len(body)) > max:
		return nil, tooLarge
	}
	return body, nil
}

// shrinkRequest returns body, a JSON-RPC message, with the arguments of a
// per-host tool call shrunk (shrinkArgs), and those arguments; or body and
// nil when it is anything else.
func shrinkRequest(body []byte) ([]byte, *callArgs) {
	msg, err := jsonMembers(body)
	if err != nil || stringMember(body, msg, "method") != "tools/call" {
		return body, nil
	}
	p, ok := msg["params"]
	if !ok {
		return body, nil
	}
	params, err := jsonMembers(body[p.start:p.end])
	if err != nil || !perHostTool(stringMember(body[p.start:p.end], params, "name")) {
		return body, nil
	}
	a, ok := params["arguments"]
	if !ok {
		return body, nil
	}
	start, end := p.start+a.start, p.start+a.end
	args := shrinkArgs(body[start:end])
	small := make([]byte, 0, len(body)-(end-start)+len(args.small))
	small = append(append(append(small, body[:start]...), args.small...), body[end:]...)
	return small, args
}

// stringMember returns the member key of the object data (whose members
// are m) when it is a string.
func stringMember(data []byte, m map[string]span, key string) string {
	sp, ok := m[key]
	if !ok || sp.end < 0 {
		return ""
	}
	var s string
	if json.Unmarshal(data[sp.start:sp.end], &s) != nil {
		return ""
	}
	return s
}

// refuseBusy answers a large request for which the budget had no room:
// as a JSON-RPC response when the start of its body names its ID (a tool
// call gets a tool error, which the model reads), otherwise with 503.
func (g *Gateway) refuseBusy(w http.ResponseWriter, r *http.Request, n int64) {
	msg := g.calling.transfers.busy("this request", n)
	head := make([]byte, 64<<10)
	k, _ := io.ReadFull(r.Body, head)
	head = head[:k]
	members, _ := jsonMembers(head) // cut short: what precedes the cut
	method := stringMember(head, members, "method")
	tool := ""
	if p, ok := members["params"]; ok {
		end := p.end
		if end < 0 {
			end = len(head) // the arguments go beyond what was read
		}
		if params, _ := jsonMembers(head[p.start:end]); params != nil {
			tool = stringMember(head[p.start:end], params, "name")
		}
	}
	g.calling.agentLogs.Log(g.log, slog.LevelWarn, "transfers", "refused a large request: the transfer budget is full",
		"bytes", n, "budget", g.calling.transfers.max, "in_use", g.calling.transfers.inUse.Load(), "method", method, "tool", tool)
	if method == "tools/call" {
		g.auditBusy(r, tool, n, msg)
	}
	id, ok := members["id"]
	if !ok || id.end < 0 {
		w.Header().Set("Retry-After", "5")
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	resp := map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(head[id.start:id.end])}
	if method == "tools/call" {
		resp["result"] = errorResult(msg)
	} else {
		resp["error"] = map[string]any{"code": -32000, "message": msg}
	}
	data, err := json.Marshal(resp)
	if err != nil {
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(data)
}

// auditBusy records a tool call refused because the transfer budget was
// full. Its arguments were never read: the record has their size only.
func (g *Gateway) auditBusy(r *http.Request, tool string, n int64, msg string) {
	rec := &audit.Record{Time: time.Now().UTC(), CallID: newCallID(), Tool: tool, BytesIn: int(n),
		Decision: audit.DecisionDenied, Reason: "gateway busy", Outcome: audit.OutcomeRefused, Error: msg}
	if id := g.identityOf(&mcp.RequestExtra{TokenInfo: auth.TokenInfoFromContext(r.Context())}); id != nil {
		rec.Caller = audit.Caller{Kind: string(id.Kind), Subject: id.Subject, Email: id.Email, ClientID: id.ClientID}
		rec.ProjectID = id.ProjectID
	}
	g.subsys.audit.Write(rec)
}

// transferHold is what a tool call's results hold of the transfer
// budget. Once closed (its POST was answered, or the call's client went
// away) it takes nothing more: adopt refuses, and the router gives back
// what it took when the call returns.
type transferHold struct {
	t      *transfers
	mu     sync.Mutex
	n      int64
	closed bool
}

// held returns what the hold has taken.
func (h *transferHold) held() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// adopt makes the hold keep n bytes taken from the budget; it reports
// false, keeping nothing, once the hold is closed.
func (h *transferHold) adopt(n int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.n += n
	return true
}

// close gives back what the hold keeps and returns how much that was.
func (h *transferHold) close() int64 {
	h.mu.Lock()
	n := h.n
	h.n, h.closed = 0, true
	h.mu.Unlock()
	if n > 0 && h.t != nil {
		h.t.release(n)
	}
	return n
}
