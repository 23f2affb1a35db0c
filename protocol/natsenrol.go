package protocol

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Enrolment over NATS is for hosts that reach the NATS servers but not
// the fleet API. A token made for it (TokenCreateRequest.NATS) comes with
// an enrol credential: a user JWT and the seed of a throw-away key,
// both made for that token alone, whose permissions allow publishing
// requests on EnrolSubject(id) and receiving the answers under
// EnrolInboxPrefix(id), nothing else. The agent sends the same
// EnrolRequest as over HTTPS, as a NATS request, and gets the same
// EnrolResponse (or an APIError). The gateway revokes the credential
// once the token is spent or revoked; it expires with the token.
//
// The inbox prefix is not of the form of an agent's (AgentInboxPrefix):
// a host may be called anything, and must never be able to read another
// host's enrolment answer.

// EnrolSubject is where the holder of token id's enrol credential sends
// its enrolment request.
func EnrolSubject(id string) string { return prefix + ".enrol." + id }

// EnrolSubjectAll is what the gateways serve (in a queue group).
var EnrolSubjectAll = prefix + ".enrol.*"

// EnrolInboxPrefix is the inbox prefix of the holder of token id's enrol
// credential (nats.CustomInboxPrefix).
func EnrolInboxPrefix(id string) string { return "_ENROL_INBOX." + id }

// TokenIDOfEnrolSubject returns the token id of an enrolment subject.
func TokenIDOfEnrolSubject(subject string) (string, bool) {
	id, ok := strings.CutPrefix(subject, prefix+".enrol.")
	return id, ok && CheckTokenID(id) == nil
}

// EnrolPublishAllow and EnrolSubscribeAllow are all an enrol credential
// of token id may publish and subscribe to.
func EnrolPublishAllow(id string) []string   { return []string{EnrolSubject(id)} }
func EnrolSubscribeAllow(id string) []string { return []string{EnrolInboxPrefix(id) + ".>"} }

// Limits of an enrol credential: its largest message, and how many
// subscriptions it may hold (nats.go's request mux needs one).
const (
	EnrolMaxPayload = MaxAPIRequestBytes
	EnrolMaxSubs    = 2
)

// NATSTokenPrefix starts a NATS join token.
const NATSTokenPrefix = "fmcpn1"

// maxNATSToken bounds a NATS join token (a JWT of a few hundred bytes,
// the join token, a seed).
const maxNATSToken = 8 << 10

// NATSJoinToken is what a host needs to enrol over NATS: the join token
// and the enrol credential (the user JWT and the seed of its throw-away
// key). Encode makes one string of it (NATSTokenPrefix, ".", base64url
// of its JSON), given to fleet-agent join as its --token.
type NATSJoinToken struct {
	Token string `json:"token"`
	JWT   string `json:"jwt"`
	Seed  string `json:"seed"`
}

// Encode returns the token as one string.
func (t *NATSJoinToken) Encode() string {
	data, _ := json.Marshal(t)
	return NATSTokenPrefix + "." + base64.RawURLEncoding.EncodeToString(data)
}

// IsNATSJoinToken reports whether s looks like a NATS join token (rather
// than a plain one).
func IsNATSJoinToken(s string) bool {
	return strings.HasPrefix(strings.TrimSpace(s), NATSTokenPrefix+".")
}

// ParseNATSJoinToken decodes a NATS join token and checks the shape of
// its parts (the seed and JWT are checked by whoever uses them).
func ParseNATSJoinToken(s string) (*NATSJoinToken, error) {
	bad := func(why string) (*NATSJoinToken, error) {
		return nil, fmt.Errorf("not a NATS join token (%s): it looks like %s.<base64url>; copy it whole from `fleetctl token create --nats`", why, NATSTokenPrefix)
	}
	s = strings.TrimSpace(s)
	if len(s) > maxNATSToken {
		return bad(fmt.Sprintf("longer than %d bytes", maxNATSToken))
	}
	rest, ok := strings.CutPrefix(s, NATSTokenPrefix+".")
	if !ok {
		return bad("wrong prefix")
	}
	data, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return bad("not base64url")
	}
	var t NATSJoinToken
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil || dec.More() {
		return bad("not the JSON of one")
	}
	if _, _, err := ParseJoinToken(t.Token); err != nil {
		return nil, fmt.Errorf("NATS join token: %w", err)
	}
	var errs []error
	if strings.Count(t.JWT, ".") != 2 || strings.ContainsAny(t.JWT, " \t\r\n") {
		errs = append(errs, errors.New("its credential is not a JWT"))
	}
	if !strings.HasPrefix(t.Seed, "SU") || len(t.Seed) != 58 || strings.Trim(t.Seed, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") != "" {
		errs = append(errs, errors.New("its seed is not an nkey user seed (SU...)"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("NATS join token: %w: copy it whole from `fleetctl token create --nats`", err)
	}
	return &t, nil
}
