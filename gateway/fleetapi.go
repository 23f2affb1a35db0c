package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/internal/netutil"
	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// The fleet API listener (Config.APIListen): hosts enrol and recover
// there (enrol.go), operators and fleetctl use the admin API (admin.go).
// It always serves TLS: a certificate from the fleet CA, whose pin hosts
// check before they send a token, or one given with APITLSCert.

// fleetAPI is the running fleet API listener.
type fleetAPI struct {
	ln   net.Listener
	srv  *http.Server
	done chan error
	// pins are the pins a request's ca_pin may carry (every certificate
	// of the served chain); pin is the one to show (the CA's).
	pins []string
	pin  string
	// failures limits the refused enrolment requests per source.
	failures *failureLimiter
}

// startFleetAPI listens on Config.APIListen (nothing when it is empty).
func (g *Gateway) startFleetAPI() error {
	g.serving.api = &fleetAPI{failures: newFailureLimiter()}
	if g.cfg.APIListen == "" {
		return nil
	}
	conf, err := g.apiTLS()
	if err != nil {
		return err
	}
	ln, err := netutil.Listen(g.cfg.APIListen, "the fleet API", "another fleet-gateway or web server", "--api_listen")
	if err != nil {
		return err
	}
	g.serving.api.ln = ln
	g.serving.api.done = make(chan error, 1)
	g.serving.api.srv = &http.Server{
		Handler:           g.APIHandler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    32 << 10,
		// Handshakes of scanners and plain-HTTP clients are no news.
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	tl := tls.NewListener(ln, conf)
	go func() { g.serving.api.done <- g.serving.api.srv.Serve(tl) }()
	return nil
}

// apiTLS returns the fleet API's TLS configuration, and sets its pins.
func (g *Gateway) apiTLS() (*tls.Config, error) {
	if g.cfg.APITLSCert != "" {
		conf, chain, err := loadServerChain(g.cfg.APITLSCert, g.cfg.APITLSKey, "--api_tls_cert", "--api_tls_key")
		if err != nil {
			return nil, fmt.Errorf("fleet API TLS: %w", err)
		}
		for _, c := range chain {
			g.serving.api.pins = append(g.serving.api.pins, protocol.CAPin(c))
		}
		// The last certificate of the chain is the one closest to the
		// root: hosts pin it.
		g.serving.api.pin = g.serving.api.pins[len(g.serving.api.pins)-1]
		return conf, nil
	}
	ca := g.conns.natsCA
	if ca == nil {
		var err error
		if ca, err = natsauth.LoadOrCreateCA(g.cfg.DataDir); err != nil {
			return nil, err
		}
		g.serving.apiCA = ca
	}
	host, _, _ := net.SplitHostPort(g.cfg.APIListen)
	conf, err := ca.ServerTLS(natsauth.LeafNames(host, g.advertisedNames()))
	if err != nil {
		return nil, fmt.Errorf("fleet API TLS: %w", err)
	}
	g.serving.api.pin = ca.Pin()
	g.serving.api.pins = []string{g.serving.api.pin}
	return conf, nil
}

// loadServerChain reads a listener's certificate chain and key (PEM
// files, given with certFlag and keyFlag) and returns its TLS
// configuration and the chain, leaf first.
func loadServerChain(certFile, keyFile, certFlag, keyFlag string) (*tls.Config, []*x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s, %s %s: %w", certFlag, certFile, keyFlag, keyFile, err)
	}
	var chain []*x509.Certificate
	for _, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", certFlag, certFile, err)
		}
		chain = append(chain, c)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, chain, nil
}

// stopFleetAPI stops the listener, waiting for requests in progress until
// ctx ends.
func (g *Gateway) stopFleetAPI(ctx context.Context) error {
	if g.serving.api == nil || g.serving.api.srv == nil {
		return nil
	}
	err := g.serving.api.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = g.serving.api.srv.Close()
	}
	if serr := <-g.serving.api.done; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// APIHandler returns the fleet API's HTTP handler (served over TLS by the
// listener): enrolment, recovery and the admin API.
func (g *Gateway) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(protocol.EnrolPath, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.EnrolRequest
		g.serveEnrolment(w, r, "enrol", &req, func(ctx context.Context, out *enrol.Outcome) (any, *protocol.APIError) {
			// Before the token is spent: an answer the host cannot use
			// must not cost it.
			if aerr := g.checkHandOut(ctx, sourceOf(r)); aerr != nil {
				out.Key, out.Host = req.PublicKey, req.Host
				out.TokenID, _, _ = protocol.ParseJoinToken(req.Token)
				return nil, aerr
			}
			return g.subsys.enrol.Enrol(ctx, &req, out)
		})
	})
	mux.HandleFunc(protocol.LocatePath, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.LocateRequest
		g.serveEnrolment(w, r, "locate", &req, func(ctx context.Context, out *enrol.Outcome) (any, *protocol.APIError) {
			return g.subsys.enrol.Locate(ctx, &req, sourceOf(r), out)
		})
	})
	mux.HandleFunc(protocol.RecoverPath, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.RecoverRequest
		g.serveEnrolment(w, r, "recover", &req, func(ctx context.Context, out *enrol.Outcome) (any, *protocol.APIError) {
			if aerr := g.checkHandOut(ctx, sourceOf(r)); aerr != nil {
				out.Key, out.Host = req.PublicKey, req.Host
				return nil, aerr
			}
			return g.subsys.enrol.Recover(ctx, &req, out)
		})
	})
	mux.Handle(protocol.AdminPath, g.adminHandler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, apiErr(protocol.APINotFound, "no fleet API endpoint at %s %s: hosts POST %s, %s or %s; operators use %s...",
			r.Method, protocol.Ellipsis(r.URL.Path, 80), protocol.EnrolPath, protocol.RecoverPath, protocol.LocatePath, protocol.AdminPath))
	})
	return mux
}

// serveEnrolment runs one enrolment or recovery request: it decodes the
// body into req, runs handle, answers, logs and audits.
func (g *Gateway) serveEnrolment(w http.ResponseWriter, r *http.Request, what string, req any,
	handle func(context.Context, *enrol.Outcome) (any, *protocol.APIError)) {
	src := sourceOf(r)
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeAPIError(w, apiErr(protocol.APIBadRequest, "%s takes POST, not %s", r.URL.Path, r.Method))
		return
	}
	if wait, ok := g.serving.api.failures.allowed(src, g.now()); !ok {
		w.Header().Set("Retry-After", fmt.Sprint(int(wait.Seconds())+1))
		aerr := apiErr(protocol.APIUnavailable, "too many refused requests from %s: wait %s and check the token, name and clock before trying again", src, wait.Round(time.Second))
		writeAPIErrorStatus(w, http.StatusTooManyRequests, aerr)
		return
	}
	out := enrol.Outcome{}
	var resp any
	aerr := decodeAPIBody(w, r, req)
	if aerr == nil {
		resp, aerr = handle(r.Context(), &out)
	}
	g.auditEnrolment(what, src, &out, aerr)
	if aerr != nil {
		if aerr.Code != protocol.APIUnavailable && aerr.Code != protocol.APIGatewayMisconfigured {
			g.serving.api.failures.fail(src, g.now())
		}
		writeAPIError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, resp)
	if out.TokenStopped {
		// The token's enrol credential, once a retry may no longer come.
		g.reconcileAt(g.now().Add(g.cfg.EnrolRetryWindow))
	}
}

// auditEnrolment logs and audits an enrolment, recovery or renewal.
func (g *Gateway) auditEnrolment(what, src string, out *enrol.Outcome, aerr *protocol.APIError) {
	rec := &audit.Record{Time: g.now().UTC(), CallID: newCallID(), Caller: audit.Caller{Kind: string(access.KindAgent), Subject: out.Key},
		Tool: what, Target: out.TokenID, Source: src, Decision: audit.DecisionAllowed, Outcome: audit.OutcomeOK}
	if out.Host != "" {
		rec.Hosts = []string{out.Host}
	}
	if len(out.Labels) > 0 || out.Retried {
		rec.Args = map[string]any{}
		if len(out.Labels) > 0 {
			rec.Args["labels"] = textutil.FormatLabels(out.Labels)
		}
		if out.Retried {
			// The answer to this key's enrolment was given again.
			rec.Args["retry"] = true
		}
	}
	if aerr != nil {
		rec.Decision, rec.Outcome, rec.Reason = audit.DecisionDenied, audit.OutcomeRefused, string(aerr.Code)
		rec.Error = aerr.Message
		g.log.Info(what+" refused", "host", out.Host, "key", out.Key, "token", out.TokenID, "source", src, "code", aerr.Code, "reason", aerr.Message)
	} else {
		g.log.Info(what+" done", "host", out.Host, "key", out.Key, "token", out.TokenID, "source", src)
	}
	// Stored before the host is answered (gateway/audit).
	if err := g.subsys.audit.Commit(context.Background(), rec); err != nil {
		g.log.Error(what+"'s audit record not stored yet", "host", out.Host, "token", out.TokenID, "err", err)
	}
}

// decodeAPIBody reads a JSON request body into v: one object, no unknown
// fields, at most protocol.MaxAPIRequestBytes.
func decodeAPIBody(w http.ResponseWriter, r *http.Request, v any) *protocol.APIError {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return apiErr(protocol.APIBadRequest, "the body must be JSON (Content-Type: application/json), not %s", protocol.Ellipsis(ct, 60))
	}
	body := http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes)
	return decodeAPIJSON(body, v)
}

// decodeOptionalAPIBody is decodeAPIBody for endpoints whose every field
// has a default: an empty body leaves v as it is.
func decodeOptionalAPIBody(w http.ResponseWriter, r *http.Request, v any) *protocol.APIError {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes))
	if err != nil {
		return apiErr(protocol.APIBadRequest, "the body could not be read (at most %d bytes): %v", protocol.MaxAPIRequestBytes, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	return decodeAPIJSON(bytes.NewReader(data), v)
}

// decodeAPIJSON decodes one JSON object from rd into v, refusing unknown
// fields and anything after the object.
func decodeAPIJSON(rd io.Reader, v any) *protocol.APIError {
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return apiErr(protocol.APIBadRequest, "the body is larger than %d bytes", protocol.MaxAPIRequestBytes)
		}
		return apiErr(protocol.APIBadRequest, "the body is not the JSON this endpoint takes: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apiErr(protocol.APIBadRequest, "the body holds more than one JSON value")
	}
	return nil
}

// apiStatus is the HTTP status of an API error code.
func apiStatus(code protocol.APICode) int {
	switch code {
	case protocol.APIBadRequest, protocol.APIClockSkew, protocol.APIWrongCA:
		return http.StatusBadRequest
	case protocol.APIBadSignature, protocol.APITokenUnknown, protocol.APIUnauthorized:
		return http.StatusUnauthorized
	case protocol.APITokenExpired, protocol.APITokenSpent, protocol.APITokenRevoked, protocol.APINameNotAllowed,
		protocol.APIHostRevoked, protocol.APIKeyRevoked, protocol.APINoRecovery, protocol.APIForbidden:
		return http.StatusForbidden
	case protocol.APINameTaken, protocol.APIReplayed:
		return http.StatusConflict
	case protocol.APIUnknownHost, protocol.APINotFound:
		return http.StatusNotFound
	}
	return http.StatusServiceUnavailable
}

func writeAPIError(w http.ResponseWriter, aerr *protocol.APIError) {
	writeAPIErrorStatus(w, apiStatus(aerr.Code), aerr)
}

func writeAPIErrorStatus(w http.ResponseWriter, status int, aerr *protocol.APIError) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="fleetmcp"`)
	}
	writeJSON(w, status, aerr)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// sourceOf is the address a request came from (without its port).
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// failureLimiter limits the refused requests each source may make: a
// burst of failureBurst, then one per failureEvery. Successful requests
// cost nothing.
type failureLimiter struct {
	mu      sync.Mutex
	sources map[string]*rate.Limiter
}

const (
	failureBurst   = 100
	failureEvery   = time.Second
	failureSources = 10000 // the map is emptied beyond this
)

func newFailureLimiter() *failureLimiter {
	return &failureLimiter{sources: make(map[string]*rate.Limiter)}
}

// allowed reports whether src may make a request now, else how long it
// must wait.
func (f *failureLimiter) allowed(src string, now time.Time) (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.sources[src]
	if l == nil {
		return 0, true
	}
	if t := l.TokensAt(now); t < 1 {
		return time.Duration((1 - t) * float64(failureEvery)), false
	}
	return 0, true
}

// fail counts a refused request of src.
func (f *failureLimiter) fail(src string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.sources[src]
	if l == nil {
		if len(f.sources) >= failureSources {
			clear(f.sources)
		}
		l = rate.NewLimiter(rate.Every(failureEvery), failureBurst)
		f.sources[src] = l
	}
	l.AllowN(now, 1)
}

// APIURL returns the URL hosts reach the fleet API at ("" when it is
// off): the first --advertise name, else the listener's host, with the
// machine's hostname when it listens on every interface.
func (g *Gateway) APIURL() string {
	if g.serving.api == nil || g.serving.api.ln == nil {
		return ""
	}
	host, port, _ := net.SplitHostPort(g.serving.api.ln.Addr().String())
	lhost, _, _ := net.SplitHostPort(g.cfg.APIListen)
	switch ip := net.ParseIP(lhost); {
	case len(g.cfg.Advertise) > 0:
		host = g.cfg.Advertise[0]
	case lhost == "" || ip != nil && ip.IsUnspecified():
		if name, err := os.Hostname(); err == nil && name != "" {
			host = name
		}
	case ip == nil:
		host = lhost
	}
	return (&url.URL{Scheme: "https", Host: net.JoinHostPort(host, port)}).String()
}

// APIAddr returns the address the fleet API listens on ("" when off).
func (g *Gateway) APIAddr() string {
	if g.serving.api == nil || g.serving.api.ln == nil {
		return ""
	}
	return g.serving.api.ln.Addr().String()
}

// APICAPin returns the pin hosts check the fleet API's certificate with
// ("" when the API is off).
func (g *Gateway) APICAPin() string {
	if g.serving.api == nil {
		return ""
	}
	return g.serving.api.pin
}
