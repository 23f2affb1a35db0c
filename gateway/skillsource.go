package gateway

import (
	"context"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// skillSource is where the MCP Skills extension (skillsmcp.go) gets the
// fleet's skills: for each skill name the bundle the gateway serves now,
// and the files of bundles by digest. The gateway's skill store
// implements it; a nil source leaves the extension undeclared.
type skillSource interface {
	ServedSkills(ctx context.Context) ([]protocol.SignedManifest, error)
	ServedSkill(ctx context.Context, name string) (protocol.SignedManifest, bool, error)
	SkillFile(ctx context.Context, sha256hex string) ([]byte, error)
}
