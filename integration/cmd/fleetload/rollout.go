package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The rollout mode (-mode rollout) measures skill rollout: N simulated
// hosts that do the agent's side of it (the read of their desired
// state, signed manifest, files in parts, status), a new version of a
// small skill pushed and rolled out to all of them (canary 1, then
// batches of 25%) -runs times, and the time from the start of each
// rollout until the gateway reports every host installed; and the
// JetStream consumers the skill streams have meanwhile.

// skillHandlers are the gateway child's endpoints for the rollout mode.
func skillHandlers(mux *http.ServeMux, running *atomic.Pointer[gateway.Gateway]) {
	handle := func(pattern string, h func(*gateway.Gateway, *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			gw := running.Load()
			if gw == nil {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			v, err := h(gw, r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			_ = json.NewEncoder(w).Encode(v)
		})
	}
	handle("POST /skills/push", func(gw *gateway.Gateway, r *http.Request) (any, error) {
		var req protocol.SkillPushRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, err
		}
		return gw.PushSkill(r.Context(), nil, req.Name, req.Files)
	})
	handle("POST /skills/rollout", func(gw *gateway.Gateway, r *http.Request) (any, error) {
		var req protocol.RolloutRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, err
		}
		return gw.StartRollout(r.Context(), nil, req)
	})
	handle("GET /skills/status", func(gw *gateway.Gateway, r *http.Request) (any, error) {
		return gw.RolloutStatus(r.Context(), r.URL.Query().Get("id"), false)
	})
	handle("GET /skills/consumers", func(gw *gateway.Gateway, r *http.Request) (any, error) {
		return gw.SkillConsumers(r.Context())
	})
}

// childJSON sends body (nil: GET) to the child's path and decodes the
// answer into out.
func (c *child) childJSON(ctx context.Context, path string, body, out any) error {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		data, _ := json.Marshal(body)
		method, rd = http.MethodPost, bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.stats, "/stats")+path, rd)
	if err != nil {
		return err
	}
	hc := http.Client{Timeout: time.Minute}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// skillBundle is version v of the measured skill: a SKILL.md, a script
// and a 32 KiB reference, about what a real skill holds.
func skillBundle(v int) protocol.SkillPushRequest {
	ref := bytes.Repeat([]byte(fmt.Sprintf("reference line of version %d\n", v)), 32<<10/28)
	return protocol.SkillPushRequest{Name: "loadtest", Files: []protocol.SkillPushFile{
		{Path: "SKILL.md", Data: []byte(fmt.Sprintf("---\nname: loadtest\ndescription: Version %d of a skill rolled out by fleetload.\n---\nRun scripts/run.sh.\n", v))},
		{Path: "scripts/run.sh", Mode: 0o755, Data: []byte("#!/bin/sh\necho version " + fmt.Sprint(v) + "\n")},
		{Path: "reference.md", Data: ref},
	}}
}

// measureRollout is the rollout mode for n hosts.
func measureRollout(ctx context.Context, b *bench, hosts []string, creds map[string]simfleet.Credential, keys []string) error {
	var err error
	b.fleet, err = simfleet.Start(ctx, simfleet.Config{
		URL: b.gw.natsURL, Hosts: hosts, SigningKeys: keys, Skills: true,
		Credentials: func(h string) (simfleet.Credential, error) { return creds[h], nil },
	})
	if err != nil {
		return err
	}
	defer b.fleet.Close()
	if _, err := b.gw.waitOnline(ctx, b.n, 3*time.Minute); err != nil {
		return err
	}
	fmt.Fprintf(b.stdout, "\n== skill rollout to %d hosts (load average %s)\n", b.n, childproc.LoadAverage())
	var took []time.Duration
	maxConsumers := map[string]int{}
	missed := 0
	for r := range b.o.runs {
		var pushed protocol.SkillPushResponse
		if err := b.gw.childJSON(ctx, "/skills/push", skillBundle(r), &pushed); err != nil {
			return err
		}
		canary := 1
		var info protocol.RolloutInfo
		start := time.Now()
		req := protocol.RolloutRequest{Skill: "loadtest", BundleID: pushed.BundleID, Selector: "role=sim", Canary: &canary, Batch: "25%", BatchTimeout: "5m"}
		if err := b.gw.childJSON(ctx, "/skills/rollout", req, &info); err != nil {
			return err
		}
		lastConsumers := time.Time{}
		for info.Counts[protocol.SkillInstalled] < b.n {
			if time.Since(start) > 5*time.Minute || info.State == protocol.RolloutPaused || info.State == protocol.RolloutRolledBack {
				return fmt.Errorf("rollout %s: %s %s after %s: %v", info.ID, info.State, info.Reason, time.Since(start).Round(time.Second), info.Counts)
			}
			if time.Since(lastConsumers) > time.Second {
				// Best effort: a JetStream busy with the rollout may not
				// answer in time; the sample after the run must.
				missed += b.sampleConsumers(ctx, maxConsumers, 1)
				lastConsumers = time.Now()
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			if err := b.gw.childJSON(ctx, "/skills/status?id="+info.ID, nil, &info); err != nil {
				return err
			}
		}
		d := time.Since(start)
		if got := b.fleet.Installed("loadtest", pushed.BundleID); got != b.n {
			return fmt.Errorf("the gateway reports %d hosts installed, but %d simulated hosts hold the bundle", b.n, got)
		}
		took = append(took, d)
		fmt.Fprintf(b.stdout, "run %d: every host installed after %s (%d batches)\n", r+1, d.Round(time.Millisecond), info.Batches)
	}
	if b.sampleConsumers(ctx, maxConsumers, 5) > 0 {
		return errors.New("the gateway did not report its skill streams' consumers after the runs")
	}
	slices.Sort(took)
	fmt.Fprintf(b.stdout, "skill rollout to %d hosts: median %s, min %s, max %s over %d runs; JetStream consumers of the skill streams at most %v (%d samples missed)\n",
		b.n, took[len(took)/2].Round(time.Millisecond), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took), maxConsumers, missed)
	return nil
}

// sampleConsumers keeps the most consumers seen per skill stream, trying
// up to attempts times; it returns 1 when no attempt got an answer.
func (b *bench) sampleConsumers(ctx context.Context, most map[string]int, attempts int) int {
	for range attempts {
		var now map[string]int
		if err := b.gw.childJSON(ctx, "/skills/consumers", nil, &now); err != nil {
			fmt.Fprintf(b.stderr, "consumers: %v\n", err)
			continue
		}
		for k, v := range now {
			most[k] = max(most[k], v)
		}
		return 0
	}
	return 1
}
