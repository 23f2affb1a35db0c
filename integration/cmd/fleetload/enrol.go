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
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
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
	// SigningKeys are the gateway keys agents trust for skill rollout.
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
