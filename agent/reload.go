package agent

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/fleetmcp/fleetmcp/policy"
)

// This file reloads the host policy without a restart (fleet-agent does it
// on SIGHUP). Calls read the policy once when they start (the tools they
// may run) and the guard reads it once per check, from atomic pointers:
// calls in flight finish under the policy they started with or, for
// checks made after the swap, under the new one, never under a mix within
// one check.

// Reload reads the host policy file again and puts it in force, then
// announces the host (its tools and policy digest may have changed). A
// file that cannot be read or parsed, or that changes the git rules
// (installed once at start: a restart applies them), is refused with one
// log line naming the file and the problem; the policy in force stays.
// Without a policy file there is nothing to reload.
func (a *Agent) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	file := a.cfg.PolicyFile
	if file == "" {
		a.log.Info("reload: no host policy file (--policy); nothing to reload")
		return nil
	}
	pol, err := loadPolicy(file, a.policyEnv)
	if err == nil {
		err = sameGitRules(a.served().pol, pol)
	}
	if err == nil && a.gitGuard != nil {
		// Every git process from now on is held to the new deny rules.
		err = a.gitGuard.setDeny(pol.GitRules())
	}
	if err != nil {
		a.log.Error("reload refused: the host policy in force stays", "file", file, "err", err)
		return err
	}
	old := a.served().pol
	hp := newHostPolicy(a.allTools, pol)
	a.guard.pol.Store(pol)
	a.hp.Store(hp)
	a.skills.rescan()
	a.skillSync.poke() // a skill the old policy refused may be allowed now
	a.log.Info("host policy reloaded", "file", file, "old_digest", old.Digest(), "digest", pol.Digest(), "tools", fmt.Sprint(hp.toolList()))
	if nc := a.nc.Load(); nc != nil && !a.draining.Load() {
		a.announce(nc, false)
	}
	return nil
}

// sameGitRules refuses a policy whose git rules differ from those of
// the policy in force: the git guard and the environment of commands
// were set up for them when the agent started. The deny rules the guard
// holds git to are not among them: a reload gives the guard new ones.
func sameGitRules(cur, next *policy.Policy) error {
	c, n := cur.GitRules(), next.GitRules()
	if (c == nil) != (n == nil) || c != nil && (!slices.Equal(c.AllowConfig(), n.AllowConfig()) || !reflect.DeepEqual(c.Overrides(), n.Overrides())) {
		return errors.New("the git rules (bash.git, or command rules turned on or off) changed; they take effect when the agent restarts")
	}
	return nil
}
