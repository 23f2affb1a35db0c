package skills

import (
	"context"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Source is where the gateway's MCP Skills extension gets the fleet's
// skills: for each skill name the bundle the gateway serves now, and the
// files of bundles by digest. The Store implements it; a nil source
// leaves the extension undeclared.
type Source interface {
	ServedSkills(ctx context.Context) ([]protocol.SignedManifest, error)
	ServedSkill(ctx context.Context, name string) (protocol.SignedManifest, bool, error)
	SkillFile(ctx context.Context, sha256hex string) ([]byte, error)
}
