package protocol

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file is the wire contract of enrolment: how a host gets its
// credential from the gateway's fleet API (HTTPS, POST EnrolPath and
// RecoverPath) and renews it over NATS (RenewSubject). Every request
// proves possession of the agent's key: it is signed with the agent's
// nkey seed over SigningBytes, and carries a fresh nonce and the time.

// Paths of the fleet API.
const (
	EnrolPath   = "/v1/enrol"
	RecoverPath = "/v1/recover"
	// LocatePath is where an enrolled host asks for the NATS URLs to
	// dial now, when those it stored no longer answer.
	LocatePath = "/v1/locate"
	// AdminPath prefixes the admin API (admin.go).
	AdminPath = "/v1/admin/"
)

// MaxClockSkew is how far a request's time may be from the gateway's.
const MaxClockSkew = 5 * time.Minute

// MaxAPIRequestBytes bounds a request body of the fleet API.
const MaxAPIRequestBytes = 64 << 10

// RenewSubject is where the agent of host asks for a new credential over
// its NATS connection; its permissions prove the host, the signature the
// key.
func RenewSubject(host string) string { return prefix + ".agent." + host + ".renew" }

// RenewSubjectAll is what the gateways serve (in a queue group).
var RenewSubjectAll = prefix + ".agent.*.renew"

// Proof is the proof of possession every enrolment request carries: the
// agent's nkey user public key (U...), a random nonce (NonceBytes,
// base64url without padding) never used before, the time of the request
// (RFC 3339, UTC), and the signature of the agent's key over the
// request's SigningBytes (base64url without padding).
type Proof struct {
	PublicKey string    `json:"public_key"`
	Nonce     string    `json:"nonce"`
	Time      time.Time `json:"time"`
	Signature string    `json:"signature"`
}

// NonceBytes is the size of a request's nonce.
const NonceBytes = 16

// NewNonce returns a fresh nonce for a Proof.
func NewNonce() string {
	b := make([]byte, NonceBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// CheckNonce reports whether nonce has the form NewNonce gives.
func CheckNonce(nonce string) error {
	b, err := base64.RawURLEncoding.DecodeString(nonce)
	if err != nil || len(b) != NonceBytes {
		return fmt.Errorf("nonce %q is not %d random bytes in base64url", Ellipsis(nonce, 40), NonceBytes)
	}
	return nil
}

// EnrolRequest is the body of POST EnrolPath.
type EnrolRequest struct {
	// Token is the join token (JoinToken form).
	Token string `json:"token"`
	// Host is the name the agent asks for: required when the token gives
	// a name pattern, and when the token names the host it must be that
	// name or empty.
	Host string `json:"host,omitempty"`
	// CAPin is the pin of the CA the agent checked the gateway's
	// certificate against.
	CAPin string     `json:"ca_pin"`
	Facts AgentFacts `json:"facts,omitzero"`
	Proof
}

// RecoverRequest is the body of POST RecoverPath: an agent whose
// credential expired asks for a new one with its still-enrolled key.
type RecoverRequest struct {
	Host  string `json:"host"`
	CAPin string `json:"ca_pin"`
	Proof
}

// LocateRequest is the body of POST LocatePath: an enrolled host whose
// NATS URLs no longer answer asks for the current ones with its key. It
// gets no credential, so no operator's leave is needed.
type LocateRequest struct {
	Host  string `json:"host"`
	CAPin string `json:"ca_pin"`
	Proof
}

// LocateResponse answers a LocateRequest.
type LocateResponse struct {
	Host string `json:"host"`
	// NATSURLs are the URLs to dial; NATSCA the PEM of the CA of their
	// certificates (empty: NATS is not TLS).
	NATSURLs []string `json:"nats_urls"`
	NATSCA   string   `json:"nats_ca,omitempty"`
}

// RenewRequest is sent to RenewSubject(host) before the credential
// expires.
type RenewRequest struct {
	Host string `json:"host"`
	Proof
}

// EnrolResponse answers an enrolment or a recovery.
type EnrolResponse struct {
	Host string `json:"host"`
	// JWT is the agent's NATS user JWT; Expires when it expires.
	JWT     string    `json:"jwt"`
	Expires time.Time `json:"expires"`
	// NATSURLs are the URLs to dial; NATSCA the PEM of the CA of their
	// certificates (empty: NATS is not TLS).
	NATSURLs []string `json:"nats_urls"`
	NATSCA   string   `json:"nats_ca,omitempty"`
	// Labels are the host's labels as recorded (the operator's).
	Labels map[string]string `json:"labels,omitempty"`
	// SigningKeys are the public keys the gateway signs calls with, and
	// SigningKeySerial the serial of the key set they come from
	// (keyset.go; 0: none yet). Newer sets reach the agent over NATS.
	SigningKeys      []string `json:"signing_keys"`
	SigningKeySerial uint64   `json:"signing_key_serial,omitempty"`
}

// RenewResponse answers a RenewRequest that succeeded (an APIError
// otherwise).
type RenewResponse struct {
	JWT     string    `json:"jwt"`
	Expires time.Time `json:"expires"`
}

// Signing purposes: a signature made for one kind of request is never
// valid for another.
const (
	PurposeEnrol   = "enrol"
	PurposeRecover = "recover"
	PurposeRenew   = "renew"
	PurposeLocate  = "locate"
)

// SigningBytes is what the agent signs for an enrolment: every field but
// the signature, in a fixed order, each length-prefixed so no two
// requests encode alike.
func (r *EnrolRequest) SigningBytes() []byte {
	return signingBytes(PurposeEnrol, &r.Proof, "token", r.Token, "host", r.Host, "ca_pin", r.CAPin,
		"os", r.Facts.OS, "arch", r.Facts.Arch, "hostname", r.Facts.Hostname, "kernel", r.Facts.Kernel)
}

// SigningBytes is what the agent signs for a recovery.
func (r *RecoverRequest) SigningBytes() []byte {
	return signingBytes(PurposeRecover, &r.Proof, "host", r.Host, "ca_pin", r.CAPin)
}

// SigningBytes is what the agent signs to ask for its NATS URLs.
func (r *LocateRequest) SigningBytes() []byte {
	return signingBytes(PurposeLocate, &r.Proof, "host", r.Host, "ca_pin", r.CAPin)
}

// SigningBytes is what the agent signs for a renewal.
func (r *RenewRequest) SigningBytes() []byte {
	return signingBytes(PurposeRenew, &r.Proof, "host", r.Host)
}

// signingBytes encodes "fleetmcp-v1 PURPOSE\n" and then one line per
// field, "name=LEN:value\n", LEN the value's length in bytes: the public
// key, nonce and time (RFC 3339 in UTC, to the nanosecond) first, then
// the request's own fields in the order given.
func signingBytes(purpose string, p *Proof, fields ...string) []byte {
	var b strings.Builder
	b.WriteString("fleetmcp-v1 " + purpose + "\n")
	put := func(name, value string) {
		b.WriteString(name + "=" + strconv.Itoa(len(value)) + ":" + value + "\n")
	}
	put("public_key", p.PublicKey)
	put("nonce", p.Nonce)
	put("time", p.Time.UTC().Format(time.RFC3339Nano))
	for i := 0; i+1 < len(fields); i += 2 {
		put(fields[i], fields[i+1])
	}
	return []byte(b.String())
}

// CheckTime checks a request's time against now: a clock further apart
// than MaxClockSkew is refused, saying both clocks.
func (p *Proof) CheckTime(now time.Time) error {
	d := now.Sub(p.Time)
	if d < 0 {
		d = -d
	}
	if d > MaxClockSkew {
		return fmt.Errorf("the request is dated %s and the gateway's clock says %s: more than %s apart; set the host's clock (NTP) and try again",
			p.Time.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), MaxClockSkew)
	}
	return nil
}

// API error codes: what went wrong, for a program; the message says what
// to do, for a person.
// APICode says, for a program, why the fleet API refused a request.
type APICode string

const (
	APIBadRequest     APICode = "bad_request"
	APITokenUnknown   APICode = "token_unknown"
	APITokenExpired   APICode = "token_expired"
	APITokenSpent     APICode = "token_spent"
	APITokenRevoked   APICode = "token_revoked"
	APINameNotAllowed APICode = "name_not_allowed"
	APINameTaken      APICode = "name_taken"
	APIHostRevoked    APICode = "host_revoked"
	APIKeyRevoked     APICode = "key_revoked"
	APIClockSkew      APICode = "clock_skew"
	APIReplayed       APICode = "replayed"
	APIBadSignature   APICode = "bad_signature"
	APIWrongCA        APICode = "wrong_ca"
	APINoRecovery     APICode = "recovery_not_allowed"
	APIUnknownHost    APICode = "unknown_host"
	APIUnauthorized   APICode = "unauthorized"
	APIForbidden      APICode = "forbidden"
	APINotFound       APICode = "not_found"
	APIUnavailable    APICode = "unavailable"
	// APITooEarly: a renewal before half the credential's life; the
	// agent keeps its credential and asks again later.
	APITooEarly APICode = "too_early"
	// APIRateLimited: more requests of this kind from the host than the
	// gateway takes; ask again later.
	APIRateLimited APICode = "rate_limited"
	// APIGatewayMisconfigured: the gateway would hand the host an
	// address it cannot use (a NATS URL that resolves to loopback on the
	// gateway); nothing was spent, the operator must fix the gateway's
	// flags first.
	APIGatewayMisconfigured APICode = "gateway_misconfigured"
)

// APIError is the body of every refused fleet API request (and of a
// refused renewal).
type APIError struct {
	Code    APICode `json:"code"`
	Message string  `json:"message"`
}

func (e *APIError) Error() string { return e.Message + " (" + string(e.Code) + ")" }

// Join tokens are "fmcp1.ID.SECRET": ID is TokenIDLen characters of
// lowercase base32 (public: lists and logs show it), SECRET is
// TokenSecretBytes random bytes in base64url without padding (never
// stored: the gateway keeps its SHA-256).
const (
	TokenPrefix      = "fmcp1"
	TokenIDLen       = 10
	TokenSecretBytes = 32
)

var tokenIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewJoinToken returns a fresh token's id and secret, and the token.
func NewJoinToken() (id string, secret []byte, token string) {
	raw := make([]byte, 8) // 64 bits give 13 characters; 10 are kept (50 bits)
	_, _ = rand.Read(raw)
	id = tokenIDEncoding.EncodeToString(raw)[:TokenIDLen]
	secret = make([]byte, TokenSecretBytes)
	_, _ = rand.Read(secret)
	return id, secret, TokenPrefix + "." + id + "." + base64.RawURLEncoding.EncodeToString(secret)
}

// ParseJoinToken splits a join token into its id and secret.
func ParseJoinToken(token string) (id string, secret []byte, err error) {
	bad := func(why string) (string, []byte, error) {
		return "", nil, fmt.Errorf("not a join token (%s): it looks like %s.<id>.<secret>; copy it whole from `fleetctl token create`", why, TokenPrefix)
	}
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 || parts[0] != TokenPrefix {
		return bad("wrong shape")
	}
	if err := CheckTokenID(parts[1]); err != nil {
		return bad(err.Error())
	}
	secret, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(secret) != TokenSecretBytes {
		return bad("the secret is not " + strconv.Itoa(TokenSecretBytes) + " bytes in base64url")
	}
	return parts[1], secret, nil
}

// CheckTokenID reports whether id has a token id's form.
func CheckTokenID(id string) error {
	if len(id) != TokenIDLen {
		return fmt.Errorf("token id %q is not %d characters", Ellipsis(id, 40), TokenIDLen)
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return fmt.Errorf("token id %q has a character outside a-z and 2-7", Ellipsis(id, 40))
		}
	}
	return nil
}

// ErrNotEnrolled is what an agent says when its state directory holds no
// identity.
var ErrNotEnrolled = errors.New("this host is not enrolled: run `fleet-agent join --gateway https://GATEWAY:8443 --ca_pin PIN --token_file -` and paste a token from `fleetctl token create`")
