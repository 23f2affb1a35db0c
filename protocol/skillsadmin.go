package protocol

import "time"

// This file is the admin API's part for skill rollout (under AdminPath,
// as admin.go): push a bundle, start a rollout, follow and control it,
// remove a skill. The MCP admin tools and fleetctl show the same types.
//
//	GET  AdminSkillsPath                        → []SkillInfo
//	POST AdminSkillsPath                        SkillPushRequest → SkillPushResponse
//	GET  AdminSkillsPath + "/NAME"              → []SkillVersion
//	POST AdminSkillsPath + "/NAME/remove"       SkillRemoveRequest → RolloutInfo
//	GET  AdminRolloutsPath                      → []RolloutInfo (without host lists)
//	POST AdminRolloutsPath                      RolloutRequest → RolloutInfo
//	GET  AdminRolloutsPath + "/ID"              → RolloutInfo
//	POST AdminRolloutsPath + "/ID/ACTION"       (pause, resume, rollback) → RolloutInfo
const (
	AdminSkillsPath   = AdminPath + "skills"
	AdminRolloutsPath = AdminPath + "skills/rollouts"
)

// SkillPushFile is one file of a pushed bundle.
type SkillPushFile struct {
	Path string `json:"path"`
	// Mode is 0644, or 0755 for an executable (0 means 0644).
	Mode uint32 `json:"mode,omitempty"`
	Data []byte `json:"data"`
}

// SkillPushRequest pushes a bundle: the skill's name (the folder's
// name; not "rollouts", which names the rollouts' path) and its files.
type SkillPushRequest struct {
	Name  string          `json:"name"`
	Files []SkillPushFile `json:"files"`
}

// SkillPushResponse says which version a push is: Created is false when
// the same bundle was pushed before.
type SkillPushResponse struct {
	Skill    string    `json:"skill"`
	BundleID string    `json:"bundle_id"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	Created  bool      `json:"created"`
	PushedAt time.Time `json:"pushed_at"`
	PushedBy string    `json:"pushed_by,omitempty"`
}

// SkillVersion is one pushed bundle of a skill.
type SkillVersion struct {
	BundleID string    `json:"bundle_id"`
	Files    int       `json:"files"`
	Bytes    int64     `json:"bytes"`
	PushedAt time.Time `json:"pushed_at"`
	PushedBy string    `json:"pushed_by,omitempty"`
}

// SkillInfo is a skill the gateways know: its served bundle (that of
// its latest rollout not rolled back, else the latest pushed) and how
// many versions were pushed.
type SkillInfo struct {
	Name        string    `json:"name"`
	Description string    `json:"description"`
	Served      string    `json:"served"`
	Versions    int       `json:"versions"`
	LastPushed  time.Time `json:"last_pushed"`
	LastRollout string    `json:"last_rollout,omitempty"`
}

// RolloutRequest starts a rollout of a pushed bundle to the hosts a
// selector picks.
type RolloutRequest struct {
	Skill string `json:"skill"`
	// BundleID is the version (default: the latest pushed).
	BundleID string `json:"bundle_id,omitempty"`
	// Selector picks hosts by name glob and labels (as the hosts tool's
	// filter); "*" for all.
	Selector string `json:"selector"`
	// Canary is how many online hosts install first, alone (default 1;
	// 0: none).
	Canary *int `json:"canary,omitempty"`
	// Batch is how many hosts install at once after the canary: N, or N%
	// of the hosts (default "25%").
	Batch string `json:"batch,omitempty"`
	// MaxErrors is how many hosts may fail before the rollout pauses
	// (default 0).
	MaxErrors int `json:"max_errors,omitempty"`
	// AutoRollback rolls back instead of pausing.
	AutoRollback bool `json:"auto_rollback,omitempty"`
	// BatchTimeout is how long an online host may take to install before
	// it counts as failed (Go duration; default "10m").
	BatchTimeout string `json:"batch_timeout,omitempty"`
}

// SkillRemoveRequest removes a skill from the hosts a selector picks.
type SkillRemoveRequest struct {
	Selector string `json:"selector"`
}

// Rollout states.
const (
	RolloutRunning    = "running"
	RolloutPaused     = "paused"
	RolloutDone       = "done"
	RolloutRolledBack = "rolled_back"
	RolloutSuperseded = "superseded"
)

// Rollout actions (POST AdminRolloutsPath + "/ID/ACTION").
const (
	RolloutPause    = "pause"
	RolloutResume   = "resume"
	RolloutRollback = "rollback"
)

// RolloutHost is one host of a rollout and where it stands: a
// SkillState state, or "offline" for a host assigned while away (its
// desired state waits for it), or "waiting" for a host of a later batch,
// or "skipped" for a host of a batch that never started before the
// rollout was rolled back. The hosts of a rolled back rollout stand
// against the bundle each had before ("removed" when it had none).
type RolloutHost struct {
	Host  string `json:"host"`
	State string `json:"state"`
	// Active is the bundle of the skill the host serves now, by its last
	// report (empty: none, or no report yet).
	Active string `json:"active,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Rollout host states beyond the SkillState ones.
const (
	RolloutHostWaiting = "waiting"
	RolloutHostOffline = "offline"
	RolloutHostSkipped = "skipped"
)

// RolloutInfo is a rollout and its progress.
type RolloutInfo struct {
	ID       string `json:"id"`
	Skill    string `json:"skill"`
	BundleID string `json:"bundle_id,omitempty"`
	Remove   bool   `json:"remove,omitempty"`
	Selector string `json:"selector"`
	State    string `json:"state"`
	// Reason says why a rollout paused, rolled back or was superseded.
	Reason       string    `json:"reason,omitempty"`
	Canary       int       `json:"canary"`
	Batch        string    `json:"batch"`
	MaxErrors    int       `json:"max_errors"`
	AutoRollback bool      `json:"auto_rollback,omitempty"`
	BatchTimeout string    `json:"batch_timeout"`
	Hosts        int       `json:"hosts"`
	Batches      int       `json:"batches"`
	CurrentBatch int       `json:"current_batch"`
	CreatedAt    time.Time `json:"created_at"`
	CreatedBy    string    `json:"created_by,omitempty"`
	UpdatedAt    time.Time `json:"updated_at"`
	// Counts are the hosts per state (RolloutHost states).
	Counts map[string]int `json:"counts"`
	// Problems are the hosts that failed or refused, or whose installed
	// files were found tampered with, with why.
	Problems []RolloutHost `json:"problems,omitempty"`
	// HostStates lists every host, when asked for and the rollout has at
	// most MaxRolloutHostList.
	HostStates []RolloutHost `json:"host_states,omitempty"`
}

// MaxRolloutHostList bounds RolloutInfo.HostStates.
const MaxRolloutHostList = 1000
