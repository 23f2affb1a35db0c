// Command fleet-agent joins a machine to a fleetmcp fleet: it dials NATS
// (outbound only) with the identity the machine enrolled with (kept in
// its state directory), announces the machine and runs the tool calls the
// gateway routes to it. "fleet-agent join" enrols the machine first;
// "fleet-agent install" installs it as a system service.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/service"
	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/cmd/internal/configfile"
	"github.com/fleetmcp/fleetmcp/cmd/internal/filemode"
	"github.com/fleetmcp/fleetmcp/cmd/internal/tracing"
	"github.com/fleetmcp/fleetmcp/cmd/internal/version"
)

func main() {
	// --version and the version the agent announces say the same.
	agent.Version = version.Get().Version
	// The agent's own executable is the git guard bash runs git through
	// under a policy with command rules.
	if code, ok := agent.RunGitGuard(os.Args); ok {
		os.Exit(code)
	}
	// Every command it runs starts through it, confined to stay out of
	// the agent's state directory.
	if code, ok := agent.RunConfined(os.Args); ok {
		os.Exit(code)
	}
	// On Windows it also wraps background tasks, recording their exit
	// status when they end.
	if code, ok := agent.RunTaskWrapper(os.Args); ok {
		os.Exit(code)
	}
	// Started by the Windows service control manager, the agent runs
	// under it: a stop or a shutdown drains it as SIGTERM does elsewhere.
	if ok, err := service.RunIfService(func(ctx context.Context) error {
		return run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	}, serviceReload, serviceStopWait); ok {
		if err != nil {
			os.Exit(exitStatus(err))
		}
		os.Exit(0)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := hideFromSameUser(); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-agent: warning: cannot hide the process from its own user's commands:", err)
	}
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stderr); err != nil {
		if errors.Is(err, errChecksFailed) {
			os.Exit(1)
		}
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0) // help was asked for
		}
		fmt.Fprintln(os.Stderr, "fleet-agent:", err)
		os.Exit(exitStatus(err))
	}
}

// exitStatus is the exit status for err: agent.ExitRevoked (77) for a
// revoked host, which the service units do not restart
// (RestartPreventExitStatus=77); 2 for any other error.
func exitStatus(err error) int {
	var rerr *agent.RevokedError
	if errors.As(err, &rerr) {
		return agent.ExitRevoked
	}
	return 2
}

// serviceStopWait is how long a Windows service stop may take: the default
// --drain_timeout and the time to cancel what is still running.
const serviceStopWait = 45 * time.Second

// pathsFlag collects repeated path flags, made absolute.
type pathsFlag []string

func (p *pathsFlag) String() string { return strings.Join(*p, ",") }

func (p *pathsFlag) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("empty path")
	}
	abs, err := filepath.Abs(s)
	if err != nil {
		return err
	}
	*p = append(*p, abs)
	return nil
}

// run dispatches: "join" enrols the machine and runs the agent,
// "install" installs it as a service, anything else runs the agent with
// the identity it has.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "join":
			return runJoin(ctx, args[1:], getenv, stderr)
		case "install":
			return runInstall(ctx, args[1:], getenv, stderr)
		case "doctor":
			return runDoctor(ctx, args[1:], getenv, os.Stdout, stderr)
		case "help":
			return runHelp(args[1:], getenv, stderr)
		}
	}
	fs := flag.NewFlagSet("fleet-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, rootSynopsis)
	rf := addRunFlags(fs, getenv)
	showVersion := fs.Bool("version", false, "print the version, commit, build date and Go version, then exit")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	rf.watchConfig(fs, args, func(fs *flag.FlagSet) {
		addRunFlags(fs, getenv)
		fs.Bool("version", false, "")
	})
	if *showVersion {
		version.Print(os.Stdout, "fleet-agent")
		return nil
	}
	log, err := rf.logger(stderr)
	if err != nil {
		return err
	}
	if err := checkStateModes(*rf.stateDir); err != nil {
		return err
	}
	id, err := identity.Load(*rf.stateDir)
	if err != nil {
		return err
	}
	if *rf.name != "" && *rf.name != id.Enrolment.Host {
		return fmt.Errorf("--name %s: the agent of state directory %s is enrolled as %q, and its credential is for that name only; drop --name, or give a host of another name its own --state_dir and enrolment",
			*rf.name, *rf.stateDir, id.Enrolment.Host)
	}
	return start(ctx, rf, id, nil, getenv, log)
}

// checkStateModes refuses a state directory others may write, and a key
// or credential others than the agent's user may read, before the agent
// loads them (identity.Load would make a readable key private, hiding
// that it was readable).
func checkStateModes(stateDir string) error {
	idDir := identity.Open(stateDir).Dir()
	return filemode.Check(
		filemode.Rule{Path: stateDir, Dir: true},
		filemode.Rule{Path: idDir, Dir: true},
		filemode.Rule{Path: filepath.Join(idDir, identity.KeyFile), Deny: filemode.Private},
		filemode.Rule{Path: filepath.Join(idDir, identity.JWTFile), Deny: filemode.Private},
	)
}

// parse parses args into fs, then the --config file (when fs has the
// flag and it is given) into the flags the command line did not set;
// there are no positional arguments. It returns the flags given on the
// command line.
func parse(fs *flag.FlagSet, args []string) (map[string]bool, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if f := fs.Lookup("config"); f != nil && f.Value.String() != "" {
		// A token belongs in --token_file, not in a file of settings; a
		// repeatable flag takes one value per use, which a file cannot
		// say without splitting paths at commas.
		if err := configfile.Apply(fs, f.Value.String(), set, "token", "protect_path"); err != nil {
			return nil, err
		}
	}
	return set, nil
}

// runFlags are the flags of a running agent (plain start, join, and what
// install writes into the service definition).
type runFlags struct {
	servers, name, cwd, policy, stateDir, skillsDir, fleetSkills, shell *string
	maxConc, maxQueue                                                   *int
	bashDef, bashMax                                                    *time.Duration
	bashLines, bashBytes                                                *int
	imageDim, imageMax                                                  *int
	outFileMiB                                                          *int64
	outKeep                                                             *time.Duration
	outFiles                                                            *int
	outAllMiB, binaryMax                                                *int64
	taskDef, taskMax                                                    *time.Duration
	maxTasks, taskQueue                                                 *int
	retention                                                           *time.Duration
	maxKept                                                             *int
	keptMiB, outMiB                                                     *int64
	tailBytes                                                           *int
	drain, heartbeat                                                    *time.Duration
	logLevel, config                                                    *string
	confine                                                             *string
	otlp                                                                *string
	protected                                                           pathsFlag
	// configChanges, with --config, returns the settings of the file
	// (read again) that differ from those running.
	configChanges func() ([]string, error)
}

// watchConfig lets a reload find the settings of the --config file that
// changed since fs was parsed from args: define adds the flags of fs to
// a new flag set.
func (rf *runFlags) watchConfig(fs *flag.FlagSet, args []string, define func(*flag.FlagSet)) {
	if *rf.config == "" {
		return
	}
	running := configfile.Values(fs)
	rf.configChanges = func() ([]string, error) {
		again := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
		again.SetOutput(io.Discard)
		define(again)
		if _, err := parse(again, args); err != nil {
			return nil, err
		}
		return configfile.Changed(running, configfile.Values(again)), nil
	}
}

func addRunFlags(fs *flag.FlagSet, getenv func(string) string) *runFlags {
	rf := &runFlags{
		servers:   fs.String("nats", getenv("FLEET_NATS_URL"), "NATS URL(s), comma-separated (env FLEET_NATS_URL; default: those the agent got when it enrolled)"),
		name:      fs.String("name", "", "this host's name in the fleet (default: the name it enrolled with; another one is refused)"),
		cwd:       fs.String("cwd", "", "working directory for bash and relative paths (default: current directory)"),
		policy:    fs.String("policy", getenv("FLEET_POLICY"), "host policy file, YAML or JSON (env FLEET_POLICY; default: unrestricted)"),
		stateDir:  fs.String("state_dir", defaultStateDir(getenv), "directory for the agent's own files"),
		skillsDir: fs.String("skills_dir", "", "directory of the host's own skills, one folder with a SKILL.md per skill (default: .agents/skills in the working directory)"),
		fleetSkills: fs.String("fleet_skills_dir", "", "directory where the agent installs the skills the fleet rolls out; no tool writes in it "+
			"(default: skills in the state directory; not inside --skills_dir)"),
		shell:      fs.String("shell", "", "shell for bash commands (default: bash from PATH)"),
		confine:    fs.String("confine_commands", agent.ConfineAuto, "keep commands (bash, tasks, skills' scripts, git) out of the state directory: auto (when the kernel can, else run them unconfined and say so), required (refuse commands that cannot be confined) or off (unsafe: commands can read the agent's identity)"),
		maxConc:    fs.Int("max_concurrent", 16, "calls running at once"),
		maxQueue:   fs.Int("max_queue", 64, "calls waiting for a worker before new ones are refused as busy"),
		bashDef:    fs.Duration("bash_timeout", 120*time.Second, "default bash timeout"),
		bashMax:    fs.Duration("bash_max_timeout", 600*time.Second, "largest bash timeout a caller may ask for"),
		bashLines:  fs.Int("bash_max_lines", 2000, "lines of output a bash result shows at most (its last ones; the full output is saved on the host), 1 to 100000"),
		bashBytes:  fs.Int("bash_max_bytes", 50<<10, "bytes of output a bash result shows at most, 1024 to 4194304 (4 MiB)"),
		imageDim:   fs.Int("image_max_dimension", 2000, "longest side in pixels of an image read returns; larger ones are scaled down"),
		imageMax:   fs.Int("image_max_bytes", 4_500_000, "largest image read returns, in bytes once base64-encoded; larger ones are re-encoded smaller"),
		outFileMiB: fs.Int64("max_output_file_mib", 100, "MiB of a truncated bash call's full output saved on the host; the rest is not saved"),
		outKeep:    fs.Duration("output_retention", 7*24*time.Hour, "how long bash full-output files are kept"),
		outFiles:   fs.Int("max_output_files", 500, "bash full-output files kept; beyond it the oldest are removed"),
		outAllMiB:  fs.Int64("max_output_files_mib", 1024, "MiB all bash full-output files kept may take; beyond it the oldest are removed"),
		binaryMax:  fs.Int64("binary_max_bytes", 20<<20, "largest file read loads whole: an image, or any file with binary_base64"),
		taskDef:    fs.Duration("task_timeout", time.Hour, "default timeout of a background task (bash with background: true)"),
		taskMax:    fs.Duration("task_max_timeout", 24*time.Hour, "largest background task timeout a caller may ask for"),
		maxTasks:   fs.Int("max_tasks", 8, "background tasks running at once"),
		taskQueue:  fs.Int("max_task_queue", 32, "background tasks waiting to start before new ones are refused as busy (negative: none wait)"),
		retention:  fs.Duration("task_retention", 30*24*time.Hour, "finished background tasks older than this are removed when a new one starts"),
		maxKept:    fs.Int("max_kept_tasks", 1000, "background task folders kept; beyond it the oldest finished ones are removed"),
		keptMiB:    fs.Int64("max_kept_task_output_mib", 1024, "MiB of background task output kept; beyond it the oldest finished tasks are removed"),
		outMiB:     fs.Int64("max_task_output_mib", 100, "MiB of output one background task may write before it is killed"),
		tailBytes:  fs.Int("task_tail_bytes", 8<<10, "bytes of a finished task's output task_status returns (at most 50 lines)"),
		drain:      fs.Duration("drain_timeout", 30*time.Second, "on shutdown, how long in-flight calls may take before they are cancelled"),
		heartbeat:  fs.Duration("heartbeat", 5*time.Second, "how often the agent announces itself"),
		logLevel:   fs.String("log_level", "info", "debug, info, warn or error"),
		config:     fs.String("config", "", "YAML FILE of settings, one key per flag of this command (its name without dashes); flags on the command line win"),
		otlp:       fs.String("otlp_endpoint", "", "send OpenTelemetry spans of the calls the gateway traces to this OTLP/HTTP collector URL, e.g. http://127.0.0.1:4318 (default: OTEL_EXPORTER_OTLP_ENDPOINT, else off)"),
	}
	fs.Var(&rf.protected, "protect_path", "a file or directory no tool may read or write, whatever the host policy says, as the agent's own state directory (repeatable)")
	return rf
}

// logger returns the agent's logger, once the flags every start needs
// are known good.
func (rf *runFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	log, err := newLogger(stderr, *rf.logLevel)
	if err != nil {
		return nil, err
	}
	if *rf.stateDir == "" {
		return nil, errors.New("no state directory: set --state_dir (or HOME)")
	}
	return log, nil
}

// start runs the agent of identity id until ctx ends. lock, when set, is
// the state directory's lock the caller holds; the agent takes it over.
func start(ctx context.Context, rf *runFlags, id *identity.Identity, lock *statelock.Lock, getenv func(string) string, log *slog.Logger) error {
	urls := splitList(*rf.servers)
	var locator agent.Locator
	if len(urls) == 0 {
		urls = id.Enrolment.NATSURLs
		if id.Enrolment.GatewayURL != "" {
			// URLs that no longer answer are asked for again.
			locator = id
		}
	}
	// Without its own executable the agent refuses git under command
	// rules.
	self, err := os.Executable()
	if err != nil {
		log.Warn("cannot find the agent's own executable to run git through its guard", "err", err)
	}
	tp, err := tracing.Start(tracing.Config{Endpoint: *rf.otlp, Service: "fleet-agent", Version: agent.Version, Host: id.Enrolment.Host, Logger: log}, getenv)
	if err != nil {
		return err
	}
	defer flushSpans(tp, log)
	if tp != nil {
		log.Info("tracing: spans of traced calls go to the collector", "endpoint", tp.Endpoint())
	}
	a, err := agent.New(agent.Config{
		Servers: urls, Name: id.Enrolment.Host,
		Credentials: agent.Credentials{JWT: id.JWT, Seed: id.Seed, CA: []byte(id.Enrolment.NATSCA)},
		Renewer:     id, Locator: locator, GatewayKeys: id.GatewayKeys().Keys, GatewayKeySerial: id.GatewayKeys().Serial, KeyStore: id,
		Cwd: *rf.cwd, StateDir: *rf.stateDir, StateLock: lock, SkillsDir: *rf.skillsDir, FleetSkillsDir: *rf.fleetSkills, Home: cmp.Or(getenv("HOME"), getenv("USERPROFILE")), Shell: *rf.shell,
		GitGuard: self, TaskWrapper: self, ConfineHelper: self, ConfineCommands: *rf.confine,
		PolicyFile: *rf.policy, ProtectedPaths: rf.protected,
		MaxConcurrent: *rf.maxConc, MaxQueue: *rf.maxQueue,
		BashDefaultTimeout: *rf.bashDef, BashMaxTimeout: *rf.bashMax, BashMaxLines: *rf.bashLines, BashMaxBytes: *rf.bashBytes,
		ImageMaxDimension: *rf.imageDim, ImageMaxBytes: *rf.imageMax, BinaryMaxBytes: *rf.binaryMax,
		OutputFileMaxBytes: *rf.outFileMiB << 20, OutputRetention: *rf.outKeep, MaxOutputFiles: *rf.outFiles, OutputFilesMaxBytes: *rf.outAllMiB << 20,
		TaskDefaultTimeout: *rf.taskDef, TaskMaxTimeout: *rf.taskMax,
		MaxRunningTasks: *rf.maxTasks, MaxQueuedTasks: *rf.taskQueue,
		TaskRetention: *rf.retention, MaxKeptTasks: *rf.maxKept,
		MaxKeptTaskOutput: *rf.keptMiB << 20, MaxTaskOutput: *rf.outMiB << 20, TaskTailBytes: *rf.tailBytes,
		DrainTimeout: *rf.drain, Heartbeat: *rf.heartbeat, Logger: log, TracerProvider: tp.TracerProvider(),
	})
	if err != nil {
		return err
	}
	// SIGHUP reloads the host policy (a parameter change, for the
	// Windows service); it never ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rctx, stopReload := context.WithCancel(ctx)
	var reloads sync.WaitGroup
	reloads.Go(func() { reloadOnHangup(rctx, a, hup, paramChanges, rf.configChanges, log) })
	defer reloads.Wait()
	defer stopReload()
	return a.Run(ctx)
}

// flushSpans sends the spans still queued, for a few seconds at most.
func flushSpans(tp *tracing.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("spans lost at exit", "err", err)
	}
}

// paramChanges carries the Windows service's parameter changes to the
// running agent.
var paramChanges = make(chan struct{}, 1)

// serviceReload asks the running agent for a reload; a reload already
// asked for and not yet begun covers this one too.
func serviceReload() {
	select {
	case paramChanges <- struct{}{}:
	default:
	}
}

// reloadOnHangup reloads the host policy on each SIGHUP or parameter
// change until ctx ends, and says which settings of the --config file
// changed (changes, nil without one): those take effect at a restart.
// The agent logs what it refused.
func reloadOnHangup(ctx context.Context, a *agent.Agent, hup <-chan os.Signal, params <-chan struct{}, changes func() ([]string, error), log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		case <-params:
		}
		if ctx.Err() == nil {
			_ = a.Reload()
			configfile.LogChanges(changes, log, " (a reload re-reads the host policy file only)")
		}
	}
}

// defaultStateDir follows the XDG base directory convention, and on
// Windows (LOCALAPPDATA set) the local application data folder.
func defaultStateDir(getenv func(string) string) string {
	if d := getenv("LOCALAPPDATA"); d != "" && getenv("HOME") == "" {
		return filepath.Join(d, "fleetmcp-agent")
	}
	if d := getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "fleetmcp-agent")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".local", "state", "fleetmcp-agent")
	}
	return ""
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log_level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
