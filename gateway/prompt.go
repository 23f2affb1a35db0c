package gateway

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"text/template"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// This file renders resource://system-prompt: a text/template (the bundled
// one, or Config.SystemPromptFile) executed on every read with the fleet
// as the caller sees it at that moment.

//go:embed prompt/system.md.tmpl
var defaultPrompt string

// promptData is what a system prompt template sees.
type promptData struct {
	// Date is today's date (UTC), YYYY-MM-DD.
	Date string
	// Fleet counts the visible hosts and skills.
	Fleet fleetSummary
	// Hosts are the visible hosts with their facts, by name.
	Hosts []hostFacts
	// Skills are the valid skills, by name; InvalidSkills the others.
	Skills        []*skillEntry
	InvalidSkills []invalidSkill
}

type fleetSummary struct {
	Hosts, Online, Offline, Skills, InvalidSkills int
}

func newPromptData(now time.Time, hosts []HostInfo) promptData {
	cat := buildCatalog(hosts)
	d := promptData{
		Date:          now.UTC().Format(time.DateOnly),
		Hosts:         factsList(hosts),
		Skills:        cat.sorted(),
		InvalidSkills: cat.Invalid,
	}
	for _, h := range hosts {
		if h.Online {
			d.Fleet.Online++
		}
	}
	d.Fleet.Hosts = len(hosts)
	d.Fleet.Offline = d.Fleet.Hosts - d.Fleet.Online
	d.Fleet.Skills, d.Fleet.InvalidSkills = len(d.Skills), len(d.InvalidSkills)
	return d
}

// promptFuncs are the functions a template may call besides the builtins.
func promptFuncs() template.FuncMap {
	return template.FuncMap{"join": strings.Join, "labels": textutil.FormatLabels}
}

func parsePrompt(name, text string) (*template.Template, error) {
	return template.New(name).Funcs(promptFuncs()).Option("missingkey=error").Parse(text)
}

// renderPrompt executes the override template file, when set, or the
// bundled one. An override that cannot be read, parsed or executed is
// logged and replaced by the bundled template.
func renderPrompt(log *slog.Logger, file string, data promptData) (string, error) {
	if file != "" {
		out, err := renderFile(file, data)
		if err == nil {
			return out, nil
		}
		log.Warn("system prompt template unusable; using the bundled one", "file", file, "err", err)
	}
	t, err := parsePrompt("system.md.tmpl", defaultPrompt)
	if err != nil {
		return "", fmt.Errorf("bundled system prompt template: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("bundled system prompt template: %w", err)
	}
	return b.String(), nil
}

func renderFile(file string, data promptData) (string, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	t, err := parsePrompt(file, string(text))
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (g *Gateway) readSystemPrompt(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	data := newPromptData(time.Now(), g.visibleHosts(g.resourceGrants(req)))
	text, err := renderPrompt(g.log, g.cfg.SystemPromptFile, data)
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uriSystemPrompt, MIMEType: mimeMarkdown, Text: text}}}, nil
}
