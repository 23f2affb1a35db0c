package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// fleetctl doctor checks the gateway and the fleet from the operator's
// side: the admin API (TLS, the admin token, the clocks), the MCP
// endpoint's readiness, and the enrolled hosts (versions, credentials
// near their end, revoked and offline hosts). One line per check; exit 1
// when one fails.

// Thresholds of the checks.
const (
	doctorSkewWarn   = time.Minute
	doctorCertWarn   = 14 * 24 * time.Hour
	doctorExpirySoon = 7 * 24 * time.Hour
	// doctorNames bounds the hosts a line names.
	doctorNames = 10
)

// checkStatus is the outcome of one check.
type checkStatus int

const (
	checkOK checkStatus = iota
	checkWarn
	checkFail
)

func (s checkStatus) String() string {
	return [...]string{"ok", "warn", "FAIL"}[s]
}

// checkResult is one check's outcome, and what to do unless it is fine.
type checkResult struct {
	check  string
	status checkStatus
	detail string
	fix    string
}

// errDoctorFailed: a check failed (exit 1, nothing more to print).
var errDoctorFailed = errors.New("a check failed")

// runDoctor parses doctor's flags (the global ones, --mcp_url) and runs
// its checks.
func (c *cli) runDoctor(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fleetctl doctor", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	c.g.register(fs)
	mcpURL := fs.String("mcp_url", "", "the gateway's MCP endpoint, e.g. https://gw.example.com:8080/mcp: its /readyz is checked too (TLS: --ca_file or the system's CAs)")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, "Usage: fleetctl doctor [flags]\n\ncheck the admin API (TLS, admin token, clock skew), the MCP endpoint's /readyz (--mcp_url) and the fleet's hosts; exit 1 when a check fails\n\nFlags:\n")
		printFlags(c.stderr, fs, func(string) bool { return true })
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagErr(err)
	}
	if len(pos) > 0 {
		return usagef("doctor takes no arguments (got %q)", pos[0])
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	rs, agents := cl.adminChecks(ctx, c.now)
	if *mcpURL != "" {
		conn, _ := c.connection()
		rs = append(rs, readyCheck(ctx, *mcpURL, conn))
	}
	if agents != nil {
		rs = append(rs, fleetChecks(agents, c.now())...)
	}
	if c.printChecks(rs) {
		return errDoctorFailed
	}
	return nil
}

// printChecks prints one line per result, or with --json one JSON
// object per result in an array, and returns whether any failed.
func (c *cli) printChecks(rs []checkResult) (anyFailed bool) {
	type jsonResult struct {
		Check  string `json:"check"`
		Status string `json:"status"`
		Detail string `json:"detail"`
		Fix    string `json:"fix,omitempty"`
	}
	out := make([]jsonResult, 0, len(rs))
	for _, r := range rs {
		anyFailed = anyFailed || r.status == checkFail
		fix := r.fix
		if r.status == checkOK {
			fix = ""
		}
		out = append(out, jsonResult{Check: r.check, Status: strings.ToLower(r.status.String()), Detail: r.detail, Fix: fix})
		if c.g.json {
			continue
		}
		line := fmt.Sprintf("%-4s  %-18s %s", r.status, r.check, r.detail)
		if fix != "" {
			line += ": " + fix
		}
		fmt.Fprintln(c.stdout, line)
	}
	if c.g.json {
		data, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintf(c.stdout, "%s\n", data)
	}
	return anyFailed
}

// adminChecks asks the admin API for the agent list, a cheap GET only an
// admin may make, and checks the connection on the way: its TLS
// certificate, the caller's rights, the clocks. It returns the hosts
// when the caller got them.
func (cl *client) adminChecks(ctx context.Context, now func() time.Time) ([]checkResult, []protocol.AgentInfo) {
	r := checkResult{check: "admin API"}
	u := cl.base.JoinPath(protocol.AdminAgentsPath)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return []checkResult{failed(r, err.Error(), "")}, nil
	}
	req.Header.Set("Accept", "application/json")
	if cl.token != "" {
		req.Header.Set("Authorization", "Bearer "+cl.token)
	}
	resp, err := cl.http.Do(req)
	if err != nil {
		return []checkResult{failed(r, cl.explain(err).Error(), "")}, nil
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	t := now()
	rs := []checkResult{passed(r, fmt.Sprintf("%s over TLS, verified with %s", cl.base, cl.trust))}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		rs = append(rs, certCheck("admin API cert", resp.TLS.PeerCertificates[0], t))
	}
	if d, derr := http.ParseTime(resp.Header.Get("Date")); derr == nil {
		rs = append(rs, skewCheck(d, t))
	} else {
		rs = append(rs, warned(checkResult{check: "clock skew"}, "the gateway's answer has no Date header", ""))
	}
	admin := checkResult{check: "admin rights"}
	switch {
	case err != nil || len(data) > maxAnswerBytes:
		return append(rs, failed(admin, fmt.Sprintf("reading the answer: %v", err), "")), nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return append(rs, failed(admin, cl.refusal(http.MethodGet, u, resp, data).Error(), "")), nil
	}
	var list protocol.AgentList
	if err := json.Unmarshal(data, &list); err != nil {
		return append(rs, failed(admin, fmt.Sprintf("the agent list is not what fleetctl expects (%v)", err), "is fleetctl as new as the gateway?")), nil
	}
	who := "this token is an admin's"
	if cl.token == "" {
		who = "the gateway lets callers without a token administer it (--no_auth)"
	}
	return append(rs, passed(admin, who)), list.Agents
}

// certCheck decides on the validity of a server's certificate: a
// failure outside it, a warning under doctorCertWarn left.
func certCheck(check string, leaf *x509.Certificate, now time.Time) checkResult {
	r := checkResult{check: check}
	left := leaf.NotAfter.Sub(now)
	detail := fmt.Sprintf("%q valid until %s (%s left)", leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339), span(max(left, 0)))
	switch {
	case now.Before(leaf.NotBefore):
		return failed(r, fmt.Sprintf("%q is not valid before %s", leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339)), "check this machine's clock")
	case left <= 0:
		return failed(r, detail, "renew the gateway's certificate")
	case left < doctorCertWarn:
		return warned(r, detail, "renew the gateway's certificate soon")
	}
	return passed(r, detail)
}

// skewCheck decides on the difference between this machine's clock
// (local) and the gateway's (server, to the second).
func skewCheck(server, local time.Time) checkResult {
	r := checkResult{check: "clock skew"}
	skew := local.Sub(server)
	side := "ahead of"
	if skew < 0 {
		side = "behind"
	}
	detail := fmt.Sprintf("this machine's clock is %s %s the gateway's", skew.Abs().Round(time.Second), side)
	switch {
	case skew.Abs() > protocol.MaxClockSkew:
		return failed(r, detail, fmt.Sprintf("sync the clocks (NTP): beyond %s tokens and credentials look expired or not yet valid, and the gateway refuses enrolments", protocol.MaxClockSkew))
	case skew.Abs() > doctorSkewWarn:
		return warned(r, detail, "sync the clocks (NTP)")
	}
	return passed(r, detail)
}

// readyCheck asks the MCP endpoint's /readyz, trusting --ca_file or the
// system's CAs (the MCP endpoint's certificate is its own, not the fleet
// CA's).
func readyCheck(ctx context.Context, raw string, conn connection) checkResult {
	r := checkResult{check: "gateway ready"}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return failed(r, fmt.Sprintf("--mcp_url %q", raw), "give the MCP endpoint's URL, e.g. https://gw.example.com:8080/mcp")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if conn.caFile != "" {
		pemData, err := os.ReadFile(conn.caFile)
		if err != nil {
			return failed(r, err.Error(), "")
		}
		tc.RootCAs = x509.NewCertPool()
		tc.RootCAs.AppendCertsFromPEM(pemData)
	}
	hc := &http.Client{Timeout: conn.timeout, Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: tc},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer hc.CloseIdleConnections()
	ready := u.ResolveReference(&url.URL{Path: "/readyz"})
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ready.String(), nil)
	if err != nil {
		return failed(r, err.Error(), "")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return failed(r, fmt.Sprintf("%s: %v", ready, err), "check --mcp_url (the gateway's --listen) and that the gateway runs")
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := protocol.Clip(strings.TrimSpace(string(body)), 200)
	if resp.StatusCode != http.StatusOK {
		return failed(r, fmt.Sprintf("%s answered %s: %s", ready, resp.Status, text), "see the gateway's log: it is not ready to route calls")
	}
	return passed(r, fmt.Sprintf("%s: %s", ready, text))
}

// fleetChecks decides on the enrolled hosts: the versions they run,
// credentials near their end, revoked and offline hosts.
func fleetChecks(agents []protocol.AgentInfo, now time.Time) []checkResult {
	var live, revoked, offline, expiring, expired []string
	versions, platforms := map[string]int{}, map[string]int{}
	unknown := 0
	for i := range agents {
		a := &agents[i]
		if !a.RevokedAt.IsZero() {
			revoked = append(revoked, a.Host)
			continue
		}
		live = append(live, a.Host)
		if a.AgentVersion == "" {
			unknown++
		} else {
			versions[a.AgentVersion]++
		}
		if a.Facts.OS != "" {
			platforms[a.Facts.OS+"/"+a.Facts.Arch]++
		}
		if !a.Online {
			offline = append(offline, a.Host)
		}
		switch left := a.CredentialExpiresAt.Sub(now); {
		case a.CredentialExpiresAt.IsZero():
		case left <= 0:
			expired = append(expired, a.Host)
		case left < doctorExpirySoon:
			expiring = append(expiring, a.Host)
		}
	}
	rs := []checkResult{passed(checkResult{check: "hosts"}, fmt.Sprintf("%d enrolled, %d online, %d offline, %d revoked",
		len(live)+len(revoked), len(live)-len(offline), len(offline), len(revoked)))}
	rs = append(rs, versionCheck(versions, unknown))
	if len(platforms) > 0 {
		rs = append(rs, passed(checkResult{check: "platforms"}, tally(platforms)))
	}
	rs = append(rs, credentialCheck(expiring, expired))
	off := checkResult{check: "offline hosts"}
	if len(offline) > 0 {
		rs = append(rs, warned(off, names(offline), "an offline host's agent is stopped, or cannot reach NATS: run fleet-agent doctor on it"))
	} else {
		rs = append(rs, passed(off, "none"))
	}
	rv := checkResult{check: "revoked hosts"}
	if len(revoked) > 0 {
		rs = append(rs, passed(rv, names(revoked)+" (they enrol again only with a token made with --replace NAME)"))
	} else {
		rs = append(rs, passed(rv, "none"))
	}
	return rs
}

// versionCheck decides on the agent versions the hosts announced.
func versionCheck(versions map[string]int, unknown int) checkResult {
	r := checkResult{check: "agent versions"}
	detail := tally(versions)
	if unknown > 0 {
		detail = strings.TrimPrefix(detail+fmt.Sprintf(", %d not known (not seen since the gateway started)", unknown), ", ")
	}
	if len(versions) > 1 {
		return warned(r, detail, "hosts run different agent versions: upgrade the older ones")
	}
	if detail == "" {
		detail = "no hosts"
	}
	return passed(r, detail)
}

// credentialCheck decides on the hosts whose credential expires within
// doctorExpirySoon, or has expired.
func credentialCheck(expiring, expired []string) checkResult {
	r := checkResult{check: "credentials"}
	switch {
	case len(expired) > 0:
		detail := "expired: " + names(expired)
		if len(expiring) > 0 {
			detail += "; expiring within 7 days: " + names(expiring)
		}
		return warned(r, detail, "a running agent renews its credential before it expires; an expired one comes back only by recovery: fleetctl agent allow-recovery NAME, then start its agent")
	case len(expiring) > 0:
		return warned(r, "expiring within 7 days: "+names(expiring),
			"a running agent renews its credential once a third of its lifetime is left: an online host listed here fails to renew (see its log); an offline one needs its agent started")
	}
	return passed(r, "none expires within 7 days")
}

// tally lists counts as "k (n), ...", most common first.
func tally(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s (%d)", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// names lists hosts, at most doctorNames of them.
func names(hosts []string) string {
	hosts = slices.Sorted(slices.Values(hosts))
	if len(hosts) > doctorNames {
		return strings.Join(hosts[:doctorNames], ", ") + fmt.Sprintf(" and %d more", len(hosts)-doctorNames)
	}
	return strings.Join(hosts, ", ")
}

// span says how long d is, in days beyond two.
func span(d time.Duration) string {
	if d < 48*time.Hour {
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}

func passed(r checkResult, detail string) checkResult {
	r.status, r.detail = checkOK, detail
	return r
}

func warned(r checkResult, detail, fix string) checkResult {
	r.status, r.detail, r.fix = checkWarn, detail, fix
	return r
}

func failed(r checkResult, detail, fix string) checkResult {
	r.status, r.detail, r.fix = checkFail, detail, fix
	return r
}
