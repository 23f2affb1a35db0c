package natsauth

import (
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The fleet account's claims and the scopes of its signing keys: what
// the users each key signs may do.

// fleetAccountClaims are the fleet account's claims as the gateway
// builds them (embedded) or nats-setup writes them (external): JetStream
// without limits, no bearer tokens, and the scoped agent signing key
// whose template is the agent permissions, answering calls for up to
// maxCall.
func fleetAccountClaims(accountPub, agentSignerPub string, maxCall time.Duration) *jwt.AccountClaims {
	ac := jwt.NewAccountClaims(accountPub)
	ac.Name = fleetAccountName
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
	ac.Limits.DisallowBearer = true
	ac.SigningKeys.AddScopedSigner(agentScope(agentSignerPub, maxCall))
	return ac
}

// agentScope is the scope of the agent signing key: the agent
// permissions, with {{name()}} for the host.
func agentScope(signerPub string, maxCall time.Duration) *jwt.UserScope {
	s := jwt.NewUserScope()
	s.Key = signerPub
	s.Role = protocol.AgentSigningRole
	s.Description = "fleetmcp agents: each user may use its own host's subjects only"
	s.Template.Pub.Allow.Add(protocol.AgentPublishTemplate()...)
	s.Template.Sub.Allow.Add(protocol.AgentSubscribeTemplate()...)
	s.Template.Resp = &jwt.ResponsePermission{MaxMsgs: -1, Expires: maxCall}
	return s
}

// gatewayScope is the scope of the gateway signing key (embedded
// server): anything in the fleet account but what runtimeDenied holds.
func gatewayScope(signerPub string) *jwt.UserScope {
	s := jwt.NewUserScope()
	s.Key = signerPub
	s.Role = "gateway"
	s.Description = "fleetmcp gateways: everything but erasing, cutting or replacing the audit trail and the token and agent buckets"
	s.Template.Pub.Deny.Add(runtimeDenied()...)
	return s
}

// enrolScope is the scope of the enrol signing key (embedded server):
// each user may ask for its own join token's enrolment only, the token
// named by its tag token:ID.
func enrolScope(signerPub string) *jwt.UserScope {
	s := jwt.NewUserScope()
	s.Key = signerPub
	s.Role = "enrol"
	s.Description = "fleetmcp enrol credentials: each may enrol with its own join token only"
	s.Template.Pub.Allow.Add(protocol.EnrolPublishAllow(enrolTokenTemplate)...)
	s.Template.Sub.Allow.Add(protocol.EnrolSubscribeAllow(enrolTokenTemplate)...)
	s.Template.Limits.Subs = protocol.EnrolMaxSubs
	s.Template.Limits.Payload = protocol.EnrolMaxPayload
	s.Template.AllowedConnectionTypes.Add(jwt.ConnectionTypeStandard)
	return s
}

// enrolTokenTag names the tag of an enrol credential that holds its
// join token's ID; enrolTokenTemplate stands for it in enrolScope.
const (
	enrolTokenTag      = "token"
	enrolTokenTemplate = "{{tag(" + enrolTokenTag + ")}}"
)

// systemScope is the scope of the system signing key (embedded
// server): what the gateway asks of the system account (the fleet
// account's claims and connections, the servers' varz and connz) and
// answers (other nodes' claim pushes), nothing else: a system user may
// otherwise publish on the servers' raft subjects ($NRG.>), where an
// entry deletes any stream, or kick connections and put servers in lame
// duck mode.
func systemScope(signerPub, fleetPub string) *jwt.UserScope {
	s := jwt.NewUserScope()
	s.Key = signerPub
	s.Role = "gateway-system"
	s.Description = "fleetmcp gateways' system users: the fleet account's claims and connections, never JetStream"
	s.Template.Pub.Allow.Add(systemAllowed(fleetPub)...)
	s.Template.Pub.Deny.Add(systemDenied()...)
	// Nor may it hear requests meant for the servers, to answer them
	// first (a connz answered with an error would hide a live host).
	s.Template.Sub.Allow.Add("_INBOX.>", "$SYS.ACCOUNT."+fleetPub+".>", "$SYS.SERVER.*.CLIENT.AUTH.ERR",
		"$SYS.REQ.ACCOUNT."+fleetPub+".CLAIMS.UPDATE")
	return s
}

// systemAllowed is what the gateways' system users of the embedded
// server may publish.
func systemAllowed(fleetPub string) []string {
	acc := "$SYS.REQ.ACCOUNT." + fleetPub + "."
	return []string{acc + "CLAIMS.UPDATE", acc + "CLAIMS.LOOKUP", acc + "CONNZ",
		"$SYS.REQ.SERVER.PING.VARZ", "$SYS.REQ.SERVER.*.CONNZ", "_INBOX.>"}
}

// scopedUser issues the JWT of a user of account, signed by the scoped
// signing key signer (whose template gives its permissions), with a
// key made for this process only, and returns the options that connect
// with it and its public key.
func scopedUser(name string, signer nkeys.KeyPair, account string) (nats.Option, string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, "", err
	}
	uc := jwt.NewUserClaims(publicKey(kp))
	uc.Name = name
	uc.IssuerAccount = account
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(signer)
	if err != nil {
		return nil, "", fmt.Errorf("%s user JWT: %w", name, err)
	}
	seed, _ := kp.Seed()
	return nats.UserJWTAndSeed(token, string(seed)), publicKey(kp), nil
}

// userJWT issues a user JWT for kp, signed by issuer (an account key, or
// with issuerAccount set a signing key of that account), that may publish
// anything but deny.
func userJWT(kp nkeys.KeyPair, name string, issuer nkeys.KeyPair, issuerAccount string, deny ...string) (string, error) {
	uc := jwt.NewUserClaims(publicKey(kp))
	uc.Name = name
	uc.IssuerAccount = issuerAccount
	if len(deny) > 0 {
		uc.Pub.Deny.Add(deny...)
	}
	return uc.Encode(issuer)
}

// protectedStreams are the streams whose loss or rollback the gateways
// cannot see through their records alone: the audit trail, and the
// buckets of the join tokens and agent records, whose checks (a token
// names the revision it is stored at and its stream's creation time)
// hold only while the stream itself is neither deleted nor restored
// from a snapshot, which brings back both.
func protectedStreams() []string {
	return []string{protocol.AuditStream, "KV_" + protocol.TokensBucket, "KV_" + protocol.AgentsBucket, revokedStream}
}

// runtimeDenied are the JetStream API subjects that delete, cut, change
// or replace a protected stream, delete its messages, or take replicas
// from it. The users the gateways run with may not publish them (their
// JetStream requests go nowhere): only a credential kept off the running
// gateways can (see README, Audit, and the security model). A snapshot
// is only a read, which those users may do anyway. The same requests
// through a JetStream domain's prefix ($JS.<domain>.API, which a server
// with a domain maps onto its own API) are denied too.
func runtimeDenied() []string {
	var out []string
	for _, prefix := range []string{"$JS.API.", "$JS.*.API."} {
		for _, stream := range protectedStreams() {
			for _, op := range []string{"DELETE", "UPDATE", "PURGE", "MSG.DELETE", "RESTORE", "PEER.REMOVE"} {
				out = append(out, prefix+"STREAM."+op+"."+stream)
			}
		}
	}
	return out
}

// systemDenied is what the gateways' system users may not publish: they
// push and look up account JWTs and never use JetStream, whose system
// account API can purge an account's streams ($JS.API.ACCOUNT.PURGE) or
// remove servers.
func systemDenied() []string { return []string{"$JS.API.>", "$JS.*.API.>"} }
