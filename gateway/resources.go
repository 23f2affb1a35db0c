package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file serves the MCP resources: the fleet's hosts, their skill
// catalogs and the system prompt. Every read is filtered by the caller's
// access: a host the caller may not use never appears, and reading it
// answers exactly as for a host that does not exist.

const (
	uriHosts        = "resource://hosts"
	uriSkills       = "resource://skills"
	uriSystemPrompt = "resource://system-prompt"
	hostsPrefix     = uriHosts + "/"

	mimeJSON     = "application/json"
	mimeText     = "text/plain"
	mimeMarkdown = "text/markdown"
)

func (g *Gateway) addResources(s *mcp.Server) {
	s.AddResource(&mcp.Resource{URI: uriHosts, Name: "hosts", MIMEType: mimeJSON,
		Description: "The hosts you may use, with their facts: name, os, arch, shell, cwd, labels, online, last_seen, agent_version, tools, policy_digest, confinement (how the host keeps its commands from its own identity)."},
		g.readHosts)
	s.AddResource(&mcp.Resource{URI: uriSkills, Name: "skills", MIMEType: mimeJSON,
		Description: "The fleet's skills: per skill name its description, the hosts that have it and the SKILL.md path on each; invalid skills listed separately with their problem. Load one with the skill tool."},
		g.readSkills)
	s.AddResource(&mcp.Resource{URI: uriSystemPrompt, Name: "system-prompt", MIMEType: mimeMarkdown,
		Description: "A system prompt for a model using this fleet: the tools, how to address hosts, the current hosts and skills."},
		g.readSystemPrompt)
	// One handler reads every per-host template: it parses the URI itself,
	// whichever template the SDK matched.
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: hostsPrefix + "{host}", Name: "host", MIMEType: mimeJSON,
		Description: "One host's facts (the same fields as resource://hosts)."}, g.readHostResource)
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: hostsPrefix + "{host}/cwd", Name: "host-cwd", MIMEType: mimeText,
		Description: "A host's working directory, where relative paths resolve and bash runs."}, g.readHostResource)
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: hostsPrefix + "{host}/skills", Name: "host-skills", MIMEType: mimeJSON,
		Description: "A host's skill catalog, invalid skills included with their problem."}, g.readHostResource)
}

// resourceGrants returns the access of the caller of a resource read, as
// the guard computes it for tool calls.
func (g *Gateway) resourceGrants(req *mcp.ReadResourceRequest) *access.Grants {
	var extra *mcp.RequestExtra
	if req != nil {
		extra = req.Extra
	}
	return g.subsys.access.Load().For(g.identityOf(extra))
}

// visibleHosts returns the hosts gr may see, sorted by name.
func (g *Gateway) visibleHosts(gr *access.Grants) []HostInfo {
	return slices.DeleteFunc(g.calling.reg.list(""), func(h HostInfo) bool { return !gr.HostVisible(h.Host, h.Labels) })
}

// hostFacts is a host as the resources show it.
type hostFacts struct {
	Name         string            `json:"name"`
	OS           string            `json:"os"`
	Arch         string            `json:"arch"`
	Shell        string            `json:"shell"`
	Cwd          string            `json:"cwd"`
	Labels       map[string]string `json:"labels"`
	Online       bool              `json:"online"`
	LastSeen     time.Time         `json:"last_seen"`
	AgentVersion string            `json:"agent_version"`
	Tools        []string          `json:"tools"`
	PolicyDigest string            `json:"policy_digest"`
	Confinement  string            `json:"confinement,omitempty"`
	Conflict     string            `json:"conflict,omitempty"`
	Revoked      bool              `json:"revoked,omitempty"`
}

func factsOf(h HostInfo) hostFacts {
	labels := h.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	tools := h.Tools
	if tools == nil {
		tools = []string{}
	}
	return hostFacts{
		Name: h.Host, OS: h.OS, Arch: h.Arch, Shell: h.Shell, Cwd: h.Cwd, Labels: labels,
		Online: h.Online, LastSeen: h.LastSeen.UTC(), AgentVersion: h.AgentVersion, Tools: tools,
		PolicyDigest: policyName(h.PolicyDigest), Confinement: h.Confinement, Conflict: h.Conflict, Revoked: h.Revoked,
	}
}

func factsList(hosts []HostInfo) []hostFacts {
	out := make([]hostFacts, len(hosts))
	for i, h := range hosts {
		out[i] = factsOf(h)
	}
	return out
}

func (g *Gateway) readHosts(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	hosts := factsList(g.visibleHosts(g.resourceGrants(req)))
	return jsonResource(uriHosts, map[string]any{"hosts": hosts})
}

func (g *Gateway) readSkills(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	return jsonResource(uriSkills, buildCatalog(g.visibleHosts(g.resourceGrants(req))))
}

// readHostResource serves resource://hosts/{host}, .../cwd and .../skills.
func (g *Gateway) readHostResource(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	host, rest, err := parseHostURI(uri)
	if err != nil {
		return nil, err
	}
	h, ok := g.calling.reg.get(host)
	if !ok || !g.resourceGrants(req).HostVisible(host, h.Labels) {
		return nil, resourceError(uri, unknownHost(host).Msg+" (or read resource://hosts)")
	}
	switch rest {
	case "":
		return jsonResource(uri, factsOf(h))
	case "cwd":
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: mimeText, Text: h.Cwd}}}, nil
	default: // "skills", checked by parseHostURI
		skills := h.Skills
		if skills == nil {
			skills = []protocol.Skill{}
		}
		return jsonResource(uri, map[string]any{"host": host, "skills": skills})
	}
}

// parseHostURI splits resource://hosts/HOST[/cwd|/skills] and validates
// the host ID; any other shape is a clear error.
func parseHostURI(uri string) (host, rest string, err error) {
	path, ok := strings.CutPrefix(uri, hostsPrefix)
	if !ok {
		return "", "", resourceError(uri, "not a host resource: use resource://hosts/HOST, resource://hosts/HOST/cwd or resource://hosts/HOST/skills")
	}
	host, rest, _ = strings.Cut(path, "/")
	switch {
	case host == "":
		return "", "", resourceError(uri, "the host is empty: name one, e.g. resource://hosts/HOST (read resource://hosts for the names)")
	case protocol.ValidateHost(host) != nil:
		return "", "", resourceError(uri, fmt.Sprintf("invalid host %q: %v", host, protocol.ValidateHost(host)))
	case rest != "" && rest != "cwd" && rest != "skills":
		return "", "", resourceError(uri, fmt.Sprintf("unknown host resource %q: use resource://hosts/%s, resource://hosts/%s/cwd or resource://hosts/%s/skills", rest, host, host, host))
	}
	return host, rest, nil
}

// resourceError is the answer to a read that names no readable resource:
// invalid params, the code the MCP spec gives an unknown resource (the
// SDK's CodeResourceNotFound is the same), with a message saying what is
// wrong.
func resourceError(uri, msg string) error {
	data, _ := json.Marshal(map[string]string{"uri": uri})
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resource not found: " + uri + ": " + msg, Data: data}
}

func jsonResource(uri string, v any) (*mcp.ReadResourceResult, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", uri, err)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: mimeJSON, Text: string(data)}}}, nil
}

// skillsCatalog is the fleet's skills as one caller sees them.
type skillsCatalog struct {
	// Skills maps a valid skill's name to where it is.
	Skills map[string]*skillEntry `json:"skills"`
	// Invalid lists the skills that do not load, per host.
	Invalid []invalidSkill `json:"invalid"`
}

// skillEntry is one skill name across the fleet.
type skillEntry struct {
	Name string `json:"-"`
	// Description is the first host's (in name order) description.
	Description string   `json:"description"`
	Hosts       []string `json:"hosts"`
	// Paths maps each host to the skill's SKILL.md there.
	Paths map[string]string `json:"paths"`
}

type invalidSkill struct {
	Name    string `json:"name"`
	Host    string `json:"host"`
	Path    string `json:"path"`
	Problem string `json:"problem"`
}

// buildCatalog aggregates the skills of hosts (sorted by name).
func buildCatalog(hosts []HostInfo) skillsCatalog {
	c := skillsCatalog{Skills: map[string]*skillEntry{}, Invalid: []invalidSkill{}}
	for _, h := range hosts {
		for _, s := range h.Skills {
			if s.Problem != "" {
				c.Invalid = append(c.Invalid, invalidSkill{Name: s.Name, Host: h.Host, Path: s.Path, Problem: s.Problem})
				continue
			}
			e := c.Skills[s.Name]
			if e == nil {
				e = &skillEntry{Name: s.Name, Paths: map[string]string{}}
				c.Skills[s.Name] = e
			}
			if e.Description == "" {
				e.Description = s.Description
			}
			if _, dup := e.Paths[h.Host]; !dup {
				e.Hosts = append(e.Hosts, h.Host)
			}
			e.Paths[h.Host] = s.Path
		}
	}
	return c
}

// sorted returns the catalog's valid skills by name.
func (c skillsCatalog) sorted() []*skillEntry {
	out := make([]*skillEntry, 0, len(c.Skills))
	for _, e := range c.Skills {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b *skillEntry) int { return strings.Compare(a.Name, b.Name) })
	return out
}
