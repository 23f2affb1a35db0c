package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// offlineFleet is enrolled hosts whose agents are away: rollouts to them
// wait.
type offlineFleet []string

func (f offlineFleet) Members() []skills.Member {
	out := make([]skills.Member, len(f))
	for i, h := range f {
		out[i] = skills.Member{Host: h, Labels: map[string]string{"role": "web"}}
	}
	return out
}

func (f offlineFleet) Online(string) bool { return false }

func (f offlineFleet) AgentOK(host string) error {
	if !slices.Contains(f, host) {
		return fmt.Errorf("host %q is not enrolled", host)
	}
	return nil
}

// The admin handlers push, roll out, follow and control, answer errors
// as APIError with fitting statuses, and audit every change with the
// caller. (Rollouts to hosts that install are the skill store's tests.)
func TestSkillsAdminAPI(t *testing.T) {
	ns := startJetStream(t)
	nc := connectNATS(t, ns, "gateway")
	store, err := skills.Open(nc, testSigningKey(t), offlineFleet{"web-1", "web-2"},
		skills.Options{Replicas: 1, LeaderTTL: 2 * time.Second, Tick: 20 * time.Millisecond, ID: "a", Poke: func(string) {}}, discardLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	cfg := audit.Config{}
	cfg.SetDefaults()
	aud, err := audit.Open(connectNATS(t, ns, "audit"), cfg, audit.Options{MaxCall: time.Minute, Patience: audit.StreamPatience, Log: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{subsys: subsystems{skillStore: store, audit: aud}, log: discardLogger()}
	mux := http.NewServeMux()
	admin := &access.Identity{Kind: access.KindAPIToken, Subject: "ops"}
	for pattern, h := range g.skillsRoutes(func(*http.Request) *access.Identity { return admin }) {
		mux.HandleFunc(pattern, h)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	call := func(method, path string, body any, want int, out any) {
		t.Helper()
		var rd *bytes.Reader
		if s, ok := body.(string); ok {
			rd = bytes.NewReader([]byte(s))
		} else {
			data, _ := json.Marshal(body)
			rd = bytes.NewReader(data)
		}
		req, _ := http.NewRequest(method, srv.URL+path, rd)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != want {
			var e protocol.APIError
			_ = json.NewDecoder(resp.Body).Decode(&e)
			t.Fatalf("%s %s: %d %+v, want %d", method, path, resp.StatusCode, e, want)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	push := protocol.SkillPushRequest{Name: "deploy", Files: []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD("deploy", "Deploys.")}}}
	var pushed protocol.SkillPushResponse
	call("POST", protocol.AdminSkillsPath, push, 200, &pushed)
	if !pushed.Created || pushed.PushedBy != "token:ops" {
		t.Fatalf("push = %+v", pushed)
	}
	var e protocol.APIError
	call("POST", protocol.AdminSkillsPath, protocol.SkillPushRequest{Name: "deploy", Files: []protocol.SkillPushFile{{Path: "SKILL.md", Data: []byte("x")}}}, 400, &e)
	if e.Code != protocol.APIBadRequest || !strings.Contains(e.Message, "frontmatter") {
		t.Fatalf("bad push = %+v", e)
	}
	call("POST", protocol.AdminSkillsPath, `{"name": "deploy", "files": [], "extra": 1}`, 400, nil)
	var versions []protocol.SkillVersion
	call("GET", protocol.AdminSkillsPath+"/deploy", nil, 200, &versions)
	call("GET", protocol.AdminSkillsPath+"/nothing", nil, 404, nil)
	var info protocol.RolloutInfo
	call("POST", protocol.AdminRolloutsPath, protocol.RolloutRequest{Skill: "deploy", Selector: "*", Batch: "100%"}, 200, &info)
	call("POST", protocol.AdminRolloutsPath, protocol.RolloutRequest{Skill: "deploy", Selector: "env=nowhere"}, 400, nil)
	call("GET", protocol.AdminRolloutsPath+"/"+info.ID+"?hosts=1", nil, 200, &info)
	if st := info.HostStates; info.State != protocol.RolloutRunning || len(st) != 2 ||
		st[0].State != protocol.RolloutHostOffline && st[0].State != protocol.RolloutHostWaiting {
		t.Fatalf("rollout = %+v", info)
	}
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/explode", nil, 400, nil)
	call("POST", protocol.AdminRolloutsPath+"/r-nosuchthing/pause", nil, 404, nil)
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/rollback", nil, 200, &info)
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/pause", nil, 409, nil)
	var list []protocol.SkillInfo
	call("GET", protocol.AdminSkillsPath, nil, 200, &list)
	if len(list) != 1 || list[0].Served != pushed.BundleID || list[0].Description != "Deploys." {
		t.Fatalf("skills = %+v", list)
	}
	call("POST", protocol.AdminSkillsPath+"/deploy/remove", protocol.SkillRemoveRequest{Selector: "web-1"}, 200, &info)
	if !info.Remove || info.Hosts != 1 {
		t.Fatalf("remove = %+v", info)
	}
	// Every change is in the audit trail, with its caller.
	if err := aud.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), protocol.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(100)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		var rec audit.Record
		if err := json.Unmarshal(m.Data(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Caller.Subject != "ops" {
			t.Fatalf("record without its caller: %+v", rec)
		}
		ops[rec.Tool+" "+rec.Outcome]++
	}
	for _, want := range []string{"skills.push ok", "skills.push refused", "skills.rollout ok", "skills.rollout refused",
		"skills.rollout_pause refused", "skills.rollout_rollback ok", "skills.remove ok"} {
		if ops[want] == 0 {
			t.Errorf("no audit record %q in %v", want, ops)
		}
	}
}

func skillMD(name, desc string) []byte {
	return []byte("---\nname: " + name + "\ndescription: " + desc + "\n---\n# " + name + "\n")
}
