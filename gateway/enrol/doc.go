// Package enrol holds enrolment: the join tokens, enrolment over HTTPS
// and NATS (with the answer of a retried enrolment), recovery and locate,
// credential renewal over NATS, the request nonces, and the agent records
// (with the gateway's index of them) and the seal that authenticates the
// records and tokens.
//
// It must not import the gateway nor its other subsystems (natsauth,
// audit, access, skills): credentials are issued through an Issuer, the
// audit record of each request goes to a Recorder, and the renewal
// bounds, the limiter of refused requests and what the gateway hands out
// to hosts come in through Config, all wired by the gateway. It may
// import protocol, policy, gateway/internal/jskv and leaf packages.
package enrol
