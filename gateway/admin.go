package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// The admin API, under protocol.AdminPath on the fleet API listener: join
// tokens and agent records, for fleetctl. A caller is an admin with an
// API token whose entry says admin: true, or an OIDC token whose access
// rule says admin: true (the same verification as the MCP endpoint);
// with authentication off, the caller on this machine. Every action is
// an audit record: who, what, the target, the outcome.

// adminRoute is a parsed admin path.
type adminRoute struct {
	// kind is "tokens", "token", "agents", "agent", "key" or "audit".
	kind string
	// target is the token id, host name or key; action the agent or key
	// action.
	target, action string
}

// Agent actions under AdminAgentsPath/NAME/.
const (
	actionRevoke        = "revoke"
	actionLabels        = "labels"
	actionAllowRecovery = "allow-recovery"
)

// parseAdminPath parses the path of an admin request.
func parseAdminPath(path string) (adminRoute, error) {
	rest, ok := strings.CutPrefix(path, protocol.AdminPath)
	if !ok {
		return adminRoute{}, fmt.Errorf("%s is not under %s", protocol.Ellipsis(path, 80), protocol.AdminPath)
	}
	parts := strings.Split(rest, "/")
	coll := func(p string) string { return strings.TrimPrefix(p, protocol.AdminPath) }
	switch {
	case len(parts) == 1 && parts[0] == coll(protocol.AdminTokensPath):
		return adminRoute{kind: "tokens"}, nil
	case len(parts) == 1 && parts[0] == coll(protocol.AdminAgentsPath):
		return adminRoute{kind: "agents"}, nil
	case len(parts) == 1 && parts[0] == coll(protocol.AdminAuditPath):
		return adminRoute{kind: "audit"}, nil
	case len(parts) == 2 && parts[0] == coll(protocol.AdminTokensPath):
		if err := protocol.CheckTokenID(parts[1]); err != nil {
			return adminRoute{}, err
		}
		return adminRoute{kind: "token", target: parts[1]}, nil
	case len(parts) == 3 && parts[0] == coll(protocol.AdminAgentsPath):
		if err := protocol.ValidateHost(parts[1]); err != nil {
			return adminRoute{}, err
		}
		switch parts[2] {
		case actionRevoke, actionLabels, actionAllowRecovery:
			return adminRoute{kind: "agent", target: parts[1], action: parts[2]}, nil
		}
		return adminRoute{}, fmt.Errorf("no agent action %q: use %s, %s or %s", protocol.Ellipsis(parts[2], 40), actionRevoke, actionLabels, actionAllowRecovery)
	case len(parts) == 3 && parts[0] == coll(protocol.AdminKeysPath):
		if !nkeys.IsValidPublicUserKey(parts[1]) {
			return adminRoute{}, fmt.Errorf("%q is not an agent's public key (an nkey user key, U...)", protocol.Ellipsis(parts[1], 60))
		}
		if parts[2] != actionRevoke {
			return adminRoute{}, fmt.Errorf("no key action %q: use %s", protocol.Ellipsis(parts[2], 40), actionRevoke)
		}
		return adminRoute{kind: "key", target: parts[1], action: parts[2]}, nil
	}
	return adminRoute{}, fmt.Errorf("no admin endpoint at %s: use %s, %s/ID, %s, %s/NAME/ACTION, %s/KEY/revoke or %s", protocol.Ellipsis(path, 80),
		protocol.AdminTokensPath, protocol.AdminTokensPath, protocol.AdminAgentsPath, protocol.AdminAgentsPath, protocol.AdminKeysPath, protocol.AdminAuditPath)
}

// adminIDKey carries the admin's identity to the skills handlers.
type adminIDKey struct{}

// adminIdentity is the admin a request of the skills handlers is for.
func adminIdentity(r *http.Request) *access.Identity {
	id, _ := r.Context().Value(adminIDKey{}).(*access.Identity)
	return id
}

// adminHandler serves the admin API: the skills and rollouts endpoints
// (skillsapi.go) through their route table, the rest here.
func (g *Gateway) adminHandler() http.Handler {
	skills := http.NewServeMux()
	for pattern, h := range g.skillsRoutes(adminIdentity) {
		skills.HandleFunc(pattern, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, aerr := g.adminCaller(r)
		if aerr != nil {
			writeAPIError(w, aerr)
			return
		}
		if p := r.URL.Path; underPath(p, protocol.AdminSkillsPath) || underPath(p, protocol.AdminRolloutsPath) {
			skills.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), adminIDKey{}, id)))
			return
		}
		route, err := parseAdminPath(r.URL.Path)
		if err != nil {
			writeAPIError(w, apiErr(protocol.APINotFound, "%v", err))
			return
		}
		a := adminAction{g: g, id: id, w: w, r: r, route: route, src: sourceOf(r)}
		a.serve()
	})
}

// underPath reports whether p is base or below it.
func underPath(p, base string) bool { return p == base || strings.HasPrefix(p, base+"/") }

// forwardingHeaders are the headers a reverse proxy adds to say whom it
// forwards a request for.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip"}

// adminCaller authenticates the caller and checks it is an admin.
func (g *Gateway) adminCaller(r *http.Request) (*access.Identity, *protocol.APIError) {
	if g.subsys.auth == nil {
		if ip := net.ParseIP(sourceOf(r)); ip == nil || !ip.IsLoopback() {
			return nil, apiErr(protocol.APIForbidden, "caller authentication is off on this gateway (--dev or --no_auth), so its admin API answers callers on this machine only")
		}
		// A proxy on this machine connects from loopback for callers
		// anywhere: a forwarded request is not the local caller's.
		for _, h := range forwardingHeaders {
			if r.Header.Get(h) != "" {
				return nil, apiErr(protocol.APIForbidden, "caller authentication is off on this gateway (--dev or --no_auth), and this request came through a proxy (%s): the admin API answers callers on this machine only, directly; turn authentication on to serve it through a proxy", h)
			}
		}
		return access.LocalIdentity(), nil
	}
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if raw = strings.TrimSpace(raw); !ok || raw == "" {
		return nil, apiErr(protocol.APIUnauthorized, "the admin API needs Authorization: Bearer with an admin API token (an --api_tokens entry with admin: true) or an OIDC token whose access rule says admin: true; set --api_token or FLEET_API_TOKEN")
	}
	id, _, err := g.subsys.auth.Identify(r.Context(), raw)
	if err != nil {
		g.log.Info("admin API: refused bearer token", "source", sourceOf(r), "reason", err)
		return nil, apiErr(protocol.APIUnauthorized, "the bearer token was refused (%v): use a valid admin API token or a current OIDC token", err)
	}
	if d := g.subsys.access.Load().For(id).Admin(); !d.Allowed {
		aerr := apiErr(protocol.APIForbidden, "%s is not an admin (%s): an admin API token (admin: true in --api_tokens) or an access rule with admin: true is needed", id.Name(), d.Reason)
		g.auditAdmin(id, "admin", r.Method+" "+protocol.Ellipsis(r.URL.Path, 120), sourceOf(r), nil, nil, aerr)
		return nil, aerr
	}
	return id, nil
}

// adminAction is one admin request of an admin.
type adminAction struct {
	g     *Gateway
	id    *access.Identity
	w     http.ResponseWriter
	r     *http.Request
	route adminRoute
	src   string
}

func (a *adminAction) serve() {
	m := a.r.Method
	switch rt := a.route; {
	case rt.kind == "tokens" && m == http.MethodPost:
		a.createToken()
	case rt.kind == "tokens" && m == http.MethodGet:
		a.listTokens()
	case rt.kind == "token" && m == http.MethodDelete:
		a.revokeToken()
	case rt.kind == "agents" && m == http.MethodGet:
		a.listAgents()
	case rt.kind == "agent" && m == http.MethodPost:
		a.agentAction()
	case rt.kind == "key" && m == http.MethodPost:
		a.revokeKey()
	case rt.kind == "audit" && m == http.MethodGet:
		a.queryAudit()
	default:
		a.w.Header().Set("Allow", map[string]string{"tokens": "GET, POST", "token": "DELETE", "agents": "GET", "agent": "POST", "key": "POST", "audit": "GET"}[rt.kind])
		writeAPIErrorStatus(a.w, http.StatusMethodNotAllowed, apiErr(protocol.APIBadRequest, "%s does not take %s", a.r.URL.Path, m))
	}
}

// finish answers the request and audits it.
func (a *adminAction) finish(tool, target string, args map[string]any, resp any, aerr *protocol.APIError) {
	var hosts []string
	if a.route.kind == "agent" {
		hosts = []string{target}
	}
	if r, ok := resp.(*protocol.KeyRevokeResponse); ok && r.Host != "" {
		hosts = []string{r.Host}
	}
	a.g.auditAdmin(a.id, tool, target, a.src, hosts, args, aerr)
	if aerr != nil {
		writeAPIError(a.w, aerr)
		return
	}
	writeJSON(a.w, http.StatusOK, resp)
}

func (a *adminAction) createToken() {
	var req protocol.TokenCreateRequest
	if aerr := decodeAPIBody(a.w, a.r, &req); aerr != nil {
		a.finish("admin_token_create", "", nil, nil, aerr)
		return
	}
	resp, err := a.g.CreateJoinToken(a.r.Context(), &req, a.id.Name())
	args := map[string]any{"labels": textutil.FormatLabels(req.Labels), "ttl": req.TTL, "uses": req.Uses, "name": req.Name,
		"name_pattern": req.NamePattern, "replace": req.Replace}
	if err != nil {
		a.finish("admin_token_create", "", args, nil, adminError(err))
		return
	}
	a.finish("admin_token_create", resp.Info.ID, args, resp, nil)
}

// queryAudit answers GET AdminAuditPath: the audit tool's query, its
// filters as query parameters.
func (a *adminAction) queryAudit() {
	v := a.r.URL.Query()
	for k := range v {
		if !slices.Contains(protocol.AuditFilter, k) {
			a.finish("admin_audit", "", nil, nil, apiErr(protocol.APIBadRequest, "no audit filter %q: use %s", protocol.Ellipsis(k, 40), strings.Join(protocol.AuditFilter, ", ")))
			return
		}
	}
	in := audit.Filter{Caller: v.Get("caller"), Host: v.Get("host"), Tool: v.Get("tool"), Decision: v.Get("decision"),
		Since: v.Get("since"), Until: v.Get("until"), Receipt: v.Get("receipt")}
	args := map[string]any{}
	for _, k := range protocol.AuditFilter {
		if s := v.Get(k); s != "" {
			args[k] = protocol.Ellipsis(s, 120)
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			a.finish("admin_audit", "", args, nil, apiErr(protocol.APIBadRequest, "limit %q: give a number of records, 1 to %d", protocol.Ellipsis(s, 20), audit.MaxLimit))
			return
		}
		in.Limit = n
	}
	q, err := audit.ParseQuery(in, a.g.now())
	if err != nil {
		a.finish("admin_audit", "", args, nil, apiErr(protocol.APIBadRequest, "%v", err))
		return
	}
	page, err := a.g.subsys.audit.Query(a.r.Context(), q)
	if err != nil {
		a.finish("admin_audit", "", args, nil, adminError(err))
		return
	}
	for _, r := range page.Records {
		if r.Unsealed {
			page.Unsealed++
		}
	}
	a.finish("admin_audit", "", args, page, nil)
}

func (a *adminAction) listTokens() {
	tokens, err := a.g.JoinTokens(a.r.Context())
	if err != nil {
		a.finish("admin_token_list", "", nil, nil, adminError(err))
		return
	}
	a.finish("admin_token_list", "", nil, protocol.TokenList{Tokens: tokens}, nil)
}

func (a *adminAction) revokeToken() {
	t, enrolKey, err := a.g.subsys.enrol.RevokeJoinToken(a.r.Context(), a.route.target, a.id.Name())
	if err != nil {
		a.finish("admin_token_revoke", a.route.target, nil, nil, adminError(err))
		return
	}
	if enrolKey {
		// Its enrol credential stops working now, not at the next
		// reconcile.
		if err := a.g.subsys.authority.Reconcile(a.r.Context()); err != nil {
			a.g.log.Warn("join token revoked; revoking its enrol credential failed, retrying in the background", "token", t.ID, "err", err)
			a.g.reconcileSoon()
		}
	}
	a.finish("admin_token_revoke", t.ID, nil, t, nil)
}

// revokeKey revokes an agent key, whatever any record says.
func (a *adminAction) revokeKey() {
	key := a.route.target
	host, err := a.g.RevokeKey(a.r.Context(), key, a.id.Name())
	resp := &protocol.KeyRevokeResponse{Key: key, Host: host}
	if err != nil {
		a.finish("admin_key_revoke", key, map[string]any{"host": host}, resp, adminError(err))
		return
	}
	a.finish("admin_key_revoke", key, map[string]any{"host": host}, resp, nil)
}

func (a *adminAction) listAgents() {
	recs, err := a.g.Agents(a.r.Context())
	if err != nil {
		a.finish("admin_agent_list", "", nil, nil, adminError(err))
		return
	}
	list := protocol.AgentList{Agents: make([]protocol.AgentInfo, 0, len(recs))}
	for i := range recs {
		list.Agents = append(list.Agents, a.g.agentInfo(&recs[i]))
	}
	a.finish("admin_agent_list", "", nil, list, nil)
}

func (a *adminAction) agentAction() {
	host, ctx := a.route.target, a.r.Context()
	tool := "admin_agent_" + strings.ReplaceAll(a.route.action, "-", "_")
	var args map[string]any
	var err error
	switch a.route.action {
	case actionRevoke:
		err = a.g.RevokeAgent(ctx, host, a.id.Name())
	case actionLabels:
		var req protocol.LabelsRequest
		if aerr := decodeAPIBody(a.w, a.r, &req); aerr != nil {
			a.finish(tool, host, nil, nil, aerr)
			return
		}
		args = map[string]any{"set": textutil.FormatLabels(req.Set), "remove": strings.Join(req.Remove, ",")}
		if len(req.Set) == 0 && len(req.Remove) == 0 {
			a.finish(tool, host, args, nil, apiErr(protocol.APIBadRequest, "nothing to change: give labels to set (k=v) or to remove (k-)"))
			return
		}
		_, err = a.g.SetAgentLabels(ctx, host, req.Set, req.Remove)
	case actionAllowRecovery:
		var req protocol.AllowRecoveryRequest
		if aerr := decodeOptionalAPIBody(a.w, a.r, &req); aerr != nil {
			a.finish(tool, host, nil, nil, aerr)
			return
		}
		if req.Count == 0 {
			req.Count = 1
		}
		args = map[string]any{"count": req.Count}
		err = a.g.AllowRecovery(ctx, host, req.Count)
	}
	if err != nil {
		a.finish(tool, host, args, nil, adminError(err))
		return
	}
	rec, err := a.g.Agent(ctx, host)
	if err != nil {
		a.finish(tool, host, args, nil, adminError(err))
		return
	}
	a.finish(tool, host, args, a.g.agentInfo(&rec), nil)
}

// errBadAdminRequest marks an admin request that cannot be done as asked.
var errBadAdminRequest = enrol.ErrBadRequest

// adminError turns an error of an admin action into an API error.
func adminError(err error) *protocol.APIError {
	switch {
	case errors.Is(err, ErrUnknownAgent):
		return apiErr(protocol.APINotFound, "%v", err)
	case errors.Is(err, enrol.ErrTokenNotFound):
		return apiErr(protocol.APINotFound, "%v (tokens are deleted a day after they stop working)", err)
	case errors.Is(err, enrol.ErrRevoked):
		return apiErr(protocol.APIHostRevoked, "%v", err)
	case errors.Is(err, errBadAdminRequest):
		return apiErr(protocol.APIBadRequest, "%v", err)
	}
	return apiErr(protocol.APIUnavailable, "%v", err)
}

// agentInfo describes a record for the admin API, with whether the host
// is online now.
func (g *Gateway) agentInfo(r *AgentRecord) protocol.AgentInfo {
	info := protocol.AgentInfo{Host: r.Host, PublicKey: r.PublicKey, Labels: r.Labels, Facts: r.Facts, TokenID: r.TokenID,
		EnrolledAt: r.EnrolledAt, CredentialExpiresAt: r.CredentialExpiresAt, RevokedAt: r.RevokedAt, RevokedBy: r.RevokedBy,
		RecoveriesLeft: r.RecoveriesLeft}
	if h, ok := g.calling.reg.get(r.Host); ok {
		info.Online = h.Online && !r.Revoked()
		info.AgentVersion = h.AgentVersion
	}
	return info
}

// auditAdmin writes the audit record of an admin action.
func (g *Gateway) auditAdmin(id *access.Identity, tool, target, src string, hosts []string, args map[string]any, aerr *protocol.APIError) {
	rec := &audit.Record{Time: g.now().UTC(), CallID: newCallID(), Caller: audit.Caller{Kind: string(id.Kind), Subject: id.Subject, Email: id.Email, ClientID: id.ClientID},
		ProjectID: id.ProjectID, Tool: tool, Hosts: hosts, Target: target, Source: src, Args: args, Decision: audit.DecisionAllowed, Outcome: audit.OutcomeOK}
	if aerr != nil {
		rec.Outcome, rec.Reason, rec.Error = audit.OutcomeRefused, string(aerr.Code), aerr.Message
		if aerr.Code == protocol.APIForbidden {
			rec.Decision = audit.DecisionDenied
		}
		if aerr.Code == protocol.APIUnavailable {
			rec.Outcome = audit.OutcomeError
		}
	}
	// Stored before the action is answered, as a tool call's record is
	// (gateway/audit); the action is done either way.
	if err := g.subsys.audit.Commit(context.Background(), rec); err != nil {
		g.log.Error("admin action's audit record not stored yet", "action", tool, "target", target, "err", err)
	}
	g.log.Info("admin action", "caller", id.Name(), "action", tool, "target", target, "outcome", rec.Outcome, "reason", rec.Error)
}
