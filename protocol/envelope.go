package protocol

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// This file is the envelope the gateway signs every message with that
// makes an agent act: a call, a cancel, a fetch, a skills poke. The
// agent checks it before it reads anything else of the message, so that
// a NATS credential alone (a gateway-account user, a leaked creds file)
// cannot command a host.
//
// The envelope travels in the HeaderAuth header (of a call's first part;
// the other parts are bound to it by the body digest):
//
//	v1.KEYID.CLAIMS.SIGNATURE
//
// KEYID names the gateway key (KeyID), CLAIMS is the base64url (no
// padding) of the claims' canonical bytes (Claims.AppendCanonical) and
// SIGNATURE the base64url ed25519 signature of those bytes. The claims
// name the host, the call, the message, the tool, the reply subject, the
// SHA-256 and size of the message body (for a call: its JSON, the
// arguments' exact bytes in it), the call's time budget, the caller
// (issuer, subject, client id, groups), when the envelope was issued and
// when it expires, and the key again. The canonical bytes start with
// "fleetmcp-envelope-v1\n", which no other signed record of the fleet
// starts with, so a signature over them is good for nothing else.

// HeaderAuth carries a message's signed envelope.
const HeaderAuth = "Fleet-Auth"

// Message kinds an envelope signs: what the message makes the agent do.
const (
	MsgCall   = "call"
	MsgCancel = "cancel"
	MsgFetch  = "fetch"
	MsgPoke   = "poke"
)

// Envelope timing. The gateway issues envelopes valid for
// EnvelopeLifetime; an agent accepts one that claims at most
// MaxEnvelopeLifetime. Clocks of the gateway and its hosts may differ by
// up to CallClockSkew (keep them within it with NTP): an agent takes an
// envelope issued up to that much in its future, or expired up to that
// much in its past.
const (
	EnvelopeLifetime    = time.Minute
	MaxEnvelopeLifetime = 10 * time.Minute
	CallClockSkew       = 2 * time.Minute
)

// Bounds of the claims.
const (
	// MaxGroups and MaxGroupLen bound the caller's groups an envelope
	// carries; a caller with more is refused by the gateway, never
	// passed on with some left out (a host policy may rely on them).
	MaxGroups   = 256
	MaxGroupLen = 256
	// MaxClaimLen bounds the other string claims.
	MaxClaimLen = 1024
	// MaxAuthHeader bounds the HeaderAuth value.
	MaxAuthHeader = 128 << 10
	// MaxBodySize bounds the body size a call's envelope may claim.
	MaxBodySize = int64(MaxParts) * ChunkSize
)

// CallerClaims are who a call is for, as the gateway authenticated
// them: host policies decide on them.
type CallerClaims struct {
	// Issuer is the token issuer (an OIDC issuer URL), or
	// "fleetmcp:api-token" for an API token, "fleetmcp:local" for the
	// local caller of a gateway without authentication.
	Issuer   string   `json:"iss,omitempty"`
	Subject  string   `json:"sub"`
	ClientID string   `json:"client_id,omitempty"`
	Groups   []string `json:"groups,omitempty"`
}

// Issuers of callers that are not OIDC tokens.
const (
	IssuerAPIToken = "fleetmcp:api-token"
	IssuerLocal    = "fleetmcp:local"
)

// Claims are what an envelope signs.
type Claims struct {
	Kind string // MsgCall, MsgCancel, MsgFetch or MsgPoke
	Host string
	// Instance is the agent process the message is for (the instance
	// its announces name): a message recorded for one process is refused
	// by the next, whose replay cache never saw it.
	Instance string
	// CallID is the call the message is about (empty for a poke).
	CallID string
	// MsgID is random and unique per message: the key of the agent's
	// replay cache.
	MsgID string
	// Tool is the tool a call runs (empty for other kinds).
	Tool string
	// Reply is the subject the agent answers on (empty: none).
	Reply string
	// BodySHA256 and BodySize describe the message body exactly; for a
	// call sent in parts, the whole of it.
	BodySHA256 [sha256.Size]byte
	BodySize   int64
	// TimeoutMS is a call's time budget (0 for other kinds).
	TimeoutMS int64
	Caller    CallerClaims
	// IssuedAt and Expires are kept to the millisecond.
	IssuedAt, Expires time.Time
	KeyID             string
}

const envelopeMagic = "fleetmcp-envelope-v1\n"

// AppendCanonical appends the claims' canonical bytes to b: the magic
// line, then one line per field in a fixed order, "name=LEN:value\n",
// LEN the value's length in bytes, numbers in decimal, the body digest
// in lowercase hex, times in Unix milliseconds, and the groups as a
// count followed by one "group" line each.
func (c *Claims) AppendCanonical(b []byte) []byte {
	var num [20]byte
	b = append(b, envelopeMagic...)
	b = putField(b, "kind", c.Kind)
	b = putField(b, "host", c.Host)
	b = putField(b, "instance", c.Instance)
	b = putField(b, "call", c.CallID)
	b = putField(b, "msg", c.MsgID)
	b = putField(b, "tool", c.Tool)
	b = putField(b, "reply", c.Reply)
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], c.BodySHA256[:])
	b = putFieldBytes(b, "body", hexSum[:])
	b = putFieldBytes(b, "size", strconv.AppendInt(num[:0], c.BodySize, 10))
	b = putFieldBytes(b, "timeout_ms", strconv.AppendInt(num[:0], c.TimeoutMS, 10))
	b = putField(b, "iss", c.Caller.Issuer)
	b = putField(b, "sub", c.Caller.Subject)
	b = putField(b, "client_id", c.Caller.ClientID)
	b = putFieldBytes(b, "groups", strconv.AppendInt(num[:0], int64(len(c.Caller.Groups)), 10))
	for _, g := range c.Caller.Groups {
		b = putField(b, "group", g)
	}
	b = putFieldBytes(b, "iat", strconv.AppendInt(num[:0], c.IssuedAt.UnixMilli(), 10))
	b = putFieldBytes(b, "exp", strconv.AppendInt(num[:0], c.Expires.UnixMilli(), 10))
	return putField(b, "key", c.KeyID)
}

func putField(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, '=')
	b = strconv.AppendInt(b, int64(len(value)), 10)
	b = append(b, ':')
	b = append(b, value...)
	return append(b, '\n')
}

func putFieldBytes(b []byte, name string, value []byte) []byte {
	b = append(b, name...)
	b = append(b, '=')
	b = strconv.AppendInt(b, int64(len(value)), 10)
	b = append(b, ':')
	b = append(b, value...)
	return append(b, '\n')
}

// KeyID names a gateway public key in envelopes: the base64url (no
// padding) of the first 9 bytes of its SHA-256, 12 characters.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// NewMsgID returns a fresh message id: 12 random bytes in base64url.
func NewMsgID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// EnvelopeSigner signs envelopes with one gateway key.
type EnvelopeSigner struct {
	priv  ed25519.PrivateKey
	keyID string
}

// NewEnvelopeSigner returns a signer for priv.
func NewEnvelopeSigner(priv ed25519.PrivateKey) *EnvelopeSigner {
	pub, _ := priv.Public().(ed25519.PublicKey)
	return &EnvelopeSigner{priv: priv, keyID: KeyID(pub)}
}

// KeyID is the id of the signer's key.
func (s *EnvelopeSigner) KeyID() string { return s.keyID }

// Sign sets c.KeyID to the signer's key and returns the HeaderAuth value
// that carries c.
func (s *EnvelopeSigner) Sign(c *Claims) string {
	c.KeyID = s.keyID
	var buf [1024]byte
	claims := c.AppendCanonical(buf[:0])
	sig := ed25519.Sign(s.priv, claims)
	enc := base64.RawURLEncoding
	out := make([]byte, 0, 4+len(s.keyID)+enc.EncodedLen(len(claims))+enc.EncodedLen(len(sig)))
	out = append(out, "v1."...)
	out = append(out, s.keyID...)
	out = append(out, '.')
	out = enc.AppendEncode(out, claims)
	out = append(out, '.')
	out = enc.AppendEncode(out, sig)
	return string(out)
}

// RefusalReason says why an agent refused a message: for programs (the
// audit trail, tests); Refusal messages say it for people.
type RefusalReason string

const (
	// RefusedUnsigned: the message carries no envelope.
	RefusedUnsigned RefusalReason = "unsigned"
	// RefusedMalformed: the envelope cannot be read.
	RefusedMalformed RefusalReason = "malformed"
	// RefusedUnknownKey: signed with a key the host does not trust.
	RefusedUnknownKey RefusalReason = "unknown_key"
	// RefusedBadSignature: the signature does not verify.
	RefusedBadSignature RefusalReason = "bad_signature"
	// RefusedNoKeys: the host knows no gateway key at all.
	RefusedNoKeys RefusalReason = "no_keys"
	// RefusedWrongHost: signed for another host (re-targeted).
	RefusedWrongHost RefusalReason = "wrong_host"
	// RefusedOtherInstance: signed for another process of this host's
	// agent (one before a restart: recorded and replayed).
	RefusedOtherInstance RefusalReason = "other_instance"
	// RefusedMismatch: signed for another kind of message, another
	// call, or another reply subject.
	RefusedMismatch RefusalReason = "mismatch"
	// RefusedExpired: the envelope expired.
	RefusedExpired RefusalReason = "expired"
	// RefusedFuture: issued further in the future than clocks may be
	// apart.
	RefusedFuture RefusalReason = "future"
	// RefusedBeforeStart: issued before the agent started (it keeps no
	// replay cache across restarts).
	RefusedBeforeStart RefusalReason = "before_start"
	// RefusedReplayed: a message the agent has seen already.
	RefusedReplayed RefusalReason = "replayed"
	// RefusedTampered: the body does not match the signed digest.
	RefusedTampered RefusalReason = "tampered"
	// RefusedBusy: the agent's replay cache is full.
	RefusedBusy RefusalReason = "busy"
)

// EnvelopeError is a refused envelope.
type EnvelopeError struct {
	Reason RefusalReason
	Msg    string
}

func (e *EnvelopeError) Error() string { return e.Msg }

func refuse(reason RefusalReason, format string, args ...any) *EnvelopeError {
	return &EnvelopeError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// KeyLookup finds a trusted gateway public key by its KeyID.
type KeyLookup func(keyID string) (ed25519.PublicKey, bool)

// OpenEnvelope checks the signature of a HeaderAuth value with the key
// lookup finds for its key id, and only then reads the claims. It checks
// their form (Claims.Validate) but not what they say: that they are for
// this host, this message, in time and not replayed is the receiver's
// to check. Errors are *EnvelopeError.
func OpenEnvelope(header string, lookup KeyLookup) (*Claims, error) {
	if header == "" {
		return nil, refuse(RefusedUnsigned, "the message carries no %s envelope: hosts run only messages the fleet's gateway signed", HeaderAuth)
	}
	if len(header) > MaxAuthHeader {
		return nil, refuse(RefusedMalformed, "the %s envelope is %d bytes; at most %d are allowed", HeaderAuth, len(header), MaxAuthHeader)
	}
	rest, ok := strings.CutPrefix(header, "v1.")
	keyID, rest, ok2 := strings.Cut(rest, ".")
	b64Claims, b64Sig, ok3 := strings.Cut(rest, ".")
	if !ok || !ok2 || !ok3 {
		return nil, refuse(RefusedMalformed, "the %s envelope is not v1.KEYID.CLAIMS.SIGNATURE", HeaderAuth)
	}
	pub, known := lookup(keyID)
	if !known {
		return nil, refuse(RefusedUnknownKey, "signed with key %s, which is not a gateway key this host trusts", Excerpt(keyID))
	}
	enc := base64.RawURLEncoding
	sig, err := enc.DecodeString(b64Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, refuse(RefusedMalformed, "the %s envelope's signature is not %d bytes of base64url", HeaderAuth, ed25519.SignatureSize)
	}
	claims, err := enc.DecodeString(b64Claims)
	if err != nil {
		return nil, refuse(RefusedMalformed, "the %s envelope's claims are not base64url", HeaderAuth)
	}
	if !ed25519.Verify(pub, claims, sig) {
		return nil, refuse(RefusedBadSignature, "the signature of key %s does not verify: the envelope was not made by the gateway, or was changed", keyID)
	}
	c, err := ParseClaims(claims)
	if err != nil {
		return nil, refuse(RefusedMalformed, "%v", err)
	}
	if c.KeyID != keyID {
		return nil, refuse(RefusedMalformed, "the envelope names key %s outside and %s inside", keyID, Excerpt(c.KeyID))
	}
	return c, nil
}

// ParseClaims reads canonical claims bytes (AppendCanonical) and checks
// their form; bytes that are not exactly the canonical encoding of what
// they hold are refused. It never panics.
func ParseClaims(data []byte) (*Claims, error) {
	p := claimParser{data: data}
	if !strings.HasPrefix(string(data), envelopeMagic) {
		return nil, errors.New("the envelope's claims do not start with " + strconv.Quote(envelopeMagic))
	}
	p.pos = len(envelopeMagic)
	var c Claims
	c.Kind = p.str("kind")
	c.Host = p.str("host")
	c.Instance = p.str("instance")
	c.CallID = p.str("call")
	c.MsgID = p.str("msg")
	c.Tool = p.str("tool")
	c.Reply = p.str("reply")
	if sum := p.str("body"); p.err == nil {
		if len(sum) != 2*sha256.Size || strings.ToLower(sum) != sum {
			p.fail("body is not a lowercase hex SHA-256")
		} else if _, err := hex.Decode(c.BodySHA256[:], []byte(sum)); err != nil {
			p.fail("body is not a lowercase hex SHA-256")
		}
	}
	c.BodySize = p.num("size")
	c.TimeoutMS = p.num("timeout_ms")
	c.Caller.Issuer = p.str("iss")
	c.Caller.Subject = p.str("sub")
	c.Caller.ClientID = p.str("client_id")
	n := p.num("groups")
	if p.err == nil && (n < 0 || n > MaxGroups) {
		p.fail(fmt.Sprintf("%d groups; at most %d are allowed", n, MaxGroups))
	}
	for i := int64(0); i < n && p.err == nil; i++ {
		c.Caller.Groups = append(c.Caller.Groups, p.str("group"))
	}
	c.IssuedAt = time.UnixMilli(p.num("iat"))
	c.Expires = time.UnixMilli(p.num("exp"))
	c.KeyID = p.str("key")
	if p.err == nil && p.pos != len(data) {
		p.fail("data after the last claim")
	}
	if p.err != nil {
		return nil, fmt.Errorf("the envelope's claims: %w", p.err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate checks the claims' form: a known kind, a valid host, call id
// (but for a poke) and message id, bounded strings and groups, a
// positive body size within MaxBodySize, and an expiry after the issue
// time.
func (c *Claims) Validate() error {
	switch c.Kind {
	case MsgCall, MsgCancel, MsgFetch, MsgPoke:
	default:
		return fmt.Errorf("the envelope is for %s, not for a call, cancel, fetch or poke", Excerpt(c.Kind))
	}
	if err := ValidateHost(c.Host); err != nil {
		return fmt.Errorf("the envelope's host: %w", err)
	}
	if c.Instance == "" || len(c.Instance) > MaxInstanceLen || !utf8.ValidString(c.Instance) {
		return fmt.Errorf("the envelope names no agent instance, or one over %d bytes: the gateway signs each message for the agent process it heard announce the host", MaxInstanceLen)
	}
	if c.Kind != MsgPoke || c.CallID != "" {
		if err := ValidateCallID(c.CallID); err != nil {
			return fmt.Errorf("the envelope's call: %w", err)
		}
	}
	if err := ValidateCallID(c.MsgID); err != nil {
		return fmt.Errorf("the envelope's message id: %w", err)
	}
	for _, f := range [...]struct{ name, value string }{
		{"tool", c.Tool}, {"reply", c.Reply}, {"iss", c.Caller.Issuer}, {"sub", c.Caller.Subject},
		{"client_id", c.Caller.ClientID}, {"key", c.KeyID},
	} {
		if len(f.value) > MaxClaimLen || !utf8.ValidString(f.value) {
			return fmt.Errorf("the envelope's %s claim is over %d bytes or not UTF-8", f.name, MaxClaimLen)
		}
	}
	if len(c.Caller.Groups) > MaxGroups {
		return fmt.Errorf("the envelope names %d groups; at most %d are allowed", len(c.Caller.Groups), MaxGroups)
	}
	for _, g := range c.Caller.Groups {
		if len(g) > MaxGroupLen || !utf8.ValidString(g) {
			return fmt.Errorf("the envelope's group %s is over %d bytes or not UTF-8", Excerpt(g), MaxGroupLen)
		}
	}
	if c.BodySize < 0 || c.BodySize > MaxBodySize {
		return fmt.Errorf("the envelope claims a body of %d bytes; 0 to %d are allowed", c.BodySize, MaxBodySize)
	}
	if c.TimeoutMS < 0 {
		return fmt.Errorf("the envelope's time budget %d ms is negative", c.TimeoutMS)
	}
	if !c.Expires.After(c.IssuedAt) {
		return fmt.Errorf("the envelope expires (%d) no later than it was issued (%d)", c.Expires.UnixMilli(), c.IssuedAt.UnixMilli())
	}
	return nil
}

// CheckTime checks the claims' times at now, for a receiver that started
// at started: issued at most CallClockSkew in the future, not expired
// more than CallClockSkew ago, valid for at most MaxEnvelopeLifetime,
// and issued after started less CallClockSkew (a receiver keeps no
// replay cache across restarts). Errors are *EnvelopeError.
func (c *Claims) CheckTime(now, started time.Time) error {
	stamp := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	switch {
	case c.Expires.Sub(c.IssuedAt) > MaxEnvelopeLifetime:
		return refuse(RefusedMalformed, "the envelope is valid for %s; at most %s is allowed", c.Expires.Sub(c.IssuedAt), MaxEnvelopeLifetime)
	case c.IssuedAt.After(now.Add(CallClockSkew)):
		return refuse(RefusedFuture, "the envelope was issued at %s, more than %s after this host's clock (%s): set the clocks of the gateway and the host (NTP)",
			stamp(c.IssuedAt), CallClockSkew, stamp(now))
	case now.After(c.Expires.Add(CallClockSkew)):
		return refuse(RefusedExpired, "the envelope expired at %s, more than %s before this host's clock (%s): an old message, or clocks that disagree (NTP)",
			stamp(c.Expires), CallClockSkew, stamp(now))
	case c.IssuedAt.Before(started.Add(-CallClockSkew)):
		return refuse(RefusedBeforeStart, "the envelope was issued at %s, before this agent started (%s): a message from before a restart is never run",
			stamp(c.IssuedAt), stamp(started))
	}
	return nil
}

// claimParser reads "name=LEN:value\n" lines.
type claimParser struct {
	data []byte
	pos  int
	err  error
}

func (p *claimParser) fail(msg string) {
	if p.err == nil {
		p.err = errors.New(msg)
	}
}

// str reads the next field, which must be called name.
func (p *claimParser) str(name string) string {
	if p.err != nil {
		return ""
	}
	rest := p.data[p.pos:]
	if len(rest) < len(name)+1 || string(rest[:len(name)]) != name || rest[len(name)] != '=' {
		p.fail("expected the " + name + " claim")
		return ""
	}
	i := len(name) + 1
	j := i
	for j < len(rest) && j-i < 8 && rest[j] >= '0' && rest[j] <= '9' {
		j++
	}
	if j == i || j >= len(rest) || rest[j] != ':' || (rest[i] == '0' && j-i > 1) {
		p.fail("the " + name + " claim has no length")
		return ""
	}
	n, _ := strconv.Atoi(string(rest[i:j]))
	j++
	if n > len(rest)-j-1 || rest[j+n] != '\n' {
		p.fail("the " + name + " claim is cut short")
		return ""
	}
	p.pos += j + n + 1
	return string(rest[j : j+n])
}

// num reads the next field as a decimal integer in canonical form.
func (p *claimParser) num(name string) int64 {
	s := p.str(name)
	if p.err != nil {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(n, 10) != s {
		p.fail("the " + name + " claim is not a decimal number")
		return 0
	}
	return n
}
