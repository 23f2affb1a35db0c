package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// enrolRequest asks the gateway child to enrol hosts with their public
// keys, all with labels.
type enrolRequest struct {
	Hosts  []string          `json:"hosts"`
	Keys   []string          `json:"keys"`
	Labels map[string]string `json:"labels"`
}

type enrolResponse struct {
	JWTs []string `json:"jwts"`
	// SigningKeys are the gateway keys agents trust: for calls and skill
	// rollout.
	SigningKeys []string `json:"signing_keys"`
	Error       string   `json:"error,omitempty"`
}

// enrolWorkers bounds the gateway child's concurrent enrolments.
const enrolWorkers = 32

// enrolHandler enrols the hosts of the request with the gateway's local
// enrolment, enrolWorkers at a time.
func enrolHandler(gw *gateway.Gateway, w http.ResponseWriter, r *http.Request) {
	var req enrolRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Hosts) != len(req.Keys) {
		http.Error(w, "bad enrol request", http.StatusBadRequest)
		return
	}
	resp := enrolResponse{JWTs: make([]string, len(req.Hosts)), SigningKeys: gw.SigningKeys()}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, enrolWorkers)
	for i := range req.Hosts {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			creds, err := gw.EnrolLocal(r.Context(), req.Hosts[i], req.Keys[i], req.Labels)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && resp.Error == "" {
				resp.Error = err.Error()
			}
			resp.JWTs[i] = creds.JWT
		})
	}
	wg.Wait()
	_ = json.NewEncoder(w).Encode(resp)
}

// enrol makes a key for every host and enrols them with the gateway
// child, reporting how long each step took. It returns the hosts'
// credentials and the gateway's signing keys.
func (b *bench) enrol(ctx context.Context, hosts []string) (map[string]simfleet.Credential, []string, error) {
	start := time.Now()
	keys := make([]nkeys.KeyPair, len(hosts))
	var wg sync.WaitGroup
	per := (len(hosts) + runtime.NumCPU() - 1) / runtime.NumCPU()
	for lo := 0; lo < len(hosts); lo += per {
		wg.Go(func() {
			for i := lo; i < min(lo+per, len(hosts)); i++ {
				keys[i], _ = nkeys.CreateUser()
			}
		})
	}
	wg.Wait()
	made := time.Since(start)
	req := enrolRequest{Hosts: hosts, Labels: map[string]string{"role": "sim"}}
	for _, kp := range keys {
		if kp == nil {
			return nil, nil, fmt.Errorf("could not make %d nkeys", len(hosts))
		}
		pub, _ := kp.PublicKey()
		req.Keys = append(req.Keys, pub)
	}
	body, _ := json.Marshal(req)
	start = time.Now()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(b.gw.stats, "/stats")+"/enrol", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	hc := http.Client{Timeout: 10 * time.Minute}
	resp, err := hc.Do(hreq)
	if err != nil {
		return nil, nil, fmt.Errorf("enrol: %w", err)
	}
	defer resp.Body.Close()
	var er enrolResponse
	if err := json.NewDecoder(resp.Body).Decode(&er); err != nil {
		return nil, nil, fmt.Errorf("enrol: %s: %w", resp.Status, err)
	}
	if er.Error != "" {
		return nil, nil, fmt.Errorf("enrol: %s", er.Error)
	}
	enrolled := time.Since(start)
	creds := make(map[string]simfleet.Credential, len(hosts))
	for i, h := range hosts {
		seed, _ := keys[i].Seed()
		creds[h] = simfleet.Credential{JWT: er.JWTs[i], Seed: slices.Clone(seed)}
	}
	fmt.Fprintf(b.stdout, "\n%d agent keys made in %s (%.0f/s); enrolled with the gateway (record + user JWT each, %d at a time) in %s (%.0f/s)\n",
		len(hosts), made.Round(time.Millisecond), float64(len(hosts))/made.Seconds(), enrolWorkers,
		enrolled.Round(time.Millisecond), float64(len(hosts))/enrolled.Seconds())
	return creds, er.SigningKeys, nil
}

// enrolHTTPS enrols every host as a host does: the operator makes a join
// token through the admin API (enough uses for all, names sim-*), then
// each host makes its key and enrols over HTTPS with it, pinning the
// gateway's CA and signing its request, -enrol_conns at a time.
func (b *bench) enrolHTTPS(ctx context.Context, hosts []string) (map[string]simfleet.Credential, []string, error) {
	admin := enrolclient.New(b.gw.apiURL, b.gw.apiPin, 1)
	defer admin.Close()
	var tok protocol.TokenCreateResponse
	if err := admin.Post(ctx, protocol.AdminTokensPath, protocol.TokenCreateRequest{Uses: len(hosts), NamePattern: "sim-*", TTL: "1h",
		Labels: map[string]string{"role": "sim"}}, &tok); err != nil {
		return nil, nil, fmt.Errorf("create a join token: %w", err)
	}
	c := enrolclient.New(b.gw.apiURL, b.gw.apiPin, b.o.enrolConns)
	defer c.Close()
	creds := make(map[string]simfleet.Credential, len(hosts))
	var mu sync.Mutex
	var firstErr error
	var signingKeys []string
	sem := make(chan struct{}, b.o.enrolConns)
	var wg sync.WaitGroup
	start := time.Now()
	for _, h := range hosts {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			kp, err := nkeys.CreateUser()
			var resp *protocol.EnrolResponse
			if err == nil {
				resp, err = c.Enrol(ctx, kp, tok.Token, h)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("enrol %s: %w", h, err)
				}
				return
			}
			seed, _ := kp.Seed()
			creds[h] = simfleet.Credential{JWT: resp.JWT, Seed: seed}
			signingKeys = resp.SigningKeys
		})
	}
	wg.Wait()
	took := time.Since(start)
	if firstErr != nil {
		return nil, nil, firstErr
	}
	var info protocol.TokenList
	if err := admin.Get(ctx, protocol.AdminTokensPath, &info); err != nil {
		return nil, nil, err
	}
	for _, ti := range info.Tokens {
		if ti.ID == tok.Info.ID && (ti.Used != len(hosts) || ti.State != protocol.TokenSpent) {
			return nil, nil, fmt.Errorf("after %d enrolments the token says %d of %d uses (%s)", len(hosts), ti.Used, ti.Uses, ti.State)
		}
	}
	fmt.Fprintf(b.stdout, "\n%d hosts enrolled over HTTPS with one join token (key made on the host, signed request, token use, record, user JWT; %d at a time) in %s (%.0f/s)\n",
		len(hosts), b.o.enrolConns, took.Round(time.Millisecond), float64(len(hosts))/took.Seconds())
	return creds, signingKeys, nil
}
