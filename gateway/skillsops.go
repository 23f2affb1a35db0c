package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file is skill rollout as the gateway's Go API: the methods the
// MCP admin tools, the admin HTTP API and fleetctl use. Each records one
// audit record (the MCP tools call the unexported operations: the guard
// records their calls).

// openSkills opens the skill service (with the signing key Start loaded).
func (g *Gateway) openSkills() error {
	host, _ := os.Hostname()
	s, err := openSkillService(g.nc, g.signer, gatewayFleet{g}, skillOptions{replicas: g.cfg.Hosts.Replicas,
		leaderTTL: 10 * time.Second, tick: 100 * time.Millisecond, cacheBytes: defaultSkillCache, id: host + "/" + randomHex(6), poke: g.pokeHost,
		audit: func(rec *AuditRecord) { g.audit.write(rec) }},
		g.log.With("component", "skills"))
	if err != nil {
		return err
	}
	g.skillStore = s
	return nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// gatewayFleet is the fleet as the agent records and the registry know
// it.
type gatewayFleet struct{ g *Gateway }

func (f gatewayFleet) members() []fleetMember {
	var out []fleetMember
	for _, rec := range f.g.agentIndex.All() {
		if rec.Revoked() {
			continue
		}
		out = append(out, fleetMember{Host: rec.Host, Labels: rec.Labels, Online: f.g.reg.isOnline(rec.Host)})
	}
	return out
}

func (f gatewayFleet) online(host string) bool { return f.g.reg.isOnline(host) }

func (f gatewayFleet) agentOK(host string) error {
	rec, ok := f.g.agentIndex.Record(host)
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

// skillService returns the service, or ErrSkillsOff.
func (g *Gateway) skillService() (*skillService, error) {
	if g.skillStore == nil {
		return nil, ErrSkillsOff
	}
	return g.skillStore, nil
}

// auditSkillOp records one skill operation done through the Go API.
func (g *Gateway) auditSkillOp(start time.Time, by *Identity, op string, args map[string]any, err error) {
	if by == nil {
		by = localIdentity()
	}
	rec := &AuditRecord{Time: start.UTC(), CallID: newCallID(), Tool: op, Args: args, Decision: decisionAllowed, Outcome: outcomeOK,
		Caller:     AuditCaller{Kind: by.Kind, Subject: by.Subject, Email: by.Email, ClientID: by.ClientID},
		DurationMS: time.Since(start).Milliseconds()}
	if err != nil {
		rec.Outcome, rec.Error = outcomeError, protocol.Clip(err.Error(), 500)
		if errors.Is(err, ErrSkillRefused) || errors.Is(err, ErrRolloutState) {
			rec.Outcome = outcomeRefused
		}
	}
	g.audit.write(rec)
}

// callerName names who did something, for the records.
func callerName(by *Identity) string {
	if by == nil {
		return "local"
	}
	return by.Caller().Subject
}

// PushSkill stores a skill bundle (the files of the skill's folder)
// after checking it; the same files again are the same version. by is
// the caller (nil: the local operator).
func (g *Gateway) PushSkill(ctx context.Context, by *Identity, name string, files []protocol.SkillPushFile) (protocol.SkillPushResponse, error) {
	start := time.Now()
	resp, err := g.pushSkill(ctx, name, toPushFiles(files), callerName(by))
	g.auditSkillOp(start, by, "skills.push", map[string]any{"skill": name, "files": len(files), "bundle_id": resp.BundleID}, err)
	return resp, err
}

func toPushFiles(files []protocol.SkillPushFile) []pushFile {
	out := make([]pushFile, len(files))
	for i, f := range files {
		out[i] = pushFile{Path: f.Path, Mode: f.Mode, Data: f.Data}
	}
	return out
}

func (g *Gateway) pushSkill(ctx context.Context, name string, files []pushFile, by string) (protocol.SkillPushResponse, error) {
	s, err := g.skillService()
	if err != nil {
		return protocol.SkillPushResponse{}, err
	}
	return s.push(ctx, name, files, by)
}

// Skills lists the pushed skills with the bundle each is served as.
func (g *Gateway) Skills(ctx context.Context) ([]protocol.SkillInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	var out []protocol.SkillInfo
	for _, name := range s.skillNames() {
		vs := s.versions(name)
		served, rollout, _ := s.served(name)
		out = append(out, protocol.SkillInfo{Name: name, Description: served.Description, Served: served.BundleID,
			Versions: len(vs), LastPushed: vs[0].PushedAt, LastRollout: rollout})
	}
	return out, nil
}

// SkillVersions lists a skill's pushed bundles, newest first.
func (g *Gateway) SkillVersions(ctx context.Context, name string) ([]protocol.SkillVersion, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	vs := s.versions(name)
	if len(vs) == 0 {
		return nil, fmt.Errorf("%w: no skill %q was pushed", ErrSkillNotFound, protocol.Clip(name, 64))
	}
	out := make([]protocol.SkillVersion, len(vs))
	for i, v := range vs {
		out[i] = protocol.SkillVersion{BundleID: v.BundleID, Files: len(v.Manifest.Files), Bytes: v.Manifest.TotalSize(), PushedAt: v.PushedAt, PushedBy: v.PushedBy}
	}
	return out, nil
}

// StartRollout starts rolling a pushed bundle out; a running rollout of
// the same skill is superseded.
func (g *Gateway) StartRollout(ctx context.Context, by *Identity, req protocol.RolloutRequest) (protocol.RolloutInfo, error) {
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
	r, err := s.startRollout(ctx, req, remove, by)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, false), nil
}

// RemoveSkill removes a skill from the hosts selector picks (a rollout
// of the removal, in one batch).
func (g *Gateway) RemoveSkill(ctx context.Context, by *Identity, name, selector string) (protocol.RolloutInfo, error) {
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
	r, err := s.rolloutByID(ctx, id)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, withHosts), nil
}

// Rollouts lists the rollouts, newest first, without host lists.
func (g *Gateway) Rollouts(ctx context.Context) ([]protocol.RolloutInfo, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	var out []protocol.RolloutInfo
	for _, r := range s.rolloutList() {
		out = append(out, s.info(r, false))
	}
	return out, nil
}

// PauseRollout pauses a running rollout: no further batch starts.
func (g *Gateway) PauseRollout(ctx context.Context, by *Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutPause)
}

// ResumeRollout resumes a paused rollout; the failures so far no longer
// count against max_errors.
func (g *Gateway) ResumeRollout(ctx context.Context, by *Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutResume)
}

// RollbackRollout sets every host the rollout reached back to the
// bundle it had before (removing the skill where it had none).
func (g *Gateway) RollbackRollout(ctx context.Context, by *Identity, id string) (protocol.RolloutInfo, error) {
	return g.controlRolloutAudited(ctx, by, id, protocol.RolloutRollback)
}

func (g *Gateway) controlRolloutAudited(ctx context.Context, by *Identity, id, action string) (protocol.RolloutInfo, error) {
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
	r, err := s.control(ctx, id, action)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, false), nil
}

// SkillConsumers returns how many JetStream consumers the streams of
// skill rollout have now, by stream: what rollouts cost the servers
// (one ordered consumer per gateway on the status stream; none per host).
func (g *Gateway) SkillConsumers(ctx context.Context) (map[string]int, error) {
	s, err := g.skillService()
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, name := range []string{protocol.SkillsStatusStream, "KV_" + protocol.SkillsDesiredBucket, "KV_" + skillBundlesBucket,
		"KV_" + rolloutsBucket, "KV_" + leaderBucket, "OBJ_" + skillFilesBucket} {
		cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		st, err := s.js.Stream(cctx, name)
		if err == nil {
			var info *jetstream.StreamInfo
			if info, err = st.Info(cctx); err == nil {
				out[name] = info.State.Consumers
			}
		}
		cancel()
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
	}
	return out, nil
}
