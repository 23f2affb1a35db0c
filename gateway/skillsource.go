package gateway

import (
	"context"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// skillSource is what the gateway serves through the MCP Skills
// extension: for each skill, the bundle of its most recent rollout that
// was not rolled back, else its most recently pushed bundle, and the
// files of those bundles.
type skillSource interface {
	ServedSkills(ctx context.Context) ([]protocol.SignedManifest, error)
	ServedSkill(ctx context.Context, name string) (protocol.SignedManifest, bool, error)
	SkillFile(ctx context.Context, sha256hex string) ([]byte, error)
}

var _ skillSource = (*skillService)(nil)

// ServedSkills implements skillSource: every pushed skill's served
// bundle, by name.
func (s *skillService) ServedSkills(ctx context.Context) ([]protocol.SignedManifest, error) {
	var out []protocol.SignedManifest
	for _, name := range s.skillNames() {
		if rec, _, ok := s.served(name); ok {
			out = append(out, rec.SignedManifest)
		}
	}
	return out, nil
}

// ServedSkill implements skillSource.
func (s *skillService) ServedSkill(ctx context.Context, name string) (protocol.SignedManifest, bool, error) {
	rec, _, ok := s.served(name)
	if !ok {
		return protocol.SignedManifest{}, false, nil
	}
	return rec.SignedManifest, true, nil
}

// SkillFile implements skillSource: a file by digest, through the cache.
func (s *skillService) SkillFile(ctx context.Context, sha256hex string) ([]byte, error) {
	if !validHexDigest(sha256hex) {
		return nil, ErrSkillNotFound
	}
	return s.cache.get(ctx, sha256hex, s.readFile)
}

// SkillSource returns what the MCP Skills extension serves (nil when
// skill rollout is off).
func (g *Gateway) skillSource() skillSource {
	if g.skills == nil {
		return nil
	}
	return g.skills
}
