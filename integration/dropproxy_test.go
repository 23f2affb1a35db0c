package integration

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxies that lose an answer on its way back, for tests of what a host
// does when the gateway did the work but the host never heard. Each
// stands where a reverse proxy or a load balancer would, holding a
// certificate of the fleet CA (read from the gateway's data directory),
// so that the host's pin still holds; the gateway behind it is real.

// fleetCA is the gateway's CA, read from its data directory.
type fleetCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func loadFleetCA(t *testing.T, dataDir string) *fleetCA {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(dataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dataDir, "tls", "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		t.Fatal("the fleet CA files hold no PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &fleetCA{cert: cert, key: key, pool: pool}
}

// leaf issues a server certificate for 127.0.0.1.
func (ca *fleetCA) leaf(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "drop proxy"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}
}

// dropHTTPS is a TLS-terminating proxy in front of the fleet API at
// upstream (https://HOST:PORT): it forwards every request, and for the
// first Drop requests to path it reads the gateway's whole answer, then
// cuts the host's connection without a byte of it.
type dropHTTPS struct {
	URL     string
	dropped atomic.Int32
	drop    int32
}

func newDropHTTPS(t *testing.T, ca *fleetCA, upstream, path string, drop int) *dropHTTPS {
	t.Helper()
	p := &dropHTTPS{drop: int32(drop)}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}}, Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if r.URL.Path == path && p.dropped.Add(1) <= p.drop {
			// The gateway answered; the host hears nothing.
			panic(http.ErrAbortHandler)
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.leaf(t)}, MinVersion: tls.VersionTLS12}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the aborted handler is logged otherwise
	srv.StartTLS()
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

// dropNATS is a proxy in front of a NATS server that serves TLS after
// its INFO (the NATS default), at upstream (HOST:PORT): it passes the
// INFO on in the clear, terminates the client's TLS with a certificate of
// the fleet CA, speaks TLS to the server, and copies the protocol both
// ways. The first Drop messages (MSG or HMSG) the server delivers are
// never passed on: the connection they were for is cut instead.
type dropNATS struct {
	URL     string
	ln      net.Listener
	dropped atomic.Int32
	drop    int32
	wg      sync.WaitGroup
}

func newDropNATS(t *testing.T, ca *fleetCA, upstream string, drop int) *dropNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropNATS{URL: "tls://" + ln.Addr().String(), ln: ln, drop: int32(drop)}
	cert := ca.leaf(t)
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(c, upstream, ca, cert) })
		}
	})
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *dropNATS) serve(client net.Conn, upstream string, ca *fleetCA, cert tls.Certificate) {
	defer client.Close()
	server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		return
	}
	defer server.Close()
	deadline := time.Now().Add(time.Minute)
	_ = client.SetDeadline(deadline)
	_ = server.SetDeadline(deadline)
	info, err := bufio.NewReader(io.LimitReader(server, 64<<10)).ReadString('\n')
	// The INFO line is all the server sends before the TLS handshake,
	// so nothing read past it is lost.
	if err != nil || !strings.HasPrefix(info, "INFO ") {
		return
	}
	if _, err := io.WriteString(client, info); err != nil {
		return
	}
	ct := tls.Server(client, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	st := tls.Client(server, &tls.Config{RootCAs: ca.pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if ct.Handshake() != nil || st.Handshake() != nil {
		return
	}
	go func() {
		_, _ = io.Copy(st, ct)
		st.Close()
	}()
	r := bufio.NewReader(st)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		var payload []byte
		if f := strings.Fields(line); len(f) >= 4 && (f[0] == "MSG" || f[0] == "HMSG") {
			n, err := strconv.Atoi(f[len(f)-1])
			if err != nil || n < 0 || n > 8<<20 {
				return
			}
			payload = make([]byte, n+2) // and its CRLF
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			if p.dropped.Add(1) <= p.drop {
				// The server delivered it; the client never sees it.
				return
			}
		}
		if _, err := io.WriteString(ct, line); err != nil {
			return
		}
		if _, err := ct.Write(payload); err != nil && !errors.Is(err, net.ErrClosed) {
			return
		}
	}
}
