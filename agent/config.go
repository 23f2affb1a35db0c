package agent

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Version is the agent's release version, reported in every announce.
// The binaries set it from their build (a release's version, or the
// module version of go install); a development build keeps this one.
var Version = "0.1.0"

// Config configures an Agent. The zero value of every optional field means
// the documented default; Run validates the whole struct once.
type Config struct {
	// Servers are the NATS URLs to dial (required).
	Servers []string
	// Name is this host's ID in the fleet (required; see
	// protocol.ValidateHost).
	Name string
	// Credentials are the agent's NATS identity: its user JWT and nkey
	// seed, and the CA of the servers' certificates. The zero value
	// connects without any (to a server that admits anyone, in tests).
	// Labels are not the agent's to choose: the operator gives them at
	// enrolment.
	Credentials Credentials
	// Renewer, when set, renews the credential before it expires (over
	// the agent's NATS connection) and recovers it when it has expired or
	// NATS refuses it (over the gateway's fleet API): fleet-agent sets
	// its identity. Nil: the credential is used as it is.
	Renewer Renewer
	// Locator, when set, asks the gateway's fleet API for the NATS URLs
	// to dial now when Servers cannot be reached (the gateway's
	// addresses changed, or were wrong when the host enrolled), and
	// stores them: fleet-agent sets its identity when the URLs come from
	// the enrolment (no --nats). Nil: Servers are dialled as they are.
	Locator Locator

	// Cwd is the working directory for bash and relative paths. Default:
	// the process's working directory.
	Cwd string
	// StateDir holds the agent's own files (full bash outputs). Required.
	StateDir string
	// StateLock, when set, is the lock on StateDir the caller took
	// already (fleet-agent join holds it from before it makes the
	// agent's key): New takes it over, and it is released when Run
	// returns, by Close, or when New fails. Nil: New takes the lock.
	StateLock *statelock.Lock
	// Home is what "~" expands to in tool paths (usually the agent user's
	// home directory). Empty: paths starting with "~" are refused.
	Home string
	// PolicyFile is the host policy (YAML or JSON; see package policy).
	// Empty: the host is unrestricted. A file that does not parse stops
	// the agent.
	PolicyFile string
	// SkillsDir holds the host's own skills, one folder per skill with a
	// SKILL.md in it, which the tools may edit as the host policy allows.
	// Default: .agents/skills in Cwd. A relative path is taken relative
	// to the process's working directory. It need not exist: skills
	// appear when it does.
	SkillsDir string
	// FleetSkillsDir holds the skills the fleet rolls out, installed by
	// the agent from signed bundles. No tool writes in it, whatever the
	// host policy says, and what the skill tool serves from it is first
	// checked against the bundle's signed manifest. A fleet skill hides a
	// host skill of the same name. Default: skills in StateDir. It must
	// not be SkillsDir, nor lie inside it. Skills an older agent installed
	// in SkillsDir/.fleet are installed here again at the first check of
	// the desired state, and their old copies removed.
	FleetSkillsDir string
	// GatewayKeys are the gateway signing keys the agent trusts
	// (protocol.FormatSigningKey), learnt when it enrolled or from a
	// later key set (GatewayKeySerial; 0: none): the agent runs only
	// calls, cancels, fetches and pokes whose envelopes one of them
	// signed, and installs only skill rollouts signed by one of them.
	// None: the agent runs nothing (it refuses every call and says why).
	GatewayKeys      []string
	GatewayKeySerial uint64
	// KeyStore, when set, stores the keys of key sets the agent takes in
	// (fleet-agent sets its identity). Nil: they last until the process
	// ends.
	KeyStore KeyStore
	// SecretFiles hold the agent's credentials when they live outside the
	// state directory (which is protected anyway): no tool may read or
	// write them.
	SecretFiles []string
	// ProtectedPaths are files and directories (with everything in them)
	// that no tool may read or write, whatever the host policy says, as
	// the agent's own state directory: by their names, through symbolic
	// links and "..", and, for files, under another name (a hard link).
	// An agent running inside the gateway process (fleet-gateway --dev)
	// gets the gateway's data directory here. Bash commands are held only
	// to the host policy's command rules, as for the agent's own files.
	ProtectedPaths []string
	// Shell runs bash commands. Default: bash from PATH, else /bin/sh; on
	// Windows pwsh from PATH, else Windows PowerShell. PowerShell (pwsh or
	// powershell) gets scripts through a bootstrap (see shellcmd.go) and
	// takes named parameters; other shells get "-c LINE".
	Shell string
	// GitGuard is an executable that runs the git guard when its first
	// argument is GitGuardFlag (it calls RunGitGuard first thing in
	// main): fleet-agent sets its own. Under a policy with command
	// rules, bash runs git through it; without one, the command rules
	// refuse git, whose repository configuration can name any program.
	GitGuard string
	// ConfineHelper is an executable that runs the confinement helper
	// when its first argument is ConfineFlag (it calls RunConfined first
	// thing in main): fleet-agent sets its own. Every command the agent
	// starts (bash, background tasks, and so skills' scripts and git)
	// goes through it, which keeps the command from the state directory,
	// SecretFiles and ProtectedPaths, and from changing SkillsDir. Empty:
	// commands cannot be confined.
	ConfineHelper string
	// ConfineCommands is ConfineAuto (default: confine commands when the
	// kernel can, else run them unconfined and say so), ConfineRequired
	// (refuse to run commands that cannot be confined) or ConfineOff
	// (never confine: commands can read the agent's identity).
	ConfineCommands string
	// TaskWrapper is an executable that runs the task wrapper when its
	// first argument is TaskWrapperFlag (it calls RunTaskWrapper first
	// thing in main): fleet-agent sets its own. Background tasks on
	// Windows need it; elsewhere sh wraps them.
	TaskWrapper string
	// BashDefaultTimeout applies to bash calls without a timeout. Default
	// 120 s.
	BashDefaultTimeout time.Duration
	// BashMaxTimeout caps any bash timeout. Default 600 s.
	BashMaxTimeout time.Duration
	// BashMaxLines and BashMaxBytes bound the output a bash result shows:
	// its last lines within both limits; the full output goes to a file
	// on the host. Defaults 2000 lines and 50 KiB (51,200 bytes), as the
	// pi coding agent has them; 1 to 100,000 lines, 1 KiB to 4 MiB.
	BashMaxLines int
	BashMaxBytes int
	// ImageMaxDimension is the longest side, in pixels, of an image read
	// returns; larger images are scaled down. Default 2000, at least 16.
	ImageMaxDimension int
	// ImageMaxBytes bounds an image read returns, counted once
	// base64-encoded (as MCP carries it); larger images are re-encoded
	// smaller. Default 4,500,000.
	ImageMaxBytes int
	// BinaryMaxBytes is the largest file read loads whole: an image, or
	// any file read with binary_base64. Default 20 MiB.
	BinaryMaxBytes int64
	// OutputFileMaxBytes bounds the full output a bash call saves on the
	// host when its result is truncated; the rest is not saved. Default
	// 100 MiB. OutputRetention, MaxOutputFiles and OutputFilesMaxBytes
	// bound the full-output files kept (oldest removed first). Defaults 7
	// days, 500 and 1 GiB; calls running at once may each add one file
	// to the total.
	OutputFileMaxBytes  int64
	OutputRetention     time.Duration
	MaxOutputFiles      int
	OutputFilesMaxBytes int64

	// MaxConcurrent bounds calls running at once. Default 16.
	MaxConcurrent int
	// MaxQueue bounds calls waiting for a worker: beyond MaxConcurrent +
	// MaxQueue calls taken in and not yet answered, calls are refused as
	// busy. A call stops counting as its result goes out, so while
	// workers still send long answers more than MaxQueue may wait, never
	// more than the sum. Default 64; negative: no queue at all.
	MaxQueue int
	// MaxRequestBytes bounds one call's arguments. Default 64 MiB.
	MaxRequestBytes int

	// Background tasks (bash with background: true). TaskDefaultTimeout
	// applies to a task started without a timeout (default 1 h);
	// TaskMaxTimeout caps any (default 24 h).
	TaskDefaultTimeout, TaskMaxTimeout time.Duration
	// MaxRunningTasks bounds tasks running at once (default 8);
	// MaxQueuedTasks bounds tasks waiting for one of them to end (default
	// 32; negative: none wait). Beyond both a task is refused as busy.
	MaxRunningTasks, MaxQueuedTasks int
	// TaskRetention: finished tasks that ended longer ago are removed when
	// a new task starts (default 30 days).
	TaskRetention time.Duration
	// MaxKeptTasks and MaxKeptTaskOutput bound the task folders kept and
	// their output bytes (defaults 1000 and 1 GiB); beyond either, the
	// oldest finished tasks are removed. Queued and running tasks are
	// never removed.
	MaxKeptTasks      int
	MaxKeptTaskOutput int64
	// MaxTaskOutput bounds one task's output file (default 100 MiB): a
	// task that writes more is killed with its process group.
	MaxTaskOutput int64
	// TaskTailBytes bounds the end of a finished task's output that
	// task_status returns (default 8 KiB, and at most 50 lines).
	TaskTailBytes int

	// Heartbeat is how often the agent announces itself. Default 5 s.
	Heartbeat time.Duration
	// Keepalive is how often a running call tells the gateway it is still
	// alive. Default 2 s.
	Keepalive time.Duration
	// ResultTTL is how long finished results are kept for re-fetching.
	// Default 10 min.
	ResultTTL time.Duration
	// DrainTimeout bounds how long shutdown waits for in-flight calls
	// before cancelling them; calls still running 5 s after that are
	// abandoned. Default 30 s.
	DrainTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between attempts to
	// reach NATS: each wait is random up to a ceiling that doubles from
	// ReconnectMin to ReconnectMax. Defaults 500 ms and 10 s
	// (DefaultReconnectMin, DefaultReconnectMax).
	ReconnectMin, ReconnectMax time.Duration

	// NATSOptions are appended to the agent's own connection options
	// (for example nats.InProcessServer).
	NATSOptions []nats.Option
	// TracerProvider, when set, makes spans of the calls whose headers
	// carry a trace context (the gateway's, when it traces): the call,
	// the host policy's decision on its tool, and the tool's work (see
	// trace.go). Nil: tracing is off.
	TracerProvider trace.TracerProvider
	// Logger receives the agent's log. Default: slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	var err error
	if c.Cwd == "" {
		if c.Cwd, err = os.Getwd(); err != nil {
			return fmt.Errorf("working directory: %w", err)
		}
	}
	if c.SkillsDir == "" {
		c.SkillsDir = filepath.Join(c.Cwd, ".agents", "skills")
	}
	if c.SkillsDir, err = filepath.Abs(c.SkillsDir); err != nil {
		return fmt.Errorf("skills directory: %w", err)
	}
	if c.FleetSkillsDir == "" && c.StateDir != "" {
		c.FleetSkillsDir = filepath.Join(c.StateDir, "skills")
	}
	if c.FleetSkillsDir != "" {
		if c.FleetSkillsDir, err = filepath.Abs(c.FleetSkillsDir); err != nil {
			return fmt.Errorf("fleet skills directory: %w", err)
		}
	}
	if c.Shell == "" {
		c.Shell = defaultShell()
	}
	setDur(&c.BashDefaultTimeout, protocol.BashTimeout)
	setDur(&c.BashMaxTimeout, protocol.BashMaxTimeout)
	setDur(&c.Heartbeat, 5*time.Second)
	setDur(&c.Keepalive, 2*time.Second)
	setDur(&c.ResultTTL, 10*time.Minute)
	setDur(&c.DrainTimeout, 30*time.Second)
	setDur(&c.ReconnectMin, DefaultReconnectMin)
	setDur(&c.ReconnectMax, DefaultReconnectMax)
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = 16
	}
	switch {
	case c.MaxQueue == 0:
		c.MaxQueue = 64
	case c.MaxQueue < 0:
		c.MaxQueue = 0
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 64 << 20
	}
	// The media limits get their defaults, and their checks, where the
	// toolbox is built (setMediaDefaults).
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

func setDur(d *time.Duration, def time.Duration) {
	if *d == 0 {
		*d = def
	}
}

func (c *Config) validate() error {
	var errs []error
	if len(c.Servers) == 0 {
		errs = append(errs, errors.New("no NATS server given: pass --nats nats://HOST:4222"))
	}
	if err := protocol.ValidateHost(c.Name); err != nil {
		errs = append(errs, fmt.Errorf("--name: %w", err))
	}
	if err := c.Credentials.validate(c.Name); err != nil {
		errs = append(errs, err)
	}
	if !filepath.IsAbs(c.Cwd) {
		errs = append(errs, fmt.Errorf("working directory %q must be absolute", c.Cwd))
	}
	if len(c.Cwd) > protocol.MaxPathLen {
		errs = append(errs, fmt.Errorf("--cwd %s is %d bytes; the fleet protocol announces at most %d: use a shorter working directory",
			protocol.Excerpt(c.Cwd), len(c.Cwd), protocol.MaxPathLen))
	}
	if len(c.Shell) > protocol.MaxPathLen {
		errs = append(errs, fmt.Errorf("--shell %s is %d bytes; the fleet protocol announces at most %d",
			protocol.Excerpt(c.Shell), len(c.Shell), protocol.MaxPathLen))
	}
	if c.MaxConcurrent < 1 {
		errs = append(errs, fmt.Errorf("max concurrent calls must be at least 1, not %d", c.MaxConcurrent))
	}
	if c.StateDir == "" {
		errs = append(errs, errors.New("no state directory: set --state_dir"))
	}
	if c.FleetSkillsDir != "" && within(c.FleetSkillsDir, c.SkillsDir) {
		errs = append(errs, fmt.Errorf("the fleet's skills directory %s lies in the host's skills directory %s: the tools may write in the host's, never in the fleet's; give --fleet_skills_dir a directory of its own (default: skills in the state directory)",
			c.FleetSkillsDir, c.SkillsDir))
	}
	for _, s := range c.Servers {
		if err := protocol.ValidateNATSURL(s); err != nil {
			errs = append(errs, fmt.Errorf("--nats: %w", err))
		}
	}
	for _, k := range c.GatewayKeys {
		if _, err := protocol.ParseSigningKey(k); err != nil {
			errs = append(errs, fmt.Errorf("gateway signing keys: %w; enrol the host again (fleet-agent join)", err))
		}
	}
	for _, p := range c.ProtectedPaths {
		if !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("protected path %q must be absolute", p))
		}
	}
	if c.ReconnectMin > c.ReconnectMax {
		errs = append(errs, fmt.Errorf("reconnect backoff minimum %s is above maximum %s", c.ReconnectMin, c.ReconnectMax))
	}
	if c.OutputFileMaxBytes < 0 || c.OutputRetention < 0 || c.MaxOutputFiles < 0 || c.OutputFilesMaxBytes < 0 {
		errs = append(errs, fmt.Errorf("full-output limits must not be negative (file %d bytes, retention %s, %d files, %d bytes in all); leave them at 0 for the defaults",
			c.OutputFileMaxBytes, c.OutputRetention, c.MaxOutputFiles, c.OutputFilesMaxBytes))
	}
	if file, all := cmp.Or(c.OutputFileMaxBytes, 100<<20), cmp.Or(c.OutputFilesMaxBytes, 1<<30); all < file {
		errs = append(errs, fmt.Errorf("full-output files may take %d bytes in all (--max_output_files_mib), less than one file's %d (--max_output_file_mib); raise the first or lower the second",
			all, file))
	}
	return errors.Join(errs...)
}

func defaultShell() string {
	if runtime.GOOS == "windows" {
		return defaultWindowsShell(exec.LookPath, os.Getenv("SystemRoot"))
	}
	if p, err := exec.LookPath("bash"); err == nil {
		return p
	}
	return "/bin/sh"
}

// defaultWindowsShell returns pwsh when look finds it, else Windows
// PowerShell: from PATH, else where Windows installs it under systemRoot.
func defaultWindowsShell(look func(string) (string, error), systemRoot string) string {
	for _, name := range []string{"pwsh", "powershell"} {
		if p, err := look(name); err == nil {
			return p
		}
	}
	return filepath.Join(cmp.Or(systemRoot, `C:\Windows`), "System32", "WindowsPowerShell", "v1.0", "powershell.exe")
}
