package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// The admin handlers push, roll out, follow and control, answer errors
// as APIError with fitting statuses, and audit every change with the
// caller.
func TestSkillsAdminAPI(t *testing.T) {
	f := newRolloutFixture(t, []string{"web-1", "web-2"}, nil)
	cfg := audit.Config{}
	cfg.SetDefaults()
	nc := connectNATS(t, f.ns, "audit")
	aud, err := audit.Open(nc, cfg, audit.Options{MaxCall: time.Minute, Patience: audit.StreamPatience, Log: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{skillStore: f.s, audit: aud, log: discardLogger()}
	mux := http.NewServeMux()
	admin := &Identity{Kind: KindAPIToken, Subject: "ops"}
	for pattern, h := range g.skillsRoutes(func(*http.Request) *Identity { return admin }) {
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
	waitUntil(t, "the rollout is done", func() bool {
		call("GET", protocol.AdminRolloutsPath+"/"+info.ID+"?hosts=1", nil, 200, &info)
		return info.State == protocol.RolloutDone
	})
	if len(info.HostStates) != 2 {
		t.Fatalf("host states = %+v", info.HostStates)
	}
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/pause", nil, 409, nil)
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/explode", nil, 400, nil)
	call("POST", protocol.AdminRolloutsPath+"/r-nosuchthing/pause", nil, 404, nil)
	call("POST", protocol.AdminRolloutsPath+"/"+info.ID+"/rollback", nil, 200, &info)
	var skills []protocol.SkillInfo
	call("GET", protocol.AdminSkillsPath, nil, 200, &skills)
	if len(skills) != 1 || skills[0].Served != pushed.BundleID || skills[0].Description != "Deploys." {
		t.Fatalf("skills = %+v", skills)
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
