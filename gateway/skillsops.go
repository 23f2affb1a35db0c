package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// This file is skill rollout as the gateway's Go API, over the skill
// store (gateway/skills): the methods the MCP admin tools, the admin
// HTTP API and fleetctl use. Each records one audit record (the MCP tools
// call the unexported operations: the guard records their calls).

// ErrSkillsOff: the gateway has no signing key.
var ErrSkillsOff = errors.New("skill rollout is off: the gateway has no signing key (set --signing_key or --data_dir)")

// openSkills opens the skill store (with the signing key Start loaded).
func (g *Gateway) openSkills() error {
	host, _ := os.Hostname()
	s, err := skills.Open(g.conns.nc, g.subsys.signer, gatewayFleet{g}, skills.Options{Replicas: g.cfg.Hosts.Replicas,
		LeaderTTL: 10 * time.Second, Tick: 100 * time.Millisecond, ID: host + "/" + randomHex(6), Poke: g.pokeHost,
		Tampered: func(ev skills.Tampered) { g.subsys.audit.Write(tamperRecord(ev)) }},
		g.log.With("component", "skills"))
	if err != nil {
		return err
	}
	g.subsys.skillStore = s
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tamperAuditTool names the audit records of tampered skills.
const tamperAuditTool = "skills.tampered"

// tamperRecord is the audit record of a host's report of a tampered
// skill: the host and skill are the gateway's, the rest the host's words.
func tamperRecord(ev skills.Tampered) *audit.Record {
	return &audit.Record{Time: ev.At.UTC(), CallID: newCallID(), Caller: audit.Caller{Kind: string(access.KindAgent), Subject: ev.Host},
		Tool: tamperAuditTool, Hosts: []string{ev.Host}, Target: ev.Skill,
		Args:     map[string]any{"skill": ev.Skill, "bundle_id": protocol.Clip(ev.BundleID, 80), "rollout": protocol.Clip(ev.Rollout, 80)},
		Decision: audit.DecisionDenied, Reason: "the host refuses the skill: its files differ from the signed manifest",
		Outcome: audit.OutcomeError, Error: protocol.Clip("reported by the host: "+ev.Reason, 500)}
}

// gatewayFleet is the fleet as the agent records and the registry know
// it.
type gatewayFleet struct{ g *Gateway }

func (f gatewayFleet) Members() []skills.Member {
	var out []skills.Member
	for _, rec := range f.g.subsys.agentIndex.All() {
		if rec.Revoked() {
			continue
		}
		out = append(out, skills.Member{Host: rec.Host, Labels: rec.Labels, Online: f.g.calling.reg.isOnline(rec.Host)})
	}
	return out
}

func (f gatewayFleet) Online(host string) bool { return f.g.calling.reg.isOnline(host) }

func (f gatewayFleet) AgentOK(host string) error {
	rec, ok := f.g.subsys.agentIndex.Record(host)
	switch {
	case !ok:
		return fmt.Errorf("host %q is not enrolled", protocol.Clip(host, 64))
	case rec.Revoked():
		return fmt.Errorf("host %s was revoked", host)
	}
	return nil
}

// isOnline reports whether host has a live agent now.
func (r *registry) isOnline(host string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	e := r.hosts[host]
	return e != nil && e.facts != nil && r.liveCount(e, r.now()) > 0
}

// skillService returns the skill store, or ErrSkillsOff.
func (g *Gateway) skillService() (*skills.Store, error) {
	if g.subsys.skillStore == nil {
		return nil, ErrSkillsOff
	}
	return g.subsys.skillStore, nil
}

// auditSkillOp records one skill operation done through the Go API.
func (g *Gateway) auditSkillOp(start time.Time, by *access.Identity, op string, args map[string]any, err error) {
	if by == nil {
		by = access.LocalIdentity()
	}
	rec := &audit.Record{Time: start.UTC(), CallID: newCallID(), Tool: op, Args: args, Decision: audit.DecisionAllowed, Outcome: audit.OutcomeOK,
		Caller:     audit.Caller{Kind: string(by.Kind), Subject: by.Subject, Email: by.Email, ClientID: by.ClientID},
		DurationMS: time.Since(start).Milliseconds()}
	if err != nil {
		rec.Outcome, rec.Error = audit.OutcomeError, protocol.Clip(err.Error(), 500)
		if errors.Is(err, skills.ErrRefused) || errors.Is(err, skills.ErrRolloutState) {
			rec.Outcome = audit.OutcomeRefused
		}
	}
	g.subsys.audit.Write(rec)
}

// callerName names who did something, for the records.
func callerName(by *access.Identity) string {
	if by == nil {
		return "local"
	}
	return by.Caller().Subject
}

// PushSkill stores a skill bundle (the files of the skill's folder)
// after checking it; the same files again are the same version. by is
// the caller (nil: the local operator).
func (g *Gateway) PushSkill(ctx context.Context, by *access.Identity, name string, files []protocol.SkillPushFile) (protocol.SkillPushResponse, error) {
	start := time.Now()
	resp, err := g.pushSkill(ctx, name, files, callerName(by))
	g.auditSkillOp(start, by, "skills.push", map[string]any{"skill": name, "files": len(files), "bundle_id": resp.BundleID}, err)
	return resp, err
}

func (g *Gateway) pushSkill(ctx context.Context, name string, files []protocol.SkillPushFile, by string) (protocol.SkillPushResponse, error) {
	s, err := g.skillService()
	if err != nil {
		return protocol.SkillPushResponse{}, err
	}
	return s.Push(ctx, name, files, by)
}

// Skills lists the pushed skills with the bundle each is served as.
func (g *Gateway) Skills(ctx context.Context) ([]protocol.SkillInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	return s.Skills(), nil
}

// SkillVersions lists a skill's pushed bundles, newest first.
func (g *Gateway) SkillVersions(ctx context.Context, name string) ([]protocol.SkillVersion, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	return s.Versions(name)
}

// StartRollout starts rolling a pushed bundle out; a running rollout of
// the same skill is superseded.
func (g *Gateway) StartRollout(ctx context.Context, by *access.Identity, req protocol.RolloutRequest) (protocol.RolloutInfo, error) {
	start := time.Now()
	info, err := g.startRollout(ctx, req, false, callerName(by))
	g.auditSkillOp(start, by, "skills.rollout", map[string]any{"skill": req.Skill, "bundle_id": info.BundleID, "selector": req.Selector, "rollout": info.ID}, err)
	return info, err
}

func (g *Gateway) startRollout(ctx context.Context, req protocol.RolloutRequest, remove bool, by string) (protocol.RolloutInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.StartRollout(ctx, req, remove, by)
}

// RemoveSkill removes a skill from the hosts selector picks (a rollout
// of the removal, in one batch).
func (g *Gateway) RemoveSkill(ctx context.Context, by *access.Identity, name, selector string) (protocol.RolloutInfo, error) {
	start := time.Now()
	none := 0
	info, err := g.startRollout(ctx, protocol.RolloutRequest{Skill: name, Selector: selector, Canary: &none, Batch: "100%"}, true, callerName(by))
	g.auditSkillOp(start, by, "skills.remove", map[string]any{"skill": name, "selector": selector, "rollout": info.ID}, err)
	return info, err
}

// RolloutStatus describes a rollout; withHosts lists its hosts (up to
// protocol.MaxRolloutHostList).
func (g *Gateway) RolloutStatus(ctx context.Context, id string, withHosts bool) (protocol.RolloutInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.Rollout(ctx, id, withHosts)
}

// Rollouts lists the rollouts, newest first, without host lists.
func (g *Gateway) Rollouts(ctx context.Context) ([]protocol.RolloutInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	return s.Rollouts(), nil
}

// PauseRollout pauses a running rollout: no further batch starts.
func (g *Gateway) PauseRollout(ctx context.Context, by *access.Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutPause)
}

// ResumeRollout resumes a paused rollout; the failures so far no longer
// count against max_errors.
func (g *Gateway) ResumeRollout(ctx context.Context, by *access.Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutResume)
}

// RollbackRollout sets every host the rollout reached back to the
// bundle it had before (removing the skill where it had none).
func (g *Gateway) RollbackRollout(ctx context.Context, by *access.Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutRollback)
}

func (g *Gateway) controlRolloutAudited(ctx context.Context, by *access.Identity, id, action string) (protocol.RolloutInfo, error) {
	start := time.Now()
	info, err := g.controlRollout(ctx, id, action)
	g.auditSkillOp(start, by, "skills.rollout_"+action, map[string]any{"rollout": id}, err)
	return info, err
}

func (g *Gateway) controlRollout(ctx context.Context, id, action string) (protocol.RolloutInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.Control(ctx, id, action)
}

// SkillConsumers returns how many JetStream consumers the streams of
// skill rollout have now, by stream: what rollouts cost the servers
// (one ordered consumer per gateway on the status stream; none per host).
func (g *Gateway) SkillConsumers(ctx context.Context) (map[string]int, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	return s.Consumers(ctx)
}
