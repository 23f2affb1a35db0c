package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file is fan-out: fleet_bash and fleet_read run one per-host tool
// (bash, read) on every host a selector picks and the caller may use,
// through the router, with a bounded pool of workers, and sort each host
// into one outcome bucket. fanoutrender.go turns the outcomes into one
// result within the output budget.
//
// Access is decided per host with the caller's grants, exactly as the
// per-host tools decide it: a host the caller may not see is simply not
// matched; a host it may see but where the rules refuse the tool counts
// as denied, as does a host whose own policy refuses the call.
//
// Audit: the fan-out call gets its own record (with its counts per
// bucket), and every host that was reached or refused gets one record of
// its own, as if its tool had been called alone, with Parent naming the
// fan-out; hosts never started get none.

const (
	toolFleetBash = protocol.ToolFleetBash
	toolFleetRead = protocol.ToolFleetRead

	// defaultFanoutConcurrency and maxFanoutConcurrency bound the hosts
	// called at once.
	defaultFanoutConcurrency = 50
	maxFanoutConcurrency     = 500
)

// Outcome buckets of one host in a fan-out.
const (
	bucketSucceeded  = "succeeded"
	bucketFailed     = "failed"
	bucketTimedOut   = "timed_out"
	bucketOffline    = "offline"
	bucketDenied     = "denied"
	bucketNotStarted = "not_started"
)

// buckets lists the buckets in the order the summary names them.
func buckets() []string {
	return []string{bucketSucceeded, bucketFailed, bucketTimedOut, bucketOffline, bucketDenied, bucketNotStarted}
}

type fleetBashIn struct {
	Selector       string  `json:"selector" jsonschema:"the hosts to run on: * for all, a name glob (web-*), a label (role=web), or several terms joined by commas that must all match (role=web,env=prod)"`
	Command        string  `json:"command" jsonschema:"bash command line, run on every selected host"`
	Timeout        float64 `json:"timeout,omitempty" jsonschema:"seconds each host's command may run before it is killed (default {{bash_timeout}}; capped by each host, {{bash_max_timeout}} unless configured)"`
	MaxConcurrency int     `json:"max_concurrency,omitempty" jsonschema:"hosts running the command at once (default 50, at most 500)"`
	MaxErrors      int     `json:"max_errors,omitempty" jsonschema:"stop starting hosts once this many have failed or timed out; the rest are reported as not_started (default: no limit)"`
}

type fleetReadIn struct {
	Selector       string `json:"selector" jsonschema:"the hosts to read on: * for all, a name glob (web-*), a label (role=web), or several terms joined by commas that must all match"`
	Path           string `json:"path" jsonschema:"file path; relative paths resolve against each host's working directory"`
	MaxConcurrency int    `json:"max_concurrency,omitempty" jsonschema:"hosts read at once (default 50, at most 500)"`
}

const (
	descFleetBash = "Run one bash command on every host a selector picks (that you may use), at most max_concurrency at once. " +
		"Returns a summary line with the hosts per outcome — succeeded, failed (non-zero exit), timed_out, offline, denied (host policy or access rules), not_started (after max_errors) — " +
		"then the hosts grouped by outcome, exit code and identical output, with each group's output tail. The whole text stays within {{output_bytes}}: " +
		"tails shrink as the host count grows; structuredContent lists every host with its outcome, exit code and, where the host saved it, the path of its full output file (readable with read). " +
		"Offline hosts are reported at once, not waited on."
	descFleetRead = "Read the same text file on every host a selector picks (that you may use). Returns each host's SHA-256 and groups the hosts by it " +
		"(\"3 distinct versions: a1b2… on 998 hosts, …\"), showing each distinct version's content once, within {{output_bytes}} in total; hosts that failed, are offline or denied are listed with the reason. " +
		"structuredContent has the versions and every host."
)

// addFanoutTools registers fleet_bash and fleet_read.
func (g *Gateway) addFanoutTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: toolFleetBash, Description: protocol.Describe(descFleetBash), InputSchema: mustInputSchema[fleetBashIn]()}, g.fleetBashTool)
	mcp.AddTool(s, &mcp.Tool{Name: toolFleetRead, Description: protocol.Describe(descFleetRead), InputSchema: mustInputSchema[fleetReadIn](),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.fleetReadTool)
}

// selectHosts returns the hosts selector picks, sorted by name. It is the
// one place fan-out reads the selector syntax and the registry.
func (g *Gateway) selectHosts(selector string) ([]HostInfo, error) {
	if _, err := policy.ParseSelector(selector); err != nil {
		return nil, err
	}
	return g.calling.reg.list(selector), nil
}

func (g *Gateway) fleetBashTool(ctx context.Context, req *mcp.CallToolRequest, in fleetBashIn) (*mcp.CallToolResult, any, error) {
	switch {
	case strings.TrimSpace(in.Command) == "":
		return errorResult("command is empty; give a shell command to run on every host"), nil, nil
	case in.Timeout < 0:
		return errorResult(fmt.Sprintf("timeout %v is negative; give seconds, or leave it out for the hosts' default", in.Timeout)), nil, nil
	case in.MaxErrors < 0:
		return errorResult(fmt.Sprintf("max_errors %d is negative; give a positive count, or leave it out for no limit", in.MaxErrors)), nil, nil
	}
	args := protocol.BashArgs{Command: in.Command}
	if in.Timeout > 0 {
		args.Timeout = &in.Timeout
	}
	f := &fanout{
		tool: toolFleetBash, base: protocol.ToolBash, maxErrors: in.MaxErrors,
		args: func(host string) (json.RawMessage, error) {
			a := args
			a.Host = host
			return json.Marshal(a)
		},
		// The agent enforces the command's own timeout; the call's
		// budget only bounds a host that never answers at all.
		timeout:  g.cfg.MaxCallDuration,
		classify: classifyBash,
	}
	return g.runFanout(ctx, req, f, in.Selector, in.MaxConcurrency, fmt.Sprintf("fleet_bash %q", textutil.Truncate(in.Command, 200)))
}

func (g *Gateway) fleetReadTool(ctx context.Context, req *mcp.CallToolRequest, in fleetReadIn) (*mcp.CallToolResult, any, error) {
	if in.Path == "" {
		return errorResult("path is empty; give the file to read on every host"), nil, nil
	}
	f := &fanout{
		tool: toolFleetRead, base: protocol.ToolRead,
		args: func(host string) (json.RawMessage, error) {
			return json.Marshal(protocol.ReadArgs{OnHost: protocol.OnHost{Host: host}, Path: in.Path})
		},
		timeout:  g.cfg.FileCallTimeout,
		classify: classifyRead,
	}
	return g.runFanout(ctx, req, f, in.Selector, in.MaxConcurrency, fmt.Sprintf("fleet_read %s", in.Path))
}

// runFanout checks the common arguments, selects the hosts, runs f on them
// and renders the result.
func (g *Gateway) runFanout(ctx context.Context, req *mcp.CallToolRequest, f *fanout, selector string, concurrency int, what string) (*mcp.CallToolResult, any, error) {
	cc := callFrom(ctx)
	if cc.id == nil {
		return errorResult(f.tool + " not permitted for an unauthenticated caller"), nil, nil
	}
	switch {
	case concurrency < 0:
		return errorResult(fmt.Sprintf("max_concurrency %d is negative; give 1 to %d, or leave it out for %d", concurrency, maxFanoutConcurrency, defaultFanoutConcurrency)), nil, nil
	case concurrency == 0:
		concurrency = defaultFanoutConcurrency
	}
	f.concurrency = min(concurrency, maxFanoutConcurrency)
	hosts, err := g.selectHosts(selector)
	if err != nil {
		return errorResult("selector: " + err.Error()), nil, nil
	}
	grants := cc.grants
	// Hosts the caller may not see are not matched at all, so the answer
	// tells nothing about them.
	hosts = slices.DeleteFunc(hosts, func(h HostInfo) bool { return !grants.HostVisible(h.Host, h.Labels) })
	if len(hosts) == 0 {
		return errorResult(fmt.Sprintf("selector %q matches none of the hosts you may use; call hosts to list them", selector)), nil, nil
	}
	ctx, stop := g.calling.requests.bind(ctx, req)
	defer stop()
	f.g, f.cc, f.caller = g, cc, cc.id.Caller()
	f.prog = newFanoutProgress(ctx, req, len(hosts))
	f.auditArgs = audit.ArgsSummary(req.Params.Arguments)
	start := time.Now()
	outcomes := f.run(ctx, hosts)
	res := renderFanout(f.tool, what, selector, outcomes, time.Since(start))
	cc.fanout = countBuckets(outcomes)
	return res, nil, nil
}

// hostOutcome is what became of one host in a fan-out.
type hostOutcome struct {
	Host   string `json:"host"`
	Status string `json:"status"`
	// ExitCode is a command's exit status, when it exited.
	ExitCode *int `json:"exit_code,omitempty"`
	// Reason says why a host did not succeed.
	Reason string `json:"reason,omitempty"`
	// SHA256 is a read file's hash, as its host reported it.
	SHA256 string `json:"sha256,omitempty"`
	// FullOutput is where the host saved a command's full output when its
	// result had to be cut.
	FullOutput string `json:"full_output,omitempty"`
	// Bytes is the size of the output or content the host returned.
	Bytes      int   `json:"bytes,omitempty"`
	DurationMS int64 `json:"duration_ms"`

	// note is the short form of the outcome that hosts are grouped by
	// ("exit 1", "offline"); body is the output or content the host
	// returned, without status lines.
	note string
	body string
	// receipt is the host's receipt of its result, as checked.
	receipt *audit.Receipt
}

// classifyFunc sorts a host's answer (or routing failure) into its
// outcome.
type classifyFunc func(o *hostOutcome, res *protocol.Result, err error)

// fanout is one fan-out call in progress.
type fanout struct {
	g           *Gateway
	cc          *callContext
	tool, base  string
	args        func(host string) (json.RawMessage, error)
	timeout     time.Duration
	concurrency int
	maxErrors   int
	classify    classifyFunc
	prog        *fanoutProgress
	auditArgs   map[string]any
	// caller is who every host's call is for.
	caller protocol.Caller
}

// run decides every host, calls those it may with at most f.concurrency
// at once, and returns the outcomes in the order of hosts.
func (f *fanout) run(ctx context.Context, hosts []HostInfo) []hostOutcome {
	out := make([]hostOutcome, len(hosts))
	todo := make([]int, 0, len(hosts))
	rules := make([]string, len(hosts)) // the rule that grants each host
	for i := range hosts {
		h := &hosts[i]
		o := &out[i]
		o.Host = h.Host
		dec := f.cc.grants.Tool(f.base, h.Host, h.Labels)
		switch {
		case !dec.Allowed:
			o.Status, o.note = bucketDenied, "denied by access rules"
			o.Reason = fmt.Sprintf("%s on %s not permitted for %s", f.base, h.Host, f.cc.id.Name())
			if dec.Rule != "" {
				o.Reason += " (refused by rule " + dec.Rule + ")"
			}
			f.audit(o, time.Now(), newCallID(), dec)
		case !h.Online:
			// Reported at once: an offline host is never waited on.
			o.Status, o.note = bucketOffline, bucketOffline
			o.Reason = fmt.Sprintf("offline: last seen %s ago", f.g.calling.reg.now().Sub(h.LastSeen).Round(time.Second))
			f.audit(o, time.Now(), newCallID(), dec)
		default:
			todo = append(todo, i)
			rules[i] = dec.Rule
			continue
		}
		f.prog.done(o.Status)
	}
	var next, failures atomic.Int64
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range min(f.concurrency, len(todo)) {
		wg.Go(func() {
			for {
				n := int(next.Add(1)) - 1
				if n >= len(todo) {
					return
				}
				o := &out[todo[n]]
				if stopped.Load() || ctx.Err() != nil {
					o.Status = bucketNotStarted
					o.note, o.Reason = f.notStarted(ctx)
					f.prog.done(o.Status)
					continue
				}
				f.callHost(ctx, o, rules[todo[n]])
				f.prog.done(o.Status)
				if o.Status == bucketFailed || o.Status == bucketTimedOut {
					if n := failures.Add(1); f.maxErrors > 0 && n >= int64(f.maxErrors) {
						stopped.Store(true)
					}
				}
			}
		})
	}
	wg.Wait()
	f.prog.finish()
	return out
}

// notStarted says why a host was not started: a short note and the
// reason.
func (f *fanout) notStarted(ctx context.Context) (string, string) {
	if ctx.Err() != nil {
		return "cancelled", "not started: the fan-out was cancelled"
	}
	return "max_errors reached", fmt.Sprintf("not started: %d hosts had failed or timed out (max_errors %d)", f.maxErrors, f.maxErrors)
}

// callHost calls the tool on one host, which rule grants, and records
// its outcome.
func (f *fanout) callHost(ctx context.Context, o *hostOutcome, rule string) {
	start := time.Now()
	id := newCallID()
	args, err := f.args(o.Host)
	var res *protocol.Result
	receipt := &audit.Receipt{}
	if err == nil {
		res, err = f.g.calling.router.call(ctx, callRequest{
			ID: id, Host: o.Host, Tool: f.base, Caller: f.caller, Args: args, Timeout: f.timeout, Receipt: receipt,
		}, nil)
	}
	if receipt.Verified || receipt.Problem != "" {
		o.receipt = receipt
	}
	if res != nil && capResult(o.Host, f.base, res, protocol.ResultTextLimit(f.base, false)) {
		f.g.calling.agentLogs.Log(f.g.log, slog.LevelWarn, o.Host, "cut a result larger than its tool's limits", "host", o.Host, "tool", f.base, "call", id)
	}
	o.DurationMS = time.Since(start).Milliseconds()
	f.classify(o, res, err)
	f.audit(o, start, id, access.AllowedBy(rule))
}

// classifyRouting sorts a routing failure; it reports whether err was one.
func classifyRouting(o *hostOutcome, err error) bool {
	if err == nil {
		return false
	}
	var he *HostError
	switch {
	case errors.As(err, &he) && (he.Kind == HostOffline || he.Kind == HostUnknown):
		o.Status, o.note, o.Reason = bucketOffline, bucketOffline, he.Msg
	case errors.As(err, &he) && he.Kind == HostRevoked:
		o.Status, o.note, o.Reason = bucketOffline, "revoked", he.Msg
	case errors.As(err, &he) && he.Kind == HostGone:
		o.Status, o.note, o.Reason = bucketOffline, "not connected", he.Msg
	case errors.As(err, &he) && he.Kind == HostTimeout:
		o.Status, o.note, o.Reason = bucketTimedOut, "no answer in time", he.Msg
	case errors.As(err, &he) && he.Kind == HostSilent:
		o.Status, o.note, o.Reason = bucketFailed, "went silent", he.Msg
	case errors.As(err, &he) && he.Kind == HostUntrusted:
		o.Status, o.note, o.Reason = bucketFailed, "cannot check signatures", he.Msg
	case errors.As(err, &he) && he.Kind == HostRefused:
		o.Status, o.note, o.Reason = bucketFailed, "refused by the host", he.Msg
	case errors.As(err, &he):
		o.Status, o.note, o.Reason = bucketFailed, "unreachable", he.Msg
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		o.Status, o.note, o.Reason = bucketFailed, "cancelled", "cancelled: the caller gave up"
	default:
		o.Status, o.note, o.Reason = bucketFailed, "error", err.Error()
	}
	return true
}

// noteHostPolicy is the note of a host whose own policy refused the call
// (its bucket already says "denied").
const noteHostPolicy = "by host policy"

// classifyAgentError sorts a result the agent could not produce at all;
// it reports whether res was one.
func classifyAgentError(o *hostOutcome, res *protocol.Result) bool {
	if res.Error == nil {
		return false
	}
	o.Reason = agentErrorText(o.Host, res.Error)
	switch res.Error.Code {
	case protocol.CodeDenied:
		o.Status, o.note = bucketDenied, noteHostPolicy
	case protocol.CodeBusy:
		o.Status, o.note = bucketFailed, "busy"
	default:
		o.Status, o.note = bucketFailed, string(res.Error.Code)
	}
	return true
}

// classifyBash sorts a bash result by its status line (the bash result
// contract ends a failed command's text with it).
func classifyBash(o *hostOutcome, res *protocol.Result, err error) {
	if classifyRouting(o, err) || classifyAgentError(o, res) {
		return
	}
	text := resultContentText(res)
	o.Bytes = len(text)
	body, status := splitStatus(text)
	body, o.FullOutput = splitSpillNote(body)
	o.body = body
	if !res.IsError {
		zero := 0
		o.Status, o.ExitCode, o.note = bucketSucceeded, &zero, "exit 0"
		return
	}
	o.Reason = status
	switch {
	case strings.HasPrefix(status, "Command exited with code "):
		if n, err := strconv.Atoi(strings.TrimPrefix(status, "Command exited with code ")); err == nil {
			o.ExitCode = &n
			o.Status, o.note = bucketFailed, "exit "+strconv.Itoa(n)
			return
		}
	case strings.HasPrefix(status, "Command timed out after "):
		o.Status, o.note = bucketTimedOut, status
		return
	}
	o.Status, o.note = bucketFailed, status
	if status == "" {
		o.note, o.Reason = "error", lastLine(text)
	}
}

// classifyRead sorts a read result and takes the file's SHA-256 from its
// structured content when the host reports one.
func classifyRead(o *hostOutcome, res *protocol.Result, err error) {
	if classifyRouting(o, err) || classifyAgentError(o, res) {
		return
	}
	text := resultContentText(res)
	o.Bytes = len(text)
	if res.IsError {
		o.Status, o.Reason = bucketFailed, text
		o.note = textutil.Truncate(oneLine(text), 300)
		return
	}
	o.Status, o.body = bucketSucceeded, text
	var s struct {
		SHA256 string `json:"sha256"`
	}
	if len(res.Structured) > 0 && json.Unmarshal(res.Structured, &s) == nil && isSHA256Hex(s.SHA256) {
		o.SHA256 = strings.ToLower(s.SHA256)
	}
}

func isSHA256Hex(s string) bool {
	return len(s) == 64 && strings.Trim(strings.ToLower(s), "0123456789abcdef") == ""
}

func resultContentText(res *protocol.Result) string {
	if len(res.Content) == 1 {
		return res.Content[0].Text
	}
	var b strings.Builder
	for _, c := range res.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// bashStatusPrefixes start the status line the bash tool ends a failed
// command's text with.
var bashStatusPrefixes = []string{"Command exited with code ", "Command timed out after ", "Command was killed by signal ", "Command cancelled"}

// splitStatus separates a bash result's status line from its output.
func splitStatus(text string) (body, status string) {
	i := strings.LastIndex(text, "\n\n")
	last := text[i+1:]
	if i < 0 {
		last = text
	}
	last = strings.TrimSpace(last)
	for _, p := range bashStatusPrefixes {
		if strings.HasPrefix(last, p) && !strings.Contains(last, "\n") {
			if i < 0 {
				return "", last
			}
			return text[:i], last
		}
	}
	return text, ""
}

// splitSpillNote separates the note the bash tool appends to truncated
// output ("[Showing lines X-Y of Z. Full output: PATH]") and returns the
// path of the full output file.
func splitSpillNote(body string) (string, string) {
	i := strings.LastIndex(body, "\n\n[Showing ")
	if i < 0 || !strings.HasSuffix(body, "]") {
		return body, ""
	}
	note := body[i+2:]
	_, path, ok := strings.Cut(note, "Full output: ")
	if !ok || strings.Contains(note, "\n") {
		return body, ""
	}
	return body[:i], strings.TrimSuffix(path, "]")
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return textutil.Truncate(s[strings.LastIndexByte(s, '\n')+1:], 300)
}

// audit records one host's part of the fan-out.
func (f *fanout) audit(o *hostOutcome, start time.Time, id string, dec access.Decision) {
	rec := &audit.Record{
		Time: start.UTC(), CallID: id, Tool: f.base, Hosts: []string{o.Host}, Args: f.auditArgs,
		Parent: f.cc.callID, DurationMS: o.DurationMS, BytesOut: o.Bytes, ExitCode: o.ExitCode,
		Decision: audit.DecisionAllowed, Rule: dec.Rule, Outcome: audit.OutcomeOK, Receipt: o.receipt,
	}
	if id := f.cc.id; id != nil {
		rec.Caller = audit.Caller{Kind: string(id.Kind), Subject: id.Subject, Email: id.Email, ClientID: id.ClientID}
		rec.ProjectID = id.ProjectID
	}
	switch o.Status {
	case bucketDenied:
		rec.Decision, rec.Outcome, rec.Reason = audit.DecisionDenied, audit.OutcomeRefused, o.Reason
		if o.note == noteHostPolicy {
			rec.Rule = "host policy"
		}
	case bucketTimedOut:
		rec.Outcome, rec.Error = audit.OutcomeTimedOut, o.Reason
	case bucketFailed, bucketOffline:
		rec.Outcome, rec.Error = audit.OutcomeError, audit.LastLine(o.Reason)
	}
	f.cc.recorded(f.g.subsys.audit.Write(rec))
}

// countBuckets counts outcomes per bucket.
func countBuckets(outcomes []hostOutcome) map[string]int {
	n := make(map[string]int, 6)
	for _, b := range buckets() {
		n[b] = 0
	}
	for i := range outcomes {
		n[outcomes[i].Status]++
	}
	return n
}

// fanoutProgress reports hosts done out of the total as progress
// notifications, when the client asked for them: at most one every
// progressEvery, and always the last.
type fanoutProgress struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any
	total   int

	mu     sync.Mutex
	n      int
	failed int
	last   time.Time

	sendMu sync.Mutex
	sent   int
}

func newFanoutProgress(ctx context.Context, req *mcp.CallToolRequest, total int) *fanoutProgress {
	p := &fanoutProgress{ctx: ctx, session: req.Session, total: total}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

func (p *fanoutProgress) done(status string) {
	p.mu.Lock()
	p.n++
	if status != bucketSucceeded {
		p.failed++
	}
	now := time.Now()
	due := now.Sub(p.last) >= progressEvery
	if due {
		p.last = now
	}
	n, failed := p.n, p.failed
	p.mu.Unlock()
	if due {
		p.notify(n, failed)
	}
}

func (p *fanoutProgress) finish() {
	p.mu.Lock()
	n, failed := p.n, p.failed
	p.mu.Unlock()
	p.notify(n, failed)
}

// notify sends a count, unless a later one was sent already. Workers do
// not wait for each other's notifications, only for sendMu.
func (p *fanoutProgress) notify(n, failed int) {
	if p.token == nil || p.session == nil {
		return
	}
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if n <= p.sent {
		return
	}
	p.sent = n
	msg := fmt.Sprintf("%d/%d hosts done", n, p.total)
	if failed > 0 {
		msg += fmt.Sprintf(" (%d did not succeed)", failed)
	}
	_ = p.session.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: float64(n), Total: float64(p.total), Message: msg})
}
