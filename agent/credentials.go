package agent

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Credentials are an agent's NATS identity (operator mode): a user JWT
// the gateway issued for the agent's public key, named after its host,
// and the nkey seed that proves the agent holds that key by signing the
// server's nonce on every connect. The seed is made on the host and
// never leaves it.
type Credentials struct {
	// JWT returns the agent's current user JWT. It is called at every
	// connect and reconnect, so a renewed credential is used from the
	// next connection on.
	JWT func() (string, error)
	// Seed is the agent's nkey user seed (SU...).
	Seed []byte
	// CA, when set, is the PEM certificate of the CA that signs the NATS
	// servers' certificates: the agent then speaks TLS to every server
	// and trusts that CA alone. Empty: tls:// URLs are checked against
	// the system's roots, nats:// URLs are plain.
	CA []byte
}

// set reports whether any credential was given.
func (c *Credentials) set() bool { return c.JWT != nil || len(c.Seed) > 0 || len(c.CA) > 0 }

// validate checks the credentials of host: a seed of a user key, the JWT
// of that key issued for host, a CA that parses.
func (c *Credentials) validate(host string) error {
	if !c.set() {
		return nil
	}
	if c.JWT == nil || len(c.Seed) == 0 {
		return errors.New("NATS credentials need both the user JWT and the seed of its key")
	}
	kp, err := nkeys.FromSeed(c.Seed)
	if err != nil {
		return fmt.Errorf("the agent's NATS key: %w", err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return errors.New("the agent's NATS key is not a user key (its seed must start with SU)")
	}
	token, err := c.JWT()
	if err != nil {
		return fmt.Errorf("the agent's NATS credential: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return fmt.Errorf("the agent's NATS credential is not a user JWT: %w", err)
	}
	if uc.Subject != pub {
		return fmt.Errorf("the agent's NATS credential was issued for key %s, not for the agent's key %s: the credential and the key come from different enrolments", uc.Subject, pub)
	}
	if uc.Name != host {
		return fmt.Errorf("this agent is named %q, but its NATS credential is for host %q: run it with --name %s, or enrol it as %s", host, uc.Name, uc.Name, host)
	}
	if len(c.CA) > 0 && !x509.NewCertPool().AppendCertsFromPEM(c.CA) {
		return errors.New("the NATS CA certificate is not PEM")
	}
	return nil
}

// natsOptions returns the connection options that present the
// credentials.
func (c *Credentials) natsOptions() []nats.Option {
	if !c.set() {
		return nil
	}
	seed := c.Seed
	sign := func(nonce []byte) ([]byte, error) {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	}
	opts := []nats.Option{nats.UserJWT(c.JWT, sign)}
	if len(c.CA) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(c.CA)
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	return opts
}

// credentialName returns the host name the credential is for, or "".
func (c *Credentials) credentialName() string {
	if c.JWT == nil {
		return ""
	}
	token, err := c.JWT()
	if err != nil {
		return ""
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return ""
	}
	return uc.Name
}
