package gateway

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A join token made for enrolment over NATS (gateway/enrol) comes with an
// enrol credential: a user JWT for a throw-away key, signed by the fleet
// account's scoped enrol signing key, whose template (enrolScope) allows
// the token's own enrolment subject and inbox only.

// EnrolJWT issues the enrol credential of join token tokenID for the
// throw-away key userPub, valid until expires.
func (a *authority) EnrolJWT(tokenID, userPub string, expires time.Time) (string, error) {
	if a.enrolSigner == nil {
		return "", errors.New("enrolment over NATS needs the fleet account's enrol signing key, which the gateway holds only for its embedded NATS server (not with --nats_url)")
	}
	if err := protocol.CheckTokenID(tokenID); err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "enrol-" + tokenID
	uc.Expires = expires.Unix()
	uc.IssuerAccount = a.accountPub
	// The enrol signing key's template (enrolScope) gives the token's
	// own subjects, from this tag, and the limits.
	uc.Tags.Add(enrolTokenTag + ":" + tokenID)
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(a.enrolSigner)
	if err != nil {
		return "", fmt.Errorf("issue the enrol credential of join token %s: %w", tokenID, err)
	}
	return token, nil
}
