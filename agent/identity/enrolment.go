package identity

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Enrolment is what an agent learnt when it enrolled, kept in
// enrolment.json.
type Enrolment struct {
	// Host is the agent's host name in the fleet; its credential is for
	// this name.
	Host string `json:"host"`
	// GatewayURL is the gateway's enrolment endpoint (https://...), and
	// CAPin the pin of the CA its certificate was checked against (empty
	// for an agent enrolled in-process).
	GatewayURL string `json:"gateway_url,omitempty"`
	CAPin      string `json:"ca_pin,omitempty"`
	// NATSURLs are the URLs the agent dials.
	NATSURLs []string `json:"nats_urls"`
	// NATSCA is the PEM certificate of the CA of the NATS servers (empty:
	// NATS without TLS, or the system's roots).
	NATSCA string `json:"nats_ca,omitempty"`
	// Labels are the host's labels as enrolled (the gateway's record is
	// authoritative; they are here for people).
	Labels map[string]string `json:"labels,omitempty"`
	// EnrolledAt is when the agent enrolled; Expires when the credential
	// it got then expires.
	EnrolledAt time.Time `json:"enrolled_at"`
	Expires    time.Time `json:"expires,omitzero"`
	// SigningKeys are the gateway's signing keys (protocol.FormatSigningKey)
	// as the agent learnt them when it enrolled, or from a later key set
	// (SigningKeySerial; 0: none): it runs only calls, and installs only
	// skill rollouts, signed by one of them. An enrolment without any
	// (from before calls were signed) runs nothing: enrol again.
	SigningKeys      []string `json:"signing_keys,omitempty"`
	SigningKeySerial uint64   `json:"signing_key_serial,omitempty"`
}

// maxEnrolmentBytes bounds enrolment.json.
const maxEnrolmentBytes = 1 << 20

// ParseEnrolment reads enrolment.json and checks every field.
func ParseEnrolment(data []byte) (*Enrolment, error) {
	if len(data) > maxEnrolmentBytes {
		return nil, fmt.Errorf("%d bytes, more than an enrolment ever has (%d)", len(data), maxEnrolmentBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var e Enrolment
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("not an enrolment: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not an enrolment: data after the JSON object")
	}
	if err := e.validate(); err != nil {
		return nil, err
	}
	return &e, nil
}

// validate checks every field.
func (e *Enrolment) validate() error {
	if err := protocol.ValidateHost(e.Host); err != nil {
		return fmt.Errorf("host: %w", err)
	}
	if e.GatewayURL != "" {
		u, err := url.Parse(e.GatewayURL)
		if err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("gateway_url %q: want https://HOST[:PORT]", e.GatewayURL)
		}
	}
	if e.CAPin != "" && !protocol.ValidCAPin(e.CAPin) {
		return fmt.Errorf("ca_pin %q: want sha256: and 64 lowercase hex digits", e.CAPin)
	}
	if len(e.NATSURLs) == 0 {
		return errors.New("nats_urls: none; the agent would not know where to connect")
	}
	for _, u := range e.NATSURLs {
		if err := protocol.ValidateNATSURL(u); err != nil {
			return fmt.Errorf("nats_urls: %w", err)
		}
	}
	if e.NATSCA != "" {
		if err := checkCAPEM([]byte(e.NATSCA)); err != nil {
			return fmt.Errorf("nats_ca: %w", err)
		}
	}
	for _, k := range e.SigningKeys {
		if _, err := protocol.ParseSigningKey(k); err != nil {
			return fmt.Errorf("signing_keys: %w", err)
		}
	}
	if err := protocol.ValidateLabels(e.Labels); err != nil {
		return fmt.Errorf("labels: %w", err)
	}
	return nil
}

// checkCAPEM makes sure pemData holds CA certificates and nothing else.
func checkCAPEM(pemData []byte) error {
	n := 0
	for rest := bytes.TrimSpace(pemData); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return errors.New("not PEM")
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("a PEM %q block, not a certificate", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return err
		}
		if !c.IsCA {
			return fmt.Errorf("certificate %q is not a CA", c.Subject.CommonName)
		}
		n++
	}
	if n == 0 {
		return errors.New("no certificate")
	}
	return nil
}

func (e *Enrolment) encode() ([]byte, error) {
	if err := e.validate(); err != nil {
		return nil, fmt.Errorf("enrolment: %w", err)
	}
	data, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
