package gateway

import (
	"errors"
	"fmt"

	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// This file reloads what an operator may change without a restart (on
// SIGHUP): the access rules and API tokens files (with the rate limits
// they set), the signing keys (a rotation: gateway/signing), whose new key
// set is pushed to every host online, and the audit file, which is
// opened again so that log rotation works. MCP sessions stay open; each request afterwards is
// decided with the new rules, as the call path reads them once per call
// from atomic pointers.

// Reload reads the access rules and API tokens files again and puts them
// in force together, and reopens the audit file. A file that cannot be
// read or parsed is refused with one log line naming it and the problem;
// the rules and tokens in force then stay as they were. The returned
// error joins every problem (nil: all reloaded). Once Shutdown has begun
// it reloads nothing and says so.
func (g *Gateway) Reload() error {
	g.life.reloadMu.Lock()
	defer g.life.reloadMu.Unlock()
	if g.life.stopping {
		return errReloadStopping
	}
	var errs []error
	rules, tokens := g.subsys.access.Load(), (*access.APITokens)(nil)
	if g.subsys.auth != nil {
		tokens = g.subsys.auth.Tokens()
	}
	var newAccess *access.Rules
	var newTokens *access.APITokens
	var bad bool
	if rules != nil && rules.Path() != "" {
		var err error
		if newAccess, err = access.LoadRules(rules.Path()); err != nil {
			g.log.Error(refusedReload, "file", rules.Path(), "err", err)
			errs, bad = append(errs, err), true
		}
	}
	if tokens != nil && tokens.Path() != "" {
		var err error
		if newTokens, err = access.LoadAPITokens(tokens.Path()); err != nil {
			g.log.Error(refusedReload, "file", tokens.Path(), "err", err)
			errs, bad = append(errs, err), true
		}
	}
	if !bad && (newAccess != nil || newTokens != nil) {
		if newAccess != nil {
			g.subsys.access.Store(newAccess)
		}
		if newTokens != nil {
			g.subsys.auth.SetTokens(newTokens)
		}
		g.log.Info("reloaded access rules and API tokens")
		g.logGrants()
	}
	_, before := g.subsys.signer.Chain()
	if err := g.subsys.signer.Reload(); err != nil {
		g.log.Error("reload: the signing keys could not be read; the keys in force stay", "file", g.subsys.signer.Path(), "err", err)
		errs = append(errs, fmt.Errorf("signing keys: %w", err))
	} else if _, after := g.subsys.signer.Chain(); after != before {
		g.log.Info("reloaded the signing keys", "key_set", after, "signs_with", g.subsys.signer.CurrentKeyID())
		g.subsys.keys.Push()
		if g.subsys.skillStore != nil {
			g.subsys.skillStore.ResignInBackground()
		}
	}
	if err := g.subsys.audit.Reopen(); err != nil {
		g.log.Error("reload: the audit file could not be reopened; records still go to the file open before", "file", g.cfg.Audit.File, "err", err)
		errs = append(errs, fmt.Errorf("reopen: %w", err))
	}
	return errors.Join(errs...)
}

// refusedReload is the message of a file a reload refuses.
const refusedReload = "reload refused: the access rules and API tokens in force stay"

// errReloadStopping: a reload asked for while the gateway shuts down.
var errReloadStopping = errors.New("the gateway is shutting down: nothing was reloaded")
