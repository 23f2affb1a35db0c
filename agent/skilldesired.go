package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The host's desired skills are one key of a JetStream KV bucket. The
// agent asks the gateways for it on its own subject
// (protocol.SkillsDesiredSubject): no consumer, no watch, and no JetStream
// rights for agents. The reply is the stored record with the header
// naming its key, a 404 status when the key has none, or a gateway's
// error.

// maxDesiredBytes bounds a desired-state record.
const maxDesiredBytes = 1 << 20

// errNoDesired reports that the host has no desired-state record (never
// written, or deleted): nothing is desired.
var errNoDesired = errors.New("no desired-state record for this host")

// decodeDesiredReply reads the reply to the read of host's key: the
// signed record, or errNoDesired when the key has none (a 404 status, or
// a delete or purge marker). It checks the reply's form only; the
// signature and the record's contents are verifyDesired's.
func decodeDesiredReply(host string, hdr nats.Header, data []byte) (*protocol.SignedDesiredState, error) {
	if hdr.Get(protocol.SkillsErrorHeader) != "" {
		var e protocol.APIError
		if err := json.Unmarshal(data, &e); err != nil || e.Code == "" {
			return nil, fmt.Errorf("the gateway refused the read of the desired state with an answer that is not an error: %s", protocol.Excerpt(string(data)))
		}
		return nil, fmt.Errorf("the gateway refused the read of the desired state: %s (%s)", protocol.Excerpt(e.Message), protocol.Excerpt(string(e.Code)))
	}
	if status := hdr.Get("Status"); status != "" {
		if status == "404" {
			return nil, errNoDesired
		}
		return nil, fmt.Errorf("JetStream answered the read of the desired state with status %s %s",
			protocol.Excerpt(status), protocol.Excerpt(hdr.Get("Description")))
	}
	if subj := hdr.Get("Nats-Subject"); subj != "" && subj != desiredKeySubject(host) {
		return nil, fmt.Errorf("JetStream answered with the record of %s, not this host's", protocol.Excerpt(subj))
	}
	switch hdr.Get("KV-Operation") {
	case "":
	case "DEL", "PURGE":
		return nil, errNoDesired
	default:
		return nil, fmt.Errorf("the desired-state record has an unknown KV operation %s", protocol.Excerpt(hdr.Get("KV-Operation")))
	}
	if len(data) > maxDesiredBytes {
		return nil, fmt.Errorf("the desired-state record is %d bytes; the most an agent reads is %d", len(data), maxDesiredBytes)
	}
	var s protocol.SignedDesiredState
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("the desired-state record is not a signed desired state: %w", err)
	}
	if err := checkDesiredForm(&s.State); err != nil {
		return nil, err
	}
	return &s, nil
}

// desiredKeySubject is the subject JetStream keeps host's record under.
func desiredKeySubject(host string) string {
	return "$KV." + protocol.SkillsDesiredBucket + "." + host
}

// checkDesiredForm checks what the agent relies on in a record: valid
// skill names, and for each either a well-formed bundle ID or Remove.
func checkDesiredForm(d *protocol.DesiredState) error {
	if len(d.Skills) > protocol.MaxSkills {
		return fmt.Errorf("the desired state names %d skills; the most a host serves is %d", len(d.Skills), protocol.MaxSkills)
	}
	for name, s := range d.Skills {
		if err := protocol.ValidateSkillName(name); err != nil {
			return fmt.Errorf("the desired state names a skill badly: %w", err)
		}
		switch {
		case s.Remove && s.BundleID != "":
			return fmt.Errorf("skill %s: the desired state both removes it and names bundle %s", name, protocol.Excerpt(s.BundleID))
		case !s.Remove && !validBundleID(s.BundleID):
			return fmt.Errorf("skill %s: %s is not a bundle ID (sha256: and 64 lowercase hex digits)", name, protocol.Excerpt(s.BundleID))
		}
	}
	return nil
}

// validBundleID reports whether id is "sha256:" and a lowercase hex
// SHA-256.
func validBundleID(id string) bool {
	h, ok := strings.CutPrefix(id, "sha256:")
	return ok && isSHA256(h)
}

// verifyDesired checks a record before the agent acts on it: signed by
// a gateway key the agent trusts, for this host, and not older than the
// last record acted on.
func verifyDesired(s *protocol.SignedDesiredState, keys []string, host string, last uint64) error {
	if len(keys) == 0 {
		return errors.New("no gateway signing key: re-enrol this host (fleet-agent join) so that it learns the gateway's keys")
	}
	if err := protocol.VerifyBytes(keys, protocol.PurposeDesired, s.State.CanonicalBytes(), s.Signature); err != nil {
		return fmt.Errorf("desired state: %w", err)
	}
	if s.State.Host != host {
		return fmt.Errorf("the desired state is for host %s, not this one (%q)", protocol.Excerpt(s.State.Host), host)
	}
	if s.State.Revision < last {
		return fmt.Errorf("the desired state's revision %d is older than revision %d already acted on; it is ignored", s.State.Revision, last)
	}
	return nil
}

// skillsRevisionFile, in the state directory, keeps the revision of the
// last desired state the agent acted on, so that an older record handed
// to it again is never acted on, across restarts too.
const skillsRevisionFile = "skills-revision"

// loadRevision reads the persisted revision; 0 when there is none.
func loadRevision(stateDir string) (uint64, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, skillsRevisionFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the last skills revision: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s is damaged (%q): delete it and the agent acts on the next desired state it reads",
			filepath.Join(stateDir, skillsRevisionFile), protocol.Excerpt(string(data)))
	}
	return n, nil
}

// saveRevision persists rev.
func saveRevision(stateDir string, rev uint64) error {
	return safefs.WriteStateFile(filepath.Join(stateDir, skillsRevisionFile), []byte(strconv.FormatUint(rev, 10)+"\n"))
}
