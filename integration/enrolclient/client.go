// Package enrolclient enrols keys with a gateway's fleet API over HTTPS,
// as a host does, for tests and load tools: it pins the gateway's CA (the
// certificate of the served chain whose pin is given), builds and signs
// requests with the agent's nkey, and reports refusals as
// *protocol.APIError.
package enrolclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Client speaks to one gateway's fleet API.
type Client struct {
	base string
	pin  string
	hc   *http.Client
	// Now dates the requests (default time.Now).
	Now func() time.Time
	// Token, when set, is sent as the bearer token of every request
	// (the admin API of a gateway whose authentication is on).
	Token string
}

// New returns a client for the fleet API at base (https://HOST:PORT)
// whose CA has pin, with up to conns connections.
func New(base, pin string, conns int) *Client {
	tr := &http.Transport{TLSClientConfig: PinnedTLS(pin), MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}
	return &Client{base: base, pin: pin, hc: &http.Client{Transport: tr, Timeout: time.Minute}, Now: time.Now}
}

// Close closes the client's idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// PinnedTLS trusts the certificate of the served chain whose pin is pin,
// and nothing else: the leaf must verify against it for the server name.
func PinnedTLS(pin string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is verified below, against the pinned certificate.
		InsecureSkipVerify: true, //nolint:gosec
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the server sent no certificate")
			}
			roots, inter := x509.NewCertPool(), x509.NewCertPool()
			found := false
			for _, c := range cs.PeerCertificates {
				if protocol.CAPin(c) == pin {
					roots.AddCert(c)
					found = true
				} else {
					inter.AddCert(c)
				}
			}
			if !found {
				return fmt.Errorf("no certificate of the server's chain has the pin %s", pin)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: cs.ServerName})
			return err
		},
	}
}

// Sign fills p (but for the fields of the request) for kp: its public
// key, a fresh nonce, the time now, and the signature over signing(),
// called once the rest is filled in.
func Sign(kp nkeys.KeyPair, p *protocol.Proof, now time.Time, signing func() []byte) error {
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	p.PublicKey, p.Nonce, p.Time = pub, protocol.NewNonce(), now.UTC()
	sig, err := kp.Sign(signing())
	if err != nil {
		return err
	}
	p.Signature = base64.RawURLEncoding.EncodeToString(sig)
	return nil
}

// Enrol enrols kp as host (may be empty when the token names it) with
// token.
func (c *Client) Enrol(ctx context.Context, kp nkeys.KeyPair, token, host string) (*protocol.EnrolResponse, error) {
	req := &protocol.EnrolRequest{Token: token, Host: host, CAPin: c.pin}
	if err := Sign(kp, &req.Proof, c.Now(), req.SigningBytes); err != nil {
		return nil, err
	}
	var resp protocol.EnrolResponse
	return &resp, c.Post(ctx, protocol.EnrolPath, req, &resp)
}

// Recover asks for a new credential for host with kp alone.
func (c *Client) Recover(ctx context.Context, kp nkeys.KeyPair, host string) (*protocol.EnrolResponse, error) {
	req := &protocol.RecoverRequest{Host: host, CAPin: c.pin}
	if err := Sign(kp, &req.Proof, c.Now(), req.SigningBytes); err != nil {
		return nil, err
	}
	var resp protocol.EnrolResponse
	return &resp, c.Post(ctx, protocol.RecoverPath, req, &resp)
}

// Get fetches path and decodes the answer into out; a refusal is a
// *protocol.APIError.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return err
	}
	return c.do(req, out)
}

// Post sends body as JSON to path and decodes the answer into out; a
// refusal is a *protocol.APIError.
func (c *Client) Post(ctx context.Context, path string, body, out any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.do(req, out)
}

func (c *Client) do(req *http.Request, out any) error {
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var aerr protocol.APIError
		if json.Unmarshal(data, &aerr) != nil || aerr.Code == "" {
			return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
		}
		return &aerr
	}
	return json.Unmarshal(data, out)
}
