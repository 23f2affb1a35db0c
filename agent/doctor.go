package agent

import (
	"fmt"
	"os"
	"runtime"

	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/policy"
)

// What fleet-agent doctor asks of the agent without starting one.

// CheckPolicy reads and compiles the host policy file of cfg
// (cfg.PolicyFile) exactly as New does, for the working directory, home,
// shell and git guard of cfg, and returns its summary (one line per
// dimension). No file: nil, nil.
func CheckPolicy(cfg Config) ([]string, error) {
	if cfg.PolicyFile == "" {
		return nil, nil
	}
	if cfg.Cwd == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, fmt.Errorf("working directory: %w", err)
		}
		cfg.Cwd = wd
	}
	env := policy.Env{OS: runtime.GOOS, FoldCase: onDarwin, Cwd: cfg.Cwd, Home: cfg.Home, Tools: toolNames(), Shell: cfg.Shell,
		GitGuarded: cfg.GitGuard != ""}
	p, err := loadPolicy(cfg.PolicyFile, env)
	if err != nil {
		return nil, err
	}
	return p.Summary(), nil
}

// StateDirHolder tells whether an agent process holds the state
// directory dir, and its process ID when it wrote one (0 if not). It
// creates nothing: a directory without a lock file was never run from.
// Finding the lock free, it takes and drops it at once.
func StateDirHolder(dir string) (held bool, pid int, err error) { return statelock.Holder(dir) }
