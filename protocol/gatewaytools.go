package protocol

import "slices"

// The gateway's own tools: those it answers itself instead of forwarding
// them to one host. They are named here, beside the per-host tools, so
// that access rules can name every tool a caller may be granted.

// Names of the gateway's own tools.
const (
	// ToolHosts lists the hosts a caller may use; it is open to every
	// caller granted some tool on some host.
	ToolHosts = "hosts"
	// ToolAudit reads the audit trail (an admin tool).
	ToolAudit = "audit"
	// ToolFleetBash and ToolFleetRead run bash and read on many hosts at
	// once (fan-out tools): a caller may use them on the hosts where it
	// may use the per-host tool.
	ToolFleetBash = "fleet_bash"
	ToolFleetRead = "fleet_read"
	// The skill rollout tools (admin tools).
	ToolSkillPush    = "skill_push"
	ToolSkillRollout = "skill_rollout"
	ToolSkillStatus  = "skill_rollout_status"
	ToolSkillControl = "skill_rollout_control"
)

// AdminTools returns the names of the tools only admins may call (a
// copy: the caller may change it).
func AdminTools() []string { return slices.Clone(adminTools) }

var adminTools = []string{ToolAudit, ToolSkillPush, ToolSkillRollout, ToolSkillStatus, ToolSkillControl}

// IsAdminTool reports whether only admins may call tool.
func IsAdminTool(tool string) bool { return slices.Contains(adminTools, tool) }

// FanoutBase returns the per-host tool a fan-out tool runs on every host
// it picks ("" for other tools): access rules and host policies name only
// that per-host tool.
func FanoutBase(tool string) string {
	switch tool {
	case ToolFleetBash:
		return ToolBash
	case ToolFleetRead:
		return ToolRead
	}
	return ""
}
