package access

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Static API tokens, for teams without an identity provider. The tokens
// file (YAML or JSON) stores only SHA-256 hashes, each with the token's
// name and its own grants:
//
//	tokens:
//	  - {name: ci-bot, sha256: "<64 hex digits>", hosts: ["env=staging"], tools: [read, bash]}
//	  - {name: ops-laptop, sha256: "...", hosts: ["*"], tools: ["*"], admin: true}
//
// A token is APITokenPrefix followed by 43 base64url characters (32
// random bytes); NewAPIToken makes one and the line for the file.

// APITokenPrefix starts every static API token, which tells them apart
// from JWTs (and lets secret scanners and the audit redaction find them).
const APITokenPrefix = "fmcp_"

// apiToken is one entry of the tokens file.
type apiToken struct {
	name  string
	grant *rule
}

// APITokens are the static API tokens the gateway accepts.
type APITokens struct {
	// Source names where the tokens came from, for messages.
	Source string
	byHash map[[sha256.Size]byte]*apiToken
	names  []string
	// path is the file LoadAPITokens read, which a reload reads again.
	path string
}

// Path returns the file LoadAPITokens read the tokens from ("" when they
// were parsed from memory): a reload reads it again.
func (t *APITokens) Path() string { return t.path }

type tokensFile struct {
	Tokens []tokenSpec `yaml:"tokens"`
}

type tokenSpec struct {
	Name      string `yaml:"name"`
	SHA256    string `yaml:"sha256"`
	grantSpec `yaml:",inline"`
}

// LoadAPITokens reads and parses the tokens file at path.
func LoadAPITokens(path string) (*APITokens, error) {
	data, err := readSmallFile(path)
	if err != nil {
		return nil, fmt.Errorf("API tokens: %w", err)
	}
	t, err := ParseAPITokens(path, data)
	if err != nil {
		return nil, err
	}
	t.path = path
	return t, nil
}

// ParseAPITokens parses a tokens file; name is used in messages.
func ParseAPITokens(name string, data []byte) (*APITokens, error) {
	var f tokensFile
	if err := decodeStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(f.Tokens) == 0 {
		return nil, fmt.Errorf("%s has no tokens: add a tokens: list (fleet-gateway --new_api_token NAME prints an entry)", name)
	}
	t := &APITokens{Source: name, byHash: map[[sha256.Size]byte]*apiToken{}}
	seen := map[string]int{}
	var errs []error
	for i, spec := range f.Tokens {
		tok, hash, err := compileToken(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("token %d: %w", i+1, err))
			continue
		}
		if prev, dup := seen[tok.name]; dup {
			errs = append(errs, fmt.Errorf("token %d: name %q is already used by token %d", i+1, tok.name, prev))
			continue
		}
		if other := t.byHash[hash]; other != nil {
			errs = append(errs, fmt.Errorf("token %d (%s): same hash as %s: each name needs its own token", i+1, tok.name, other.name))
			continue
		}
		seen[tok.name] = i + 1
		t.byHash[hash] = tok
		t.names = append(t.names, tok.name)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

func compileToken(spec tokenSpec) (*apiToken, [sha256.Size]byte, error) {
	var hash [sha256.Size]byte
	if err := validateTokenName(spec.Name); err != nil {
		return nil, hash, err
	}
	raw, err := hex.DecodeString(strings.TrimSpace(spec.SHA256))
	if err != nil || len(raw) != sha256.Size {
		return nil, hash, fmt.Errorf("%s: sha256 must be 64 hex digits (the SHA-256 of the token; --new_api_token prints it)", spec.Name)
	}
	copy(hash[:], raw)
	g, err := compileGrant(spec.grantSpec, false)
	if err != nil {
		return nil, hash, fmt.Errorf("%s: %w", spec.Name, err)
	}
	g.name = "token " + spec.Name
	return &apiToken{name: spec.Name, grant: g}, hash, nil
}

// validateTokenName accepts 1 to 64 letters, digits, '-', '_', '.' and '@'.
func validateTokenName(name string) error {
	if name == "" {
		return errors.New("name is missing: give every token a name (it is the caller's subject)")
	}
	if len(name) > 64 {
		return fmt.Errorf("name %.20q... is longer than 64 characters", name)
	}
	for i, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.@", r)) {
			return fmt.Errorf("name %q has %q at position %d: use letters, digits, '-', '_', '.' and '@'", name, string(r), i+1)
		}
	}
	return nil
}

// lookup returns the entry of a presented token, or nil. Only the token's
// hash is compared, so the time taken says nothing about stored tokens.
func (t *APITokens) lookup(token string) *apiToken {
	if t == nil {
		return nil
	}
	return t.byHash[sha256.Sum256([]byte(token))]
}

// Summary describes the tokens, one line each, for the startup log.
func (t *APITokens) Summary() []string {
	if t == nil {
		return nil
	}
	out := make([]string, 0, len(t.names))
	for _, tok := range t.byHash {
		out = append(out, tok.grant.String())
	}
	slices.Sort(out)
	return out
}

// NewAPIToken generates a token for name and returns it with the line to
// add under tokens: in the tokens file. The line grants read on every
// host; narrow or widen it there.
func NewAPIToken(name string) (token, line string, err error) {
	return newAPIToken(name, `tools: [read]`)
}

// NewAdminAPIToken is NewAPIToken for an admin: its entry allows every
// tool on every host and the admin API (fleetctl).
func NewAdminAPIToken(name string) (token, line string, err error) {
	return newAPIToken(name, `tools: ["*"], admin: true`)
}

func newAPIToken(name, grants string) (token, line string, err error) {
	if err := validateTokenName(name); err != nil {
		return "", "", err
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	token = APITokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	sum := sha256.Sum256([]byte(token))
	line = fmt.Sprintf(`- {name: %s, sha256: "%s", hosts: ["*"], %s}`, strconv.Quote(name), hex.EncodeToString(sum[:]), grants)
	return token, line, nil
}
