package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// toolCall is what a tool implementation receives for one call.
type toolCall struct {
	// ID is the gateway-generated call ID; safe to use in file names.
	ID string
	// Args is the tool's JSON arguments object (without "host").
	Args json.RawMessage
	// Caller names the caller the gateway authenticated, issuer-qualified
	// (policy.Caller.String): a provider's user "token:deploy" is not the
	// API token deploy in a task's record either.
	Caller string
	// Output streams live output to the caller. It is never nil, must not
	// block for long, and must not retain p after it returns.
	Output func(p []byte)
	// exit is set by a tool that ran a command to its end: its exit
	// status, for the call's receipt.
	exit *int
}

// toolFunc runs one tool call. It always returns a result: failures the
// model should see are results with IsError set; it returns a result with
// Error only for calls that could not be carried out at all.
type toolFunc func(ctx context.Context, tc *toolCall) *protocol.Result

// toolboxConfig is what the tools need to know about their host.
type toolboxConfig struct {
	// Cwd is the working directory for bash and for relative paths.
	Cwd string
	// StateDir holds the agent's own files; bash full-output files go to
	// StateDir/output.
	StateDir string
	// FleetSkills is the directory of the skills the fleet installed
	// (Config.FleetSkillsDir): no tool writes in it.
	FleetSkills string
	// Home is what "~" expands to in paths; empty: paths starting with "~"
	// are refused.
	Home string
	// Shell runs bash commands as Shell -c COMMAND.
	Shell string
	// TaskWrapper wraps background tasks on Windows (see
	// Config.TaskWrapper).
	TaskWrapper string
	// ConfineCommands and ConfineHelper are how commands are kept from
	// the agent's own files (see Config).
	ConfineCommands, ConfineHelper string
	// SkillsDir is the host's skills directory, which commands may read
	// and run but not change (unless it lies in Cwd, which they write).
	SkillsDir string
	// GitGuard runs the git guard (see Config.GitGuard); it must be set
	// when Policy has command rules and was read for a guarded agent.
	GitGuard string
	// BashDefaultTimeout applies when a call gives no timeout (120 s).
	BashDefaultTimeout time.Duration
	// BashMaxTimeout caps any requested timeout (600 s).
	BashMaxTimeout time.Duration
	// BashMaxLines and BashMaxBytes bound the output a bash result shows
	// (0: 2000 lines and 50 KiB; see Config).
	BashMaxLines, BashMaxBytes int
	// Policy is the host policy; nil: unrestricted.
	Policy *policy.Policy
	// PolicyFile and SecretFiles are the agent's own policy file and
	// credentials: no tool writes them, none reads the credentials.
	PolicyFile  string
	SecretFiles []string
	// ProtectedPaths are files and directories no tool reads or writes.
	ProtectedPaths []string
	// ChildEnv is the environment commands start with, as KEY=value
	// entries (usually the agent's own). Variables whose names start with
	// FLEET_ configure the agent and may hold its secrets: they are always
	// left out. Nil: commands get an empty environment.
	ChildEnv []string
	// ImageMaxDimension is the longest side, in pixels, of an image read
	// shows; larger ones are scaled down (0: 2000).
	ImageMaxDimension int
	// ImageMaxBytes is the largest image read shows, counted once
	// base64-encoded as MCP carries it; larger ones are re-encoded
	// smaller (0: 4,500,000).
	ImageMaxBytes int
	// BinaryMaxBytes is the largest file read loads whole: an image, or
	// any file with binary_base64 (0: 20 MiB).
	BinaryMaxBytes int64
	// SpillMaxBytes bounds one bash full-output file (0: 100 MiB);
	// SpillMaxAge, SpillMaxFiles and SpillMaxTotal bound the ones kept
	// (0: 7 days, 500, 1 GiB).
	SpillMaxBytes int64
	SpillMaxAge   time.Duration
	SpillMaxFiles int
	SpillMaxTotal int64
	// Host is this host's name, for messages.
	Host string
	// Tasks bounds background tasks (zero values: the defaults).
	Tasks tasks.Config
	// Logger receives what the tools log (background tasks re-attached
	// or lost, interrupted patches recovered); nil: nothing is logged.
	Logger *slog.Logger

	// recoverHook, for tests, runs before each file a patch recovery
	// handles.
	recoverHook func(entry int)
}
