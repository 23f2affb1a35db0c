package skills

import (
	"context"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The skill store is the source of what the MCP Skills extension serves
// (Source): for each skill, the bundle of its most recent rollout
// that was not rolled back, else its most recently pushed bundle, and
// the files of those bundles.
var _ Source = (*Store)(nil)

// ServedSkills serves the MCP Skills extension: every pushed skill's served
// bundle, by name.
func (s *Store) ServedSkills(ctx context.Context) ([]protocol.SignedManifest, error) {
	var out []protocol.SignedManifest
	for _, name := range s.skillNames() {
		if rec, _, ok := s.served(name); ok {
			out = append(out, rec.SignedManifest)
		}
	}
	return out, nil
}

// ServedSkill serves the MCP Skills extension.
func (s *Store) ServedSkill(ctx context.Context, name string) (protocol.SignedManifest, bool, error) {
	rec, _, ok := s.served(name)
	if !ok {
		return protocol.SignedManifest{}, false, nil
	}
	return rec.SignedManifest, true, nil
}

// SkillFile serves the MCP Skills extension: a file by digest, through the cache.
func (s *Store) SkillFile(ctx context.Context, sha256hex string) ([]byte, error) {
	if !validHexDigest(sha256hex) {
		return nil, ErrNotFound
	}
	return s.cache.get(ctx, sha256hex, s.readFile)
}
