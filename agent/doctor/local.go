package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// reenrol is the fix for an identity beyond repair.
const reenrol = "delete the identity directory and enrol again: fleet-agent join --gateway URL --ca_pin PIN --token_file - (fleetctl token create prints it and the token)"

// checkStateDir: the state directory exists, is a directory, is private
// (0700) and belongs to the agent's user.
func checkStateDir(dir string, uid int) Result {
	r := Result{Check: "state dir"}
	fi, err := os.Lstat(dir)
	switch {
	case dir == "":
		return fail(r, "no state directory", "set --state_dir (or HOME)")
	case errors.Is(err, fs.ErrNotExist):
		return fail(r, dir+" does not exist", "enrol this host (fleet-agent join), or give the --state_dir it was enrolled with")
	case err != nil:
		return fail(r, err.Error(), "run doctor as the agent's user, with its --state_dir")
	case !fi.IsDir():
		return fail(r, dir+" is not a directory", "give the agent's --state_dir")
	}
	return stateDirMode(r, dir, fi, uid)
}

// stateDirMode decides on the mode and owner of the state directory.
func stateDirMode(r Result, dir string, fi fs.FileInfo, uid int) Result {
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return fail(r, fmt.Sprintf("%s has mode %04o: others may read the agent's key", dir, perm),
			fmt.Sprintf("chmod 700 %s", dir))
	}
	if owner, ok := fileOwner(fi); ok && uid >= 0 && owner != uid {
		return warn(r, fmt.Sprintf("%s belongs to uid %d, not to the user running doctor (uid %d)", dir, owner, uid),
			"run doctor as the agent's user (the service's user: sudo -u fleetmcp-agent), or chown the directory to it")
	}
	return ok(r, dir+" (0700)")
}

// enrolledIdentity is what the identity checks found good.
type enrolledIdentity struct {
	Enrolment *identity.Enrolment
}

// checkIdentity checks the identity files without changing any (unlike
// identity.Load, which makes a readable key private), and returns the
// enrolment when every file is good.
func checkIdentity(stateDir string, now time.Time) (*enrolledIdentity, []Result) {
	store := identity.Open(stateDir)
	files := Result{Check: "identity files"}
	var missing []string
	for _, name := range []string{identity.KeyFile, identity.JWTFile, identity.EnrolmentFile} {
		if _, err := os.Stat(filepath.Join(store.Dir(), name)); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, []Result{fail(files, fmt.Sprintf("%s lacks %s", store.Dir(), strings.Join(missing, ", ")),
			"enrol this host: fleet-agent join --gateway URL --ca_pin PIN --token_file - (fleetctl token create prints it and the token)")}
	}
	keyPath := filepath.Join(store.Dir(), identity.KeyFile)
	rs := []Result{ok(files, store.Dir())}
	if fi, err := os.Stat(keyPath); err == nil && runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		rs = append(rs, fail(Result{Check: "agent key"}, fmt.Sprintf("%s has mode %04o: others may read it", keyPath, fi.Mode().Perm()),
			fmt.Sprintf("chmod 600 %s; whoever read it can act as this host until its credential is revoked (fleetctl agent revoke, then enrol again)", keyPath)))
		return nil, rs
	}
	data, err := os.ReadFile(filepath.Join(store.Dir(), identity.EnrolmentFile))
	if err != nil {
		return nil, append(rs, fail(Result{Check: "enrolment"}, err.Error(), "run doctor as the agent's user"))
	}
	e, err := identity.ParseEnrolment(data)
	if err != nil {
		return nil, append(rs, fail(Result{Check: "enrolment"}, identity.EnrolmentFile+": "+err.Error(), reenrol))
	}
	rs = append(rs, ok(Result{Check: "enrolment"}, fmt.Sprintf("host %s, gateway %s, %d NATS URL(s)", e.Host, orNone(e.GatewayURL), len(e.NATSURLs))))
	pub, r := checkKey(keyPath)
	rs = append(rs, r)
	if pub == "" {
		return nil, rs
	}
	uc, r := checkCredential(filepath.Join(store.Dir(), identity.JWTFile), pub, e.Host)
	rs = append(rs, r)
	if uc == nil {
		return nil, rs
	}
	var issued, expires time.Time
	if uc.IssuedAt > 0 {
		issued = time.Unix(uc.IssuedAt, 0)
	}
	if uc.Expires > 0 {
		expires = time.Unix(uc.Expires, 0)
	}
	rs = append(rs, credentialExpiry(issued, expires, now))
	return &enrolledIdentity{Enrolment: e}, rs
}

func orNone(s string) string {
	if s == "" {
		return "none (enrolled in the gateway's process)"
	}
	return s
}

// checkKey parses the agent's key and returns its public key ("" when it
// is no good).
func checkKey(path string) (string, Result) {
	r := Result{Check: "agent key"}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fail(r, err.Error(), "run doctor as the agent's user")
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(data))))
	if err != nil {
		return "", fail(r, fmt.Sprintf("%s is damaged: %v", path, err), reenrol)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", fail(r, path+" holds no user key (an SU... seed)", reenrol)
	}
	return pub, ok(r, pub)
}

// checkCredential makes sure the JWT at path is a user JWT for pub and
// host.
func checkCredential(path, pub, host string) (*jwt.UserClaims, Result) {
	r := Result{Check: "credential"}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fail(r, err.Error(), "run doctor as the agent's user")
	}
	uc, err := jwt.DecodeUserClaims(strings.TrimSpace(string(data)))
	switch {
	case err != nil:
		return nil, fail(r, fmt.Sprintf("%s is not a user JWT: %v", path, err), reenrol)
	case uc.Subject != pub:
		return nil, fail(r, fmt.Sprintf("the credential is for key %s, not this agent's key %s", uc.Subject, pub), reenrol)
	case uc.Name != host:
		return nil, fail(r, fmt.Sprintf("the credential is for host %q, but the agent enrolled as %q", uc.Name, host), reenrol)
	}
	return uc, ok(r, fmt.Sprintf("for this key and host %s", host))
}

// credentialExpiry decides on a credential issued at issued (zero: not
// said) that expires at expires (zero: never): a warning once less than a
// third of its lifetime is left, when a running agent should have renewed
// it; a failure once it has expired.
func credentialExpiry(issued, expires, now time.Time) Result {
	r := Result{Check: "credential ttl"}
	if expires.IsZero() {
		return ok(r, "never expires")
	}
	left := expires.Sub(now)
	at := expires.UTC().Format(time.RFC3339)
	if left <= 0 {
		return fail(r, "expired at "+at,
			"start the agent: it recovers a new credential over the fleet API if the gateway allows recovery; if its log says the gateway refused, enrol again with a new token")
	}
	if !issued.IsZero() && left < expires.Sub(issued)/3 {
		return warn(r, fmt.Sprintf("%s left of %s (expires %s)", daysLeft(left), daysLeft(expires.Sub(issued)), at),
			"a running agent renews it over NATS once under a third is left: check that the agent runs and its log for a refused renewal; a stopped one recovers a new credential at start if the gateway allows recovery")
	}
	return ok(r, fmt.Sprintf("%s left (expires %s)", daysLeft(left), at))
}

// checkPolicy parses the host policy file as the agent would.
func checkPolicy(file string, parse func(string) ([]string, error)) Result {
	r := Result{Check: "host policy"}
	if file == "" {
		return ok(r, "none: the host is unrestricted (set --policy or FLEET_POLICY to restrict it)")
	}
	if parse == nil {
		return warn(r, "not checked", "")
	}
	summary, err := parse(file)
	if err != nil {
		return fail(r, err.Error(), "fix the file (see deploy/policies/README.md); the agent refuses to start with it")
	}
	return ok(r, file+": "+strings.Join(summary, "; "))
}

// checkLock says whether an agent runs on the state directory.
func checkLock(dir string, holder func(string) (bool, int, error)) Result {
	r := Result{Check: "state lock"}
	if holder == nil || dir == "" {
		return warn(r, "not checked", "")
	}
	held, pid, err := holder(dir)
	switch {
	case err != nil:
		return warn(r, err.Error(), "run doctor as the agent's user")
	case held && pid > 0:
		return ok(r, fmt.Sprintf("held: an agent is running on this state directory (pid %d)", pid))
	case held:
		return ok(r, "held: an agent is running on this state directory")
	}
	return ok(r, "free: no agent is running on this state directory")
}

func ok(r Result, detail string) Result {
	r.Status, r.Detail = OK, detail
	return r
}

func warn(r Result, detail, fix string) Result {
	r.Status, r.Detail, r.Fix = Warn, detail, fix
	return r
}

func fail(r Result, detail, fix string) Result {
	r.Status, r.Detail, r.Fix = Fail, detail, fix
	return r
}
