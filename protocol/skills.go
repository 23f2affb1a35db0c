package protocol

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// This file is the wire contract of fleet-wide skill rollout.
//
// A skill bundle is a folder with a SKILL.md at its root. Its manifest
// lists every file (path, size, mode, SHA-256) sorted by path; the
// bundle's ID is the SHA-256 of the manifest's canonical bytes, so the
// same files are the same bundle wherever and whenever they are pushed.
// The gateway stores each file once by digest and signs each manifest
// with its signing key; an agent checks the signature and every file's
// digest before it installs anything.
//
// What each host should have is its desired-state record, one key per
// host in the SkillsDesiredBucket, signed too: the agent asks the gateways
// for its own record (SkillsDesiredSubject; they read it with a get, no
// consumer), when poked on SkillsPokeSubject, on (re)connect and on a
// timer. Agents have no JetStream rights: a JetStream API request an agent
// could publish would be answered on any reply subject it names, which
// NATS does not check, and so could write into any bucket. It fetches manifests
// and files from the gateways over its own subjects, and publishes what
// it did to SkillsStatusSubject, which a stream keeps the last message of
// per host.

// Bundle limits.
const (
	MaxBundleFiles = 512
	MaxBundleBytes = 16 << 20
	// MaxBundlePath bounds a file's path in a bundle, in bytes.
	MaxBundlePath = 1024
	// MaxSkillName bounds a skill's name.
	MaxSkillName = 64
)

// SkillsDesiredBucket is the KV bucket of desired states (key = host).
const SkillsDesiredBucket = "fleet_skills"

// SkillsDesiredSubject is where the agent of host asks the gateways for
// its desired state. The answer is the record as JetStream keeps it: the
// signed desired state with the header Nats-Subject naming the host's key,
// or the header Status 404 when there is none.
func SkillsDesiredSubject(host string) string { return prefix + ".agent." + host + ".skills.desired" }

// SkillsPokeSubject tells the agent of host to read its desired state
// now.
func SkillsPokeSubject(host string) string { return prefix + ".host." + host + ".skills.poke" }

// SkillsManifestSubject is where the agent of host asks the gateways for
// a bundle's signed manifest (SkillManifestRequest → SignedManifest or
// APIError).
func SkillsManifestSubject(host string) string { return prefix + ".agent." + host + ".skills.manifest" }

// SkillsBlobSubject is where the agent of host asks the gateways for a
// part of a file by digest (SkillBlobRequest → the bytes, or an APIError
// with the header SkillsErrorHeader set).
func SkillsBlobSubject(host string) string { return prefix + ".agent." + host + ".skills.blob" }

// SkillsStatusSubject is where the agent of host publishes its
// SkillStatus.
func SkillsStatusSubject(host string) string { return prefix + ".agent." + host + ".skills.status" }

// SkillsStatusStream keeps the last SkillStatus of every host.
const SkillsStatusStream = "FLEET_SKILL_STATUS"

// Subjects the gateways serve, in a queue group, and the status stream's.
var (
	SkillsDesiredSubjectAll  = SkillsDesiredSubject("*")
	SkillsManifestSubjectAll = SkillsManifestSubject("*")
	SkillsBlobSubjectAll     = SkillsBlobSubject("*")
	SkillsStatusSubjectAll   = SkillsStatusSubject("*")
)

// SkillsErrorHeader marks a blob reply that is an APIError, not bytes.
const SkillsErrorHeader = "Fleet-Error"

// MaxBlobChunk is the most a blob reply carries; larger files are read
// in parts.
const MaxBlobChunk = 512 << 10

// BundleFile is one file of a bundle.
type BundleFile struct {
	// Path is relative, slash-separated (CheckBundlePath).
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Mode is 0644, or 0755 for an executable.
	Mode uint32 `json:"mode"`
	// SHA256 is the lowercase hex digest of the contents.
	SHA256 string `json:"sha256"`
}

// Manifest describes a bundle: the skill's name and its files, sorted by
// path.
type Manifest struct {
	Name  string       `json:"name"`
	Files []BundleFile `json:"files"`
}

// CanonicalBytes is what the bundle ID hashes and the gateway signs: a
// header line with the name, then one line per file in path order,
// "LEN:PATH SIZE MODE SHA256" (mode in octal), LEN the path's length in
// bytes.
func (m *Manifest) CanonicalBytes() []byte {
	var b strings.Builder
	b.WriteString("fleetmcp-skill-v1 name=" + strconv.Itoa(len(m.Name)) + ":" + m.Name + "\n")
	for _, f := range m.Files {
		fmt.Fprintf(&b, "%d:%s %d %o %s\n", len(f.Path), f.Path, f.Size, f.Mode, f.SHA256)
	}
	return []byte(b.String())
}

// BundleID is the bundle's ID: "sha256:" and the hex digest of the
// manifest's canonical bytes.
func (m *Manifest) BundleID() string {
	sum := sha256.Sum256(m.CanonicalBytes())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// TotalSize is the sum of the files' sizes.
func (m *Manifest) TotalSize() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// Validate checks the manifest against the bundle rules: a valid skill
// name, at least a SKILL.md at the root, every path valid and unique
// even ignoring case (a bundle must install alike on every system),
// sorted, modes 0644 or 0755, digests well formed, within the limits.
func (m *Manifest) Validate() error {
	if err := ValidateSkillName(m.Name); err != nil {
		return err
	}
	if len(m.Files) == 0 {
		return errors.New("the bundle has no files; a skill needs at least a SKILL.md")
	}
	if len(m.Files) > MaxBundleFiles {
		return fmt.Errorf("the bundle has %d files; the limit is %d", len(m.Files), MaxBundleFiles)
	}
	var total int64
	folded := make(map[string]string, len(m.Files))
	hasSkill := false
	for i, f := range m.Files {
		if err := CheckBundlePath(f.Path); err != nil {
			return err
		}
		if i > 0 && m.Files[i-1].Path >= f.Path {
			return fmt.Errorf("files are not sorted by path, or %q appears twice", f.Path)
		}
		key := strings.ToLower(f.Path)
		if other, dup := folded[key]; dup {
			return fmt.Errorf("%q and %q differ only in case; systems that ignore case would see one file", other, f.Path)
		}
		folded[key] = f.Path
		if f.Path == "SKILL.md" {
			hasSkill = true
		}
		if f.Size < 0 {
			return fmt.Errorf("%s: negative size", f.Path)
		}
		if f.Mode != 0o644 && f.Mode != 0o755 {
			return fmt.Errorf("%s: mode %o; a bundle's files are 0644, or 0755 when executable", f.Path, f.Mode)
		}
		if !validDigest(f.SHA256) {
			return fmt.Errorf("%s: %q is not a lowercase hex SHA-256", f.Path, Ellipsis(f.SHA256, 40))
		}
		total += f.Size
		if total > MaxBundleBytes {
			return fmt.Errorf("the bundle is over %d MiB", MaxBundleBytes>>20)
		}
	}
	// A file cannot also be a folder of others.
	for _, f := range m.Files {
		for dir := f.Path; ; {
			i := strings.LastIndexByte(dir, '/')
			if i < 0 {
				break
			}
			dir = dir[:i]
			if _, clash := folded[strings.ToLower(dir)]; clash {
				return fmt.Errorf("%q is a file and also the folder of %q", dir, f.Path)
			}
		}
	}
	if !hasSkill {
		return errors.New("the bundle has no SKILL.md at its root")
	}
	return nil
}

// SortFiles sorts files by path, as a manifest keeps them.
func SortFiles(files []BundleFile) {
	slices.SortFunc(files, func(a, b BundleFile) int { return strings.Compare(a.Path, b.Path) })
}

func validDigest(s string) bool {
	if len(s) != 2*sha256.Size || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// CheckBundlePath checks one path of a bundle: relative and
// slash-separated; no empty, "." or ".." parts; printable UTF-8 without
// backslashes or characters Windows refuses (<>:"|?*); no part that
// Windows reads as a device (CON, NUL, COM1...) or ending in a dot or a
// space; at most MaxBundlePath bytes and 255 bytes a part.
func CheckBundlePath(p string) error {
	bad := func(why string) error { return fmt.Errorf("bundle path %q: %s", Ellipsis(p, 40), why) }
	switch {
	case p == "":
		return bad("empty")
	case len(p) > MaxBundlePath:
		return bad("longer than " + strconv.Itoa(MaxBundlePath) + " bytes")
	case !utf8.ValidString(p):
		return bad("not UTF-8")
	case p[0] == '/':
		return bad("absolute; paths are relative to the skill's folder")
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f || strings.ContainsRune(`\<>:"|?*`, r) {
			return bad(fmt.Sprintf("has %q; use letters, digits and common punctuation", r))
		}
	}
	for _, part := range strings.Split(p, "/") {
		switch {
		case part == "":
			return bad("has an empty part (//, or a trailing /)")
		case part == "." || part == "..":
			return bad("has a . or .. part")
		case len(part) > 255:
			return bad("has a part longer than 255 bytes")
		case strings.HasSuffix(part, ".") || strings.HasSuffix(part, " "):
			return bad("has a part ending in a dot or a space, which Windows drops")
		case windowsDevice(part):
			return bad("has a part Windows reads as a device name")
		}
	}
	return nil
}

// windowsDevice reports whether name, or its part before the first dot,
// is a reserved device name.
func windowsDevice(name string) bool {
	base, _, _ := strings.Cut(name, ".")
	base = strings.ToUpper(strings.TrimRight(base, " "))
	switch base {
	case "CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$":
		return true
	}
	if len(base) == 4 && (strings.HasPrefix(base, "COM") || strings.HasPrefix(base, "LPT")) {
		c := base[3]
		return c >= '0' && c <= '9'
	}
	return false
}

// ValidateSkillName checks a skill name by the Agent Skills rules: 1 to
// MaxSkillName lowercase letters, digits and hyphens, with no hyphen
// first, last or next to another.
func ValidateSkillName(name string) error {
	switch {
	case name == "":
		return errors.New("name is missing or empty")
	case len(name) > MaxSkillName:
		return fmt.Errorf("name is %d characters; the limit is %d", len(name), MaxSkillName)
	case strings.HasPrefix(name, "-") || strings.HasSuffix(name, "-"):
		return fmt.Errorf("name %q starts or ends with a hyphen", name)
	case strings.Contains(name, "--"):
		return fmt.Errorf("name %q has two hyphens in a row", name)
	}
	for _, r := range name {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return fmt.Errorf("name %q has %q; use only lowercase letters, digits and hyphens", name, r)
		}
	}
	return nil
}

// Gateway signing keys. A gateway signs skill manifests and desired
// states (and, later, calls) with an ed25519 key; agents learn the public
// keys when they enrol (EnrolResponse.SigningKeys). A key is written
// "ed25519:" and the base64url (no padding) of the 32-byte public key.
const SigningKeyPrefix = "ed25519:"

// FormatSigningKey writes a public key as SigningKeys lists it.
func FormatSigningKey(pub ed25519.PublicKey) string {
	return SigningKeyPrefix + base64.RawURLEncoding.EncodeToString(pub)
}

// ParseSigningKey reads a key written by FormatSigningKey.
func ParseSigningKey(s string) (ed25519.PublicKey, error) {
	b64, ok := strings.CutPrefix(s, SigningKeyPrefix)
	if !ok {
		return nil, fmt.Errorf("signing key %q does not start with %q", Ellipsis(s, 40), SigningKeyPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(b64)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("signing key %q is not a base64url ed25519 public key", Ellipsis(s, 40))
	}
	return ed25519.PublicKey(b), nil
}

// Signature is a gateway's signature: which key made it, and the
// base64url (no padding) ed25519 signature.
type Signature struct {
	Key string `json:"key"`
	Sig string `json:"sig"`
}

// Signing purposes of the gateway's key.
const (
	PurposeManifest = "skill-manifest"
	PurposeDesired  = "skill-desired"
)

// SignBytes signs msg for purpose with priv.
func SignBytes(priv ed25519.PrivateKey, purpose string, msg []byte) Signature {
	pub, _ := priv.Public().(ed25519.PublicKey)
	sig := ed25519.Sign(priv, purposeBytes(purpose, msg))
	return Signature{Key: FormatSigningKey(pub), Sig: base64.RawURLEncoding.EncodeToString(sig)}
}

// VerifyBytes checks that s signs msg for purpose with one of trusted
// (keys as FormatSigningKey writes them).
func VerifyBytes(trusted []string, purpose string, msg []byte, s Signature) error {
	if !slices.Contains(trusted, s.Key) {
		return fmt.Errorf("signed by %s, which is not a gateway key this agent trusts (it learns them when it enrols)", Ellipsis(s.Key, 40))
	}
	pub, err := ParseSigningKey(s.Key)
	if err != nil {
		return err
	}
	sig, err := base64.RawURLEncoding.DecodeString(s.Sig)
	if err != nil || !ed25519.Verify(pub, purposeBytes(purpose, msg), sig) {
		return fmt.Errorf("the %s signature does not verify: the data was changed after it was signed", purpose)
	}
	return nil
}

func purposeBytes(purpose string, msg []byte) []byte {
	return append([]byte("fleetmcp-v1 "+purpose+"\n"), msg...)
}

// SignedManifest is a manifest as the gateways serve it.
type SignedManifest struct {
	Manifest  Manifest  `json:"manifest"`
	BundleID  string    `json:"bundle_id"`
	Signature Signature `json:"signature"`
}

// SkillManifestRequest asks for a bundle's signed manifest.
type SkillManifestRequest struct {
	BundleID string `json:"bundle_id"`
}

// SkillBlobRequest asks for Length bytes (at most MaxBlobChunk) of the
// file with digest SHA256, from Offset.
type SkillBlobRequest struct {
	SHA256 string `json:"sha256"`
	Offset int64  `json:"offset"`
	Length int64  `json:"length"`
}

// DesiredSkill is one skill a host should have: a bundle, or none
// (Remove) — and which rollout asked for it.
type DesiredSkill struct {
	BundleID string `json:"bundle_id,omitempty"`
	Remove   bool   `json:"remove,omitempty"`
	Rollout  string `json:"rollout"`
}

// DesiredState is a host's desired-state record.
type DesiredState struct {
	Host string `json:"host"`
	// Revision grows with every change, so an agent never goes back to an
	// older record it was handed again.
	Revision uint64                  `json:"revision"`
	Skills   map[string]DesiredSkill `json:"skills"`
	At       time.Time               `json:"at"`
}

// CanonicalBytes is what the gateway signs of a desired state: its
// fields, skills in name order, each length-prefixed.
func (d *DesiredState) CanonicalBytes() []byte {
	var b strings.Builder
	put := func(name, value string) {
		b.WriteString(name + "=" + strconv.Itoa(len(value)) + ":" + value + "\n")
	}
	put("host", d.Host)
	put("revision", strconv.FormatUint(d.Revision, 10))
	put("at", d.At.UTC().Format(time.RFC3339Nano))
	names := make([]string, 0, len(d.Skills))
	for n := range d.Skills {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		s := d.Skills[n]
		put("skill", n)
		put("bundle_id", s.BundleID)
		put("remove", strconv.FormatBool(s.Remove))
		put("rollout", s.Rollout)
	}
	return []byte(b.String())
}

// SignedDesiredState is the value kept under the host's key.
type SignedDesiredState struct {
	State     DesiredState `json:"state"`
	Signature Signature    `json:"signature"`
}

// Skill install states, as SkillState.State says them.
const (
	SkillPending    = "pending"
	SkillInstalling = "installing"
	SkillInstalled  = "installed"
	SkillFailed     = "failed"
	SkillRefused    = "refused"
	SkillRemoved    = "removed"
	// SkillTampered: the installed files differ from the signed manifest
	// (changed on disk); the host refuses to serve them and installs the
	// bundle again at its next check of the desired state.
	SkillTampered = "tampered"
)

// SkillState is what a host did about one skill.
type SkillState struct {
	// BundleID is the bundle the state is about; Active the one serving
	// now (the previous one when an install failed).
	BundleID string `json:"bundle_id,omitempty"`
	Active   string `json:"active,omitempty"`
	Rollout  string `json:"rollout,omitempty"`
	State    string `json:"state"`
	// Reason says why for failed, refused and tampered.
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
}

// SkillStatus is a host's report, published to SkillsStatusSubject after
// every change and on (re)connect.
type SkillStatus struct {
	Host string `json:"host"`
	// Revision is the desired state's revision the agent last acted on.
	Revision uint64                `json:"revision"`
	Skills   map[string]SkillState `json:"skills"`
	At       time.Time             `json:"at"`
}
