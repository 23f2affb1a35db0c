package gateway

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Tool inputs. The gateway uses them for the schemas and to read "host";
// the agent receives the caller's arguments as they are and decodes them
// itself.

type hostsIn struct {
	Filter string `json:"filter,omitempty" jsonschema:"optional host selector: a name glob (web-*), a label match (role=web, env!=prod, region in (eu,us)), or several joined by commas, all of which must hold"`
}

type readIn struct {
	Host   string `json:"host" jsonschema:"the host to read on (see hosts)"`
	Path   string `json:"path" jsonschema:"file path; relative paths resolve against the host's working directory"`
	Offset int    `json:"offset,omitempty" jsonschema:"first line to read, 1-based"`
	Limit  int    `json:"limit,omitempty" jsonschema:"maximum number of lines to read"`
	// BinaryBase64 skips the text and image handling altogether.
	BinaryBase64 bool   `json:"binary_base64,omitempty" jsonschema:"return the file's raw bytes base64-encoded, unprocessed, whatever the file is (up to 20 MB unless the host sets otherwise)"`
	Anchor       string `json:"anchor,omitempty" jsonschema:"instead of offset/limit: exact text that occurs exactly once in the file (may span lines; \\n also matches \\r\\n, at most 4 KiB); shows the lines around it"`
	// An int: the agent tells a missing context (default 10) from 0.
	Context int `json:"context,omitempty" jsonschema:"with anchor: lines to show before and after it (default 10, at most 500)"`
}

type writeIn struct {
	Host           string `json:"host" jsonschema:"the host to write on"`
	Path           string `json:"path" jsonschema:"file path; parent directories are created"`
	Content        string `json:"content" jsonschema:"the complete new file content"`
	Overwrite      bool   `json:"overwrite,omitempty" jsonschema:"default true; false: only create the file, and fail if it exists"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"replace the file only if its current sha256 (from read) is this; otherwise nothing is written"`
}

type editOp struct {
	OldString  string `json:"old_string" jsonschema:"exact text to replace; must match exactly once unless replace_all"`
	NewString  string `json:"new_string" jsonschema:"replacement text"`
	ReplaceAll bool   `json:"replace_all,omitempty" jsonschema:"replace every occurrence"`
}

type editIn struct {
	Host           string   `json:"host" jsonschema:"the host to edit on"`
	Path           string   `json:"path" jsonschema:"file path"`
	Edits          []editOp `json:"edits" jsonschema:"edits applied in order, each to the result of the previous"`
	ExpectedSHA256 string   `json:"expected_sha256,omitempty" jsonschema:"edit only if the file's current sha256 (from read or a previous edit) is this; otherwise nothing changes"`
}

type bashIn struct {
	Host       string  `json:"host" jsonschema:"the host to run on"`
	Command    string  `json:"command" jsonschema:"the command line in the host's shell (see hosts): bash on Linux and macOS, a PowerShell script on Windows"`
	Timeout    float64 `json:"timeout,omitempty" jsonschema:"seconds before the command is killed with its process group: default 120, at most 600; with background, default 3600, at most 86400 (host defaults; a host may configure others)"`
	Background bool    `json:"background,omitempty" jsonschema:"start the command as a background task and return its task_id at once; follow it with task_status"`
	Cwd        string  `json:"cwd,omitempty" jsonschema:"directory to run in (default: the host's working directory; relative paths resolve there); it must be a directory the host's policy lets the tools read; at most 4096 bytes"`
	// Parameters are passed on as JSON; the agent checks them too.
	Parameters map[string]any `json:"parameters,omitempty" jsonschema:"PowerShell hosts only: named script parameters, bound by name to the script's param() block as values (never pasted into the script text): at most 64, names of letters, digits and _, values any JSON, 1 MiB in all"`
}

type skillIn struct {
	Host string `json:"host" jsonschema:"the host that has the skill (see hosts or resource://skills)"`
	Name string `json:"name" jsonschema:"the skill's name, as listed in resource://skills"`
}

const (
	descHosts = "List the fleet's hosts you may use: name, online/offline, last seen, OS/arch, agent version, working directory, shell (the language bash commands are written in: bash, sh, pwsh 7.x, powershell 5.1), labels, the tools the host serves and its policy digest. " +
		"Every other tool takes one of these names as host. Optional filter, a host selector: a name glob (web-*), a label match (role=web, env!=prod, region in (eu,us)), or several joined by commas, all of which must hold (role=web,env=prod)."
	descRead = "Read a text file on a host. Output is truncated to 2000 lines or 50KB, whichever comes first; " +
		"when more remains a note says which offset to continue from. Use offset (1-based line) and limit for large files, " +
		"or anchor (text that occurs once) to see the lines around it. " +
		"The structured result has the whole file's sha256 (for expected_sha256 in write and edit), path and total_lines; " +
		"an anchored read also anchor_line and start_line. " +
		"Images (PNG, JPEG, GIF, WebP, BMP, TIFF; told by content, not name) come back as images: scaled to at most 2000 px and 4.5 MB unless the host sets otherwise, " +
		"turned upright per EXIF, with a note giving the original size and how to map coordinates. Other binary files are refused unless binary_base64 is set."
	descWrite = "Write a file on a host, replacing it if it exists. Creates parent directories. " +
		"The write is atomic (temporary file, then rename); an existing file keeps its permissions. " +
		"expected_sha256 replaces only the version you read; overwrite false only creates. The structured result has the new sha256."
	descEdit = "Edit a file on a host by exact string replacement. Each old_string must match exactly once (or set replace_all); " +
		"edits apply in order. If any edit fails nothing is written and the error names the edit. Prefer this over write for changes to existing files. " +
		"CRLF line endings and a UTF-8 BOM are kept: \\n in old_string matches \\r\\n, and line breaks in new_string take the ending of the line where the replaced text starts. " +
		"expected_sha256 edits only the version you read. The structured result has the new sha256."
	descSkill = "Load a skill's instructions on a host (from hosts or resource://skills): the SKILL.md text plus the paths of its bundled files, which read can fetch."
	descBash  = "Run a command on a host, in the host's working directory or cwd, stdin closed. Returns stdout and stderr merged. " +
		"The language is the host's shell, shown by hosts: bash (or sh) on Linux and macOS, PowerShell on Windows (pwsh, else Windows PowerShell 5.1; no profile, UTF-8 output). " +
		"On PowerShell hosts, parameters passes named values to a script that declares them with param(...), e.g. command \"param($Path) Get-Item $Path\" with parameters {\"Path\": \"C:\\\\data\"}; exit N sets the exit code. " +
		"Output is truncated to the last 2000 lines or 50KB; the full output (its first 100 MiB unless the host sets otherwise) is then saved to a file on the host (path given, readable with read; kept 7 days). " +
		"A non-zero exit or a timeout is an error. Default timeout 120 s, at most 600 s unless the host allows more. " +
		"The command is killed with its whole process group (on Windows its Job Object) on timeout or cancel; background processes it started may keep running. " +
		"For long jobs set background: true: the call returns at once with a task_id, the command runs on as a task that survives restarts of the agent and the gateway, " +
		"its output goes to a file on the host (readable with read; a task writing more than 100 MiB is killed), and task_status waits for it. " +
		"Background tasks: default timeout 1 h, at most 24 h; at most 8 run at once per host and 32 more wait to start, beyond that the call fails as busy (host defaults)."
)

func (g *Gateway) addTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: toolHosts, Description: descHosts, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.hostsTool)
	mcp.AddTool(s, &mcp.Tool{Name: toolAudit, Description: descAudit, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.auditTool)
	mcp.AddTool(s, &mcp.Tool{Name: "read", Description: descRead, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in readIn) (*mcp.CallToolResult, any, error) {
			callFrom(ctx).rawData = in.BinaryBase64
			return g.forward(ctx, req, in.Host, "read", g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "write", Description: descWrite},
		func(ctx context.Context, req *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "write", g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "edit", Description: descEdit},
		func(ctx context.Context, req *mcp.CallToolRequest, in editIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "edit", g.cfg.FileCallTimeout), nil, nil
		})
	g.addPatchTool(s)
	mcp.AddTool(s, &mcp.Tool{Name: toolSkill, Description: descSkill, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in skillIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, toolSkill, g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "bash", Description: descBash},
		func(ctx context.Context, req *mcp.CallToolRequest, in bashIn) (*mcp.CallToolResult, any, error) {
			if r := checkBashIn(in); r != nil {
				return r, nil, nil
			}
			if in.Background {
				callFrom(ctx).background = true
				return g.forward(ctx, req, in.Host, "bash", g.cfg.FileCallTimeout), nil, nil
			}
			// The agent enforces the command's own timeout; the call's
			// budget only bounds a host that never answers at all.
			return g.forward(ctx, req, in.Host, "bash", g.cfg.MaxCallDuration), nil, nil
		})
	g.addTaskTools(s)
	g.addFileTools(s)
	g.addFanoutTools(s)
	g.addSkillTools(s)
}

// checkBashIn refuses bash arguments every agent would refuse, before
// they travel; the agent checks them again.
func checkBashIn(in bashIn) *mcp.CallToolResult {
	if len(in.Cwd) > protocol.MaxCwdBytes {
		return errorResult(fmt.Sprintf("bash: cwd is longer than %d bytes", protocol.MaxCwdBytes))
	}
	params := make(map[string]json.RawMessage, len(in.Parameters))
	for k, v := range in.Parameters {
		data, err := json.Marshal(v)
		if err != nil {
			return errorResult(fmt.Sprintf("bash: parameter %q: %v", k, err))
		}
		params[k] = data
	}
	if err := protocol.ValidateScriptParameters(params); err != nil {
		return errorResult("bash: " + err.Error())
	}
	return nil
}

// forward sends a per-host tool call to its agent and converts the answer.
func (g *Gateway) forward(ctx context.Context, req *mcp.CallToolRequest, host, tool string, timeout time.Duration) *mcp.CallToolResult {
	cc := callFrom(ctx)
	if cc.id == nil {
		return errorResult(tool + " not permitted for an unauthenticated caller")
	}
	ctx, stop := g.requests.bind(ctx, req)
	defer stop()
	p := newProgress(ctx, req, g.cfg.ProgressIdle)
	args := req.Params.Arguments
	if cc.args != nil {
		args = cc.args.raw // req carries them shrunk (guard)
		// The access rules were applied to the host the guard read; the
		// call goes there or nowhere (arguments that name a host twice
		// may be read either way).
		if hostArg(cc.args.small) != host {
			return errorResult(fmt.Sprintf("%s: the arguments name the host more than once; give host once", tool))
		}
	}
	receipt := &AuditReceipt{}
	res, err := g.router.call(ctx, callRequest{
		ID: cc.callID, Host: host, Tool: tool, Caller: cc.id.Caller(), Args: args, Timeout: timeout, Hold: cc.hold, Receipt: receipt,
	}, p.onFrame)
	if receipt.Verified || receipt.Problem != "" {
		cc.receipt = receipt
	}
	if err != nil {
		cc.outcome = failureOutcome(err)
		return callError(tool, host, err)
	}
	if capResult(host, tool, res, protocol.ResultTextLimit(tool, cc.rawData)) {
		g.agentLogs.log(g.log, slog.LevelWarn, host, "cut a result larger than its tool's limits", "host", host, "tool", tool, "call", cc.callID)
	}
	if res.Error != nil && res.Error.Code == protocol.CodeDenied {
		cc.hostDenied = res.Error.Message
	}
	return toolResult(host, res)
}

// failureOutcome classifies a routing failure for the audit trail.
func failureOutcome(err error) string {
	var he *HostError
	switch {
	case errors.Is(err, context.Canceled):
		return outcomeCancelled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &he) && he.Kind == HostTimeout:
		return outcomeTimedOut
	}
	return outcomeError
}

func (g *Gateway) hostsTool(ctx context.Context, req *mcp.CallToolRequest, in hostsIn) (*mcp.CallToolResult, any, error) {
	if in.Filter != "" {
		if _, err := policy.ParseSelector(in.Filter); err != nil {
			return errorResult("filter: " + err.Error()), nil, nil
		}
	}
	grants := callFrom(ctx).grants
	hosts := slices.DeleteFunc(g.reg.list(in.Filter), func(h HostInfo) bool { return !grants.HostVisible(h.Host, h.Labels) })
	var b strings.Builder
	online := 0
	for _, h := range hosts {
		if h.Online {
			online++
		}
	}
	fmt.Fprintf(&b, "%d hosts, %d online", len(hosts), online)
	if in.Filter != "" {
		fmt.Fprintf(&b, " (filter %q)", in.Filter)
	}
	b.WriteString("\n")
	now := time.Now()
	for _, h := range hosts {
		state := "online"
		switch {
		case h.Revoked:
			state = "revoked"
		case !h.Online:
			state = "offline"
		}
		fmt.Fprintf(&b, "%s\t%s\t%s/%s\tagent %s\tlast seen %s ago\tcwd %s\tshell %s", h.Host, state, h.OS, h.Arch, h.AgentVersion,
			now.Sub(h.LastSeen).Round(time.Second), h.Cwd, cmp.Or(h.Shell, "unknown"))
		if labels := formatLabels(h.Labels); labels != "" {
			b.WriteString("\tlabels " + labels)
		}
		b.WriteString("\ttools " + strings.Join(h.Tools, ","))
		b.WriteString("\tpolicy " + policyLabel(h.PolicyDigest))
		if h.Conflict != "" {
			b.WriteString("\tconflict: " + h.Conflict)
		}
		b.WriteString("\n")
	}
	res := textResult(strings.TrimRight(b.String(), "\n"))
	for i := range hosts {
		hosts[i].PolicyDigest = policyName(hosts[i].PolicyDigest)
	}
	res.StructuredContent = map[string]any{"hosts": hosts}
	return res, nil, nil
}

// policyName is a host's policy digest in full, or "unrestricted" for a
// host without one, as structured results and resources show it.
func policyName(digest string) string { return cmp.Or(digest, "unrestricted") }

// policyLabel shortens a host policy digest for the hosts table (the
// structured output carries it whole); "unrestricted" when there is none.
func policyLabel(digest string) string {
	if digest == "" {
		return "unrestricted"
	}
	if len(digest) > len("sha256:")+16 {
		return digest[:len("sha256:")+16]
	}
	return digest
}

func formatLabels(l map[string]string) string {
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

// progress relays a call's live output, progress notes and keepalives to
// the client as progress notifications, when the client asked for them
// with a progress token. Whatever the agent sends, a call's notifications
// come at most one per protocol.ProgressInterval (ten a second), each with
// a message of at most protocol.MaxProgressBytes: output is coalesced
// into the latest MaxProgressBytes of it, a progress note replaces what
// is pending, and what arrives between two notifications waits for the
// next (the final result has the output in full). A silent call still
// yields one at least every Config.ProgressIdle, so clients with request
// timeouts keep waiting.
type progress struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any

	idle    time.Duration
	n       float64
	last    time.Time
	pending []byte // message not sent yet; dirty says whether there is one
	dirty   bool
	started time.Time
}

const progressEvery = protocol.ProgressInterval

func newProgress(ctx context.Context, req *mcp.CallToolRequest, idle time.Duration) *progress {
	p := &progress{ctx: ctx, session: req.Session, started: time.Now(), idle: idle}
	if req.Params != nil {
		p.token = req.Params.GetProgressToken()
	}
	return p
}

// onFrame is called only from the call's own goroutine.
func (p *progress) onFrame(f protocol.Frame) {
	if p.token == nil || p.session == nil {
		return
	}
	now := time.Now()
	switch f.Kind {
	case protocol.KindOutput:
		p.pending = append(p.pending, lastBytes(f.Data, protocol.MaxProgressBytes)...)
		if len(p.pending) > protocol.MaxProgressBytes {
			p.pending = append(p.pending[:0], lastBytes(p.pending, protocol.MaxProgressBytes)...)
		}
		p.dirty = true
	case protocol.KindProgress:
		p.pending = append(p.pending[:0], protocol.Clip(string(f.Data), protocol.MaxProgressBytes)...)
		p.dirty = true
	case protocol.KindKeepalive:
		if !p.dirty && now.Sub(p.last) >= p.idle {
			p.send(now, fmt.Sprintf("still running after %s", now.Sub(p.started).Round(time.Second)))
			return
		}
	default:
		return
	}
	if p.dirty && now.Sub(p.last) >= progressEvery {
		p.send(now, string(p.pending))
	}
}

func (p *progress) send(now time.Time, msg string) {
	p.pending, p.dirty = p.pending[:0], false
	p.last = now
	p.n++
	_ = p.session.NotifyProgress(p.ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: p.n, Message: msg})
}

// lastBytes returns the end of b, at most n bytes of it starting on a
// UTF-8 character boundary.
func lastBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	cut := len(b) - n
	for cut < len(b) && !utf8.RuneStart(b[cut]) {
		cut++
	}
	return b[cut:]
}
