package skills

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file is the store's API, as the gateway's admin tools, admin HTTP
// API and Go API use it (the gateway records the audit records of the
// calls).

// Push stores a skill bundle (the files of the skill's folder) after
// checking it: files first (those not stored yet), then the signed
// manifest. The same files again are the same version (Created false).
// by names who pushed it.
func (s *Store) Push(ctx context.Context, name string, files []protocol.SkillPushFile, by string) (protocol.SkillPushResponse, error) {
	return s.push(ctx, name, files, by)
}

// Skills lists the pushed skills with the bundle each is served as.
func (s *Store) Skills() []protocol.SkillInfo {
	var out []protocol.SkillInfo
	for _, name := range s.skillNames() {
		vs := s.versions(name)
		served, rollout, _ := s.served(name)
		out = append(out, protocol.SkillInfo{Name: name, Description: served.Description, Served: served.BundleID,
			Versions: len(vs), LastPushed: vs[0].PushedAt, LastRollout: rollout})
	}
	return out
}

// Versions lists a skill's pushed bundles, newest first.
func (s *Store) Versions(name string) ([]protocol.SkillVersion, error) {
	vs := s.versions(name)
	if len(vs) == 0 {
		return nil, fmt.Errorf("%w: no skill %q was pushed", ErrNotFound, protocol.Clip(name, 64))
	}
	out := make([]protocol.SkillVersion, len(vs))
	for i, v := range vs {
		out[i] = protocol.SkillVersion{BundleID: v.BundleID, Files: len(v.Manifest.Files), Bytes: v.Manifest.TotalSize(), PushedAt: v.PushedAt, PushedBy: v.PushedBy}
	}
	return out, nil
}

// StartRollout stores a new rollout of a pushed bundle (or, with remove,
// of the skill's removal) and supersedes the running or paused ones of
// its skill. by names who started it.
func (s *Store) StartRollout(ctx context.Context, req protocol.RolloutRequest, remove bool, by string) (protocol.RolloutInfo, error) {
	r, err := s.startRollout(ctx, req, remove, by)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, false), nil
}

// Rollout describes a rollout; withHosts lists its hosts (up to
// protocol.MaxRolloutHostList).
func (s *Store) Rollout(ctx context.Context, id string, withHosts bool) (protocol.RolloutInfo, error) {
	r, err := s.rolloutByID(ctx, id)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, withHosts), nil
}

// Rollouts lists the rollouts, newest first, without host lists.
func (s *Store) Rollouts() []protocol.RolloutInfo {
	var out []protocol.RolloutInfo
	for _, r := range s.rolloutList() {
		out = append(out, s.info(r, false))
	}
	return out
}

// Control pauses, resumes or rolls back a rollout (action is one of
// protocol.RolloutPause, RolloutResume, RolloutRollback).
func (s *Store) Control(ctx context.Context, id, action string) (protocol.RolloutInfo, error) {
	r, err := s.control(ctx, id, action)
	if err != nil {
		return protocol.RolloutInfo{}, err
	}
	return s.info(r, false), nil
}

// Consumers returns how many JetStream consumers the streams of skill
// rollout have now, by stream: what rollouts cost the servers (one
// ordered consumer per gateway on the status stream; none per host).
func (s *Store) Consumers(ctx context.Context) (map[string]int, error) {
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
