package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is skill rollout as MCP admin tools. skill_push reads a
// skill's folder from a host through that host's agent (list, then read
// of each file), as the caller could with those tools: the host's policy
// applies, and the caller's access rules must grant read and list there.

const (
	toolSkillPush    = protocol.ToolSkillPush
	toolSkillRollout = protocol.ToolSkillRollout
	toolSkillStatus  = protocol.ToolSkillStatus
	toolSkillControl = protocol.ToolSkillControl
)

type skillPushIn struct {
	Host string `json:"host" jsonschema:"the host whose folder holds the skill"`
	Path string `json:"path" jsonschema:"the skill's folder on that host (its SKILL.md at the top)"`
	Name string `json:"name,omitempty" jsonschema:"the skill's name (default: the folder's name); SKILL.md's name must equal it"`
}

type skillRolloutIn struct {
	Skill        string `json:"skill" jsonschema:"the skill to roll out (pushed with skill_push)"`
	BundleID     string `json:"bundle_id,omitempty" jsonschema:"the version (sha256:...); default the latest pushed"`
	Selector     string `json:"selector" jsonschema:"the hosts: a name glob (web-*), label matches (role=web, env!=prod), several joined by commas, or * for all"`
	Canary       *int   `json:"canary,omitempty" jsonschema:"how many online hosts install first, alone (default 1, 0 for none)"`
	Batch        string `json:"batch,omitempty" jsonschema:"hosts per batch after the canary: N or N% (default 25%)"`
	MaxErrors    int    `json:"max_errors,omitempty" jsonschema:"failed hosts tolerated before the rollout pauses (default 0)"`
	AutoRollback bool   `json:"auto_rollback,omitempty" jsonschema:"roll back instead of pausing when more than max_errors hosts fail"`
	BatchTimeout string `json:"batch_timeout,omitempty" jsonschema:"how long an online host may take to install before it counts as failed (default 10m)"`
	Remove       bool   `json:"remove,omitempty" jsonschema:"remove the skill from the selected hosts instead (one batch)"`
}

type skillStatusIn struct {
	Rollout string `json:"rollout,omitempty" jsonschema:"a rollout ID (r-...); empty: list the skills and the rollouts"`
	Hosts   bool   `json:"hosts,omitempty" jsonschema:"list every host's state (rollouts of up to 1000 hosts)"`
}

type skillControlIn struct {
	Rollout string `json:"rollout" jsonschema:"the rollout ID (r-...)"`
	Action  string `json:"action" jsonschema:"pause, resume or rollback"`
}

const (
	descSkillPush = "Admin only. Push a skill from a folder on a host into the gateway's skill store, as a new version (the same files again are the same version). " +
		"The folder must hold a SKILL.md whose frontmatter names the skill and describes it; regular files only (no links or devices), at most 512 files and 16 MiB; " +
		"files starting with #! are executable. Nothing reaches hosts until skill_rollout."
	descSkillRollout = "Admin only. Roll a pushed skill out to the hosts a selector picks: the canary first, then batches; a host that fails counts against max_errors " +
		"(more pause the rollout, or roll it back with auto_rollback); offline hosts install when they return. A new rollout of a skill supersedes a running one. " +
		"Follow it with skill_rollout_status."
	descSkillStatus  = "Admin only. A rollout's progress (hosts per state, failures with their reasons), or with no rollout the skills and rollouts there are."
	descSkillControl = "Admin only. Pause, resume or roll back a rollout. Resume forgives the failures so far; rollback sets every host it reached back to the version it had (removing the skill where it had none)."
)

func (g *Gateway) addSkillTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: toolSkillPush, Description: descSkillPush}, g.skillPushTool)
	mcp.AddTool(s, &mcp.Tool{Name: toolSkillRollout, Description: descSkillRollout}, g.skillRolloutTool)
	mcp.AddTool(s, &mcp.Tool{Name: toolSkillStatus, Description: descSkillStatus, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, g.skillStatusTool)
	mcp.AddTool(s, &mcp.Tool{Name: toolSkillControl, Description: descSkillControl}, g.skillControlTool)
}

// jsonToolResult is a tool result with v as text and structured content.
func jsonToolResult(summary string, v any) *mcp.CallToolResult {
	data, _ := json.MarshalIndent(v, "", "  ")
	res := textResult(summary + "\n" + string(data))
	var structured map[string]any
	if json.Unmarshal(data, &structured) == nil {
		res.StructuredContent = structured
	}
	return res
}

func (g *Gateway) skillPushTool(ctx context.Context, req *mcp.CallToolRequest, in skillPushIn) (*mcp.CallToolResult, any, error) {
	cc := callFrom(ctx)
	files, folder, err := g.readSkillFolder(ctx, cc, in.Host, in.Path)
	if err != nil {
		return errorResult("skill_push: " + err.Error()), nil, nil
	}
	name := in.Name
	if name == "" {
		name = folder
	}
	resp, err := g.pushSkill(ctx, name, files, cc.id.Caller().Subject)
	if err != nil {
		return errorResult("skill_push: " + err.Error()), nil, nil
	}
	what := "pushed as a new version"
	if !resp.Created {
		what = "already pushed (same files): the same version"
	}
	return jsonToolResult(fmt.Sprintf("skill %s from %s:%s %s", name, in.Host, in.Path, what), resp), nil, nil
}

// readSkillFolder reads a skill folder through a host's agent: its files
// (regular files only) and the folder's name.
func (g *Gateway) readSkillFolder(ctx context.Context, cc *callContext, host, dir string) ([]protocol.SkillPushFile, string, error) {
	if cc.id == nil {
		return nil, "", errors.New("no authenticated caller")
	}
	h, ok := g.calling.reg.get(host)
	if !ok {
		return nil, "", fmt.Errorf("unknown host %q (see hosts)", protocol.Clip(host, 64))
	}
	for _, tool := range []string{protocol.ToolList, protocol.ToolRead} {
		if d := cc.grants.Tool(tool, host, h.Labels); !d.Allowed {
			return nil, "", fmt.Errorf("reading the folder needs %s on %s: %s", tool, host, d.Reason)
		}
	}
	var l struct {
		Path    string `json:"path"`
		Entries []struct {
			Path, Type, Kind, Error string
			Size                    int64
		} `json:"entries"`
		Hidden, Unexpanded int
		Truncated          bool
		Crowded            []string
	}
	if err := g.hostCall(ctx, cc, host, protocol.ToolList, protocol.ListArgs{OnHost: protocol.OnHost{Host: host}, Path: dir, Depth: 10}, &l, nil); err != nil {
		return nil, "", err
	}
	switch {
	case l.Hidden > 0:
		return nil, "", fmt.Errorf("%d entries of %s are hidden by the host's policy; a bundle must be whole", l.Hidden, l.Path)
	case l.Truncated || len(l.Crowded) > 0 || len(l.Entries) > 4*protocol.MaxBundleFiles:
		return nil, "", fmt.Errorf("%s has too many entries for a skill (at most %d files)", l.Path, protocol.MaxBundleFiles)
	case l.Unexpanded > 0:
		return nil, "", fmt.Errorf("%s is nested deeper than 10 folders", l.Path)
	}
	var total int64
	var rels []string
	for _, e := range l.Entries {
		switch e.Type {
		case "dir":
			if e.Error != "" {
				return nil, "", fmt.Errorf("%s: %s", e.Path, e.Error)
			}
			continue
		case "file":
		case "symlink":
			return nil, "", fmt.Errorf("%s is a link; a skill bundle holds regular files only: copy the file into the folder", e.Path)
		default:
			what := e.Kind
			if what == "" {
				what = e.Type
			}
			return nil, "", fmt.Errorf("%s is a %s, not a regular file", e.Path, what)
		}
		if total += e.Size; total > protocol.MaxBundleBytes {
			return nil, "", fmt.Errorf("the folder holds more than %d MiB", protocol.MaxBundleBytes>>20)
		}
		rels = append(rels, e.Path)
	}
	if len(rels) > protocol.MaxBundleFiles {
		return nil, "", fmt.Errorf("the folder holds %d files; the limit is %d", len(rels), protocol.MaxBundleFiles)
	}
	sep := "/"
	if strings.Contains(l.Path, `\`) && !strings.Contains(l.Path, "/") {
		sep = `\`
	}
	files := make([]protocol.SkillPushFile, 0, len(rels))
	for _, rel := range rels {
		full := strings.TrimRight(l.Path, sep) + sep + strings.ReplaceAll(rel, "/", sep)
		var content []protocol.Content
		var info struct{ SHA256 string }
		if err := g.hostCall(ctx, cc, host, protocol.ToolRead, protocol.ReadArgs{OnHost: protocol.OnHost{Host: host}, Path: full, BinaryBase64: true}, &info, &content); err != nil {
			return nil, "", err
		}
		if len(content) < 2 {
			return nil, "", fmt.Errorf("%s: the host's read returned no content", rel)
		}
		data, err := base64.StdEncoding.DecodeString(content[1].Text)
		if err != nil || sha256Hex(data) != info.SHA256 {
			return nil, "", fmt.Errorf("%s: the host's read does not match its digest", rel)
		}
		mode := uint32(0o644)
		if strings.HasPrefix(string(data), "#!") {
			mode = 0o755
		}
		files = append(files, protocol.SkillPushFile{Path: rel, Mode: mode, Data: data})
	}
	base := l.Path[strings.LastIndexAny(strings.TrimRight(l.Path, `/\`), `/\`)+1:]
	return files, strings.TrimRight(base, `/\`), nil
}

// hostCall makes one tool call on host for the caller and decodes its
// structured result into out (and its content into content).
func (g *Gateway) hostCall(ctx context.Context, cc *callContext, host, tool string, args hostArgs, out any, content *[]protocol.Content) error {
	raw, _ := json.Marshal(args)
	res, err := g.calling.router.call(ctx, callRequest{Host: host, Tool: tool, Caller: cc.id.Caller(), Args: raw, Timeout: g.cfg.FileCallTimeout}, nil)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", tool, host, err)
	}
	switch {
	case res.Error != nil:
		return fmt.Errorf("%s on %s: %s", tool, host, res.Error.Message)
	case res.IsError:
		var text []string
		for _, c := range res.Content {
			text = append(text, c.Text)
		}
		return fmt.Errorf("%s on %s: %s", tool, host, protocol.Clip(strings.Join(text, " "), 500))
	}
	if content != nil {
		*content = res.Content
	}
	if err := json.Unmarshal(res.Structured, out); err != nil {
		return fmt.Errorf("%s on %s: unexpected answer: %w", tool, host, err)
	}
	return nil
}

func (g *Gateway) skillRolloutTool(ctx context.Context, req *mcp.CallToolRequest, in skillRolloutIn) (*mcp.CallToolResult, any, error) {
	rr := protocol.RolloutRequest{Skill: in.Skill, BundleID: in.BundleID, Selector: in.Selector, Canary: in.Canary, Batch: in.Batch,
		MaxErrors: in.MaxErrors, AutoRollback: in.AutoRollback, BatchTimeout: in.BatchTimeout}
	if in.Remove {
		none := 0
		rr.Canary, rr.Batch = &none, "100%"
	}
	info, err := g.startRollout(ctx, rr, in.Remove, callFrom(ctx).id.Caller().Subject)
	if err != nil {
		return errorResult("skill_rollout: " + err.Error()), nil, nil
	}
	return jsonToolResult(fmt.Sprintf("rollout %s of %s to %d hosts started (%d batches)", info.ID, info.Skill, info.Hosts, info.Batches), info), nil, nil
}

func (g *Gateway) skillStatusTool(ctx context.Context, req *mcp.CallToolRequest, in skillStatusIn) (*mcp.CallToolResult, any, error) {
	if in.Rollout == "" {
		skills, err := g.Skills(ctx)
		if err != nil {
			return errorResult("skill_rollout_status: " + err.Error()), nil, nil
		}
		rollouts, _ := g.Rollouts(ctx)
		return jsonToolResult(fmt.Sprintf("%d skills, %d rollouts", len(skills), len(rollouts)),
			map[string]any{"skills": nonNil(skills), "rollouts": nonNil(rollouts)}), nil, nil
	}
	info, err := g.RolloutStatus(ctx, in.Rollout, in.Hosts)
	if err != nil {
		return errorResult("skill_rollout_status: " + err.Error()), nil, nil
	}
	return jsonToolResult(rolloutSummary(info), info), nil, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// rolloutSummary is one line about a rollout.
func rolloutSummary(in protocol.RolloutInfo) string {
	s := fmt.Sprintf("rollout %s of %s: %s, batch %d of %d; %d hosts: %d installed, %d failed, %d refused, %d offline, %d pending",
		in.ID, in.Skill, in.State, min(in.CurrentBatch+1, in.Batches), in.Batches, in.Hosts, in.Counts[protocol.SkillInstalled]+in.Counts[protocol.SkillRemoved],
		in.Counts[protocol.SkillFailed], in.Counts[protocol.SkillRefused], in.Counts[protocol.RolloutHostOffline],
		in.Counts[protocol.SkillPending]+in.Counts[protocol.SkillInstalling]+in.Counts[protocol.RolloutHostWaiting])
	if n := in.Counts[protocol.SkillTampered]; n > 0 {
		s += fmt.Sprintf(", %d tampered (files changed on the host; refused there until reinstalled)", n)
	}
	if in.Reason != "" {
		s += " (" + in.Reason + ")"
	}
	return s
}

func (g *Gateway) skillControlTool(ctx context.Context, req *mcp.CallToolRequest, in skillControlIn) (*mcp.CallToolResult, any, error) {
	info, err := g.controlRollout(ctx, in.Rollout, in.Action)
	if err != nil {
		return errorResult("skill_rollout_control: " + err.Error()), nil, nil
	}
	return jsonToolResult(rolloutSummary(info), info), nil, nil
}

// sha256Hex is data's lowercase hex SHA-256.
func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
