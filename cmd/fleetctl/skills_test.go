package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// fakeSkills is the fake gateway's skills: pushed versions (newest
// first) and rollouts.
type fakeSkills struct {
	versions map[string][]protocol.SkillVersion
	rollouts map[string]*protocol.RolloutInfo
	// script holds a rollout's answers to come, one a GET (the last
	// one stays).
	script map[string][]*protocol.RolloutInfo
}

func (g *fakeGateway) skillRoutes(mux *http.ServeMux) {
	g.skills = fakeSkills{versions: map[string][]protocol.SkillVersion{}, rollouts: map[string]*protocol.RolloutInfo{}}
	at := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	g.skills.versions["deploy"] = []protocol.SkillVersion{
		{BundleID: "sha256:" + strings.Repeat("b", 64), Files: 2, Bytes: 200, PushedAt: at.Add(time.Hour), PushedBy: "alice"},
		{BundleID: "sha256:" + strings.Repeat("a", 64), Files: 1, Bytes: 100, PushedAt: at, PushedBy: "ci"},
	}
	g.skills.rollouts["r-aaaaaaaaaa"] = &protocol.RolloutInfo{ID: "r-aaaaaaaaaa", Skill: "deploy", BundleID: "sha256:" + strings.Repeat("b", 64),
		Selector: "role=web", State: protocol.RolloutPaused, Reason: "2 hosts failed, more than max_errors 1", Canary: 1, Batch: "25%", MaxErrors: 1,
		BatchTimeout: "10m0s", Hosts: 3, Batches: 3, CurrentBatch: 1, CreatedAt: at, CreatedBy: "alice",
		Counts: map[string]int{protocol.SkillInstalled: 1, protocol.SkillFailed: 1, protocol.SkillRefused: 1},
		HostStates: []protocol.RolloutHost{
			{Host: "web-1", State: protocol.SkillInstalled, Active: "sha256:" + strings.Repeat("b", 64)},
			{Host: "web-long-name-22", State: protocol.SkillFailed, Active: "sha256:" + strings.Repeat("a", 64), Reason: "the skills folder is read-only"},
			{Host: "web-3", State: protocol.SkillRefused, Reason: "the host's policy denies skill deploy"},
		}}
	sk, ro := protocol.AdminSkillsPath, protocol.AdminRolloutsPath
	mux.HandleFunc("GET "+sk, func(w http.ResponseWriter, r *http.Request) {
		g.answer(w, http.StatusOK, []protocol.SkillInfo{{Name: "deploy", Description: "Deploys\nthe app.", Served: "sha256:" + strings.Repeat("b", 64),
			Versions: 2, LastPushed: at.Add(time.Hour), LastRollout: "r-aaaaaaaaaa"}})
	})
	mux.HandleFunc("POST "+sk, g.pushSkill)
	mux.HandleFunc("GET "+sk+"/{name}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		vs := g.skills.versions[r.PathValue("name")]
		g.mu.Unlock()
		if len(vs) == 0 {
			g.fail(w, http.StatusNotFound, protocol.APINotFound, "no skill "+strconvQuote(r.PathValue("name"))+" was pushed")
			return
		}
		g.answer(w, http.StatusOK, vs)
	})
	mux.HandleFunc("POST "+sk+"/{name}/remove", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.SkillRemoveRequest
		if g.decode(w, r, &req) {
			g.answer(w, http.StatusOK, &protocol.RolloutInfo{ID: "r-remove0001", Skill: r.PathValue("name"), Remove: true, Selector: req.Selector,
				State: protocol.RolloutRunning, Hosts: 4})
		}
	})
	mux.HandleFunc("GET "+ro, func(w http.ResponseWriter, r *http.Request) {
		info := *g.skills.rollouts["r-aaaaaaaaaa"]
		info.HostStates = nil
		g.answer(w, http.StatusOK, []protocol.RolloutInfo{info, {ID: "r-remove0001", Skill: "old", Remove: true, State: protocol.RolloutDone,
			Batches: 1, CurrentBatch: 1, Counts: map[string]int{protocol.SkillRemoved: 4}}})
	})
	mux.HandleFunc("POST "+ro, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.RolloutRequest
		if g.decode(w, r, &req) {
			g.answer(w, http.StatusCreated, &protocol.RolloutInfo{ID: "r-bbbbbbbbbb", Skill: req.Skill, BundleID: req.BundleID, Selector: req.Selector,
				State: protocol.RolloutRunning, Hosts: 12, Batches: 4})
		}
	})
	mux.HandleFunc("GET "+ro+"/{id}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		if next := g.skills.script[r.PathValue("id")]; len(next) > 0 {
			g.skills.rollouts[r.PathValue("id")] = next[0]
			if len(next) > 1 {
				g.skills.script[r.PathValue("id")] = next[1:]
			}
		}
		info := g.skills.rollouts[r.PathValue("id")]
		g.mu.Unlock()
		if info == nil {
			g.fail(w, http.StatusNotFound, protocol.APINotFound, "no rollout "+r.PathValue("id"))
			return
		}
		g.answer(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST "+ro+"/{id}/{action}", func(w http.ResponseWriter, r *http.Request) {
		info := *g.skills.rollouts[r.PathValue("id")]
		switch r.PathValue("action") {
		case protocol.RolloutPause:
			g.fail(w, http.StatusConflict, protocol.APIBadRequest, "rollout r-aaaaaaaaaa is paused, not running")
			return
		case protocol.RolloutResume:
			info.State = protocol.RolloutRunning
		case protocol.RolloutRollback:
			info.State = protocol.RolloutRolledBack
		}
		g.answer(w, http.StatusOK, &info)
	})
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// pushSkill stores a push as the gateway does: the bundle id of the
// manifest the files make.
func (g *fakeGateway) pushSkill(w http.ResponseWriter, r *http.Request) {
	var req protocol.SkillPushRequest
	if !g.decode(w, r, &req) {
		return
	}
	m := protocol.Manifest{Name: req.Name}
	for _, f := range req.Files {
		sum := sha256.Sum256(f.Data)
		m.Files = append(m.Files, protocol.BundleFile{Path: f.Path, Size: int64(len(f.Data)), Mode: f.Mode, SHA256: hex.EncodeToString(sum[:])})
	}
	protocol.SortFiles(m.Files)
	if err := m.Validate(); err != nil {
		g.fail(w, http.StatusBadRequest, protocol.APIBadRequest, err.Error())
		return
	}
	resp := protocol.SkillPushResponse{Skill: req.Name, BundleID: m.BundleID(), Files: len(m.Files), Bytes: m.TotalSize(), PushedAt: time.Now().UTC(), PushedBy: "admin"}
	g.mu.Lock()
	vs := g.skills.versions[req.Name]
	if i := slices.IndexFunc(vs, func(v protocol.SkillVersion) bool { return v.BundleID == resp.BundleID }); i >= 0 {
		resp.PushedAt = vs[i].PushedAt
	} else {
		resp.Created = true
		g.skills.versions[req.Name] = append([]protocol.SkillVersion{{BundleID: resp.BundleID, Files: resp.Files, Bytes: resp.Bytes, PushedAt: resp.PushedAt}}, vs...)
	}
	g.mu.Unlock()
	g.answer(w, http.StatusOK, &resp)
}

// writeTree writes files (path → contents; a path ending in "*" is
// executable) under a new folder named name.
func writeTree(t *testing.T, name string, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	for p, data := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, "*") {
			p, mode = strings.TrimSuffix(p, "*"), 0o755
		}
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const skillMD = "---\nname: deploy\ndescription: Deploys the app.\n---\nRun scripts/run.sh.\n"

func TestSkillsPush(t *testing.T) {
	g := startFakeGateway(t)
	// Scripts (#!) are executable whatever their mode here, as skill_push
	// makes them: the same folder is the same version either way.
	dir := writeTree(t, "deploy", map[string]string{"SKILL.md": skillMD, "scripts/run.sh": "#!/bin/sh\necho hi\n", "reference.md*": "details", "empty/x/y.txt": ""})
	r := mustRun(t, adminEnv(g), "skills", "push", dir)
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminSkillsPath)
	var req protocol.SkillPushRequest
	body(t, got, &req)
	want := protocol.SkillPushRequest{Name: "deploy", Files: []protocol.SkillPushFile{
		{Path: "SKILL.md", Mode: 0o644, Data: []byte(skillMD)},
		{Path: "empty/x/y.txt", Mode: 0o644, Data: []byte{}},
		{Path: "reference.md", Mode: 0o644, Data: []byte("details")},
		{Path: "scripts/run.sh", Mode: 0o755, Data: []byte("#!/bin/sh\necho hi\n")},
	}}
	if !equalJSON(req, want) {
		t.Errorf("push sent %+v\nwant %+v", req, want)
	}
	var resp protocol.SkillPushResponse
	if err := json.Unmarshal(g.answered(), &resp); err != nil {
		t.Fatal(err)
	}
	contains(t, "skills push", r.stdout, "Skill deploy: "+resp.BundleID, "(4 files,", "a new version", "fleetctl skills rollout deploy --selector")

	// The same folder again, through a link to it, is the same version;
	// --name names it.
	link := filepath.Join(t.TempDir(), "current")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	g.requests = nil
	r = mustRun(t, adminEnv(g), "skills", "push", link)
	contains(t, "the same push", r.stdout, resp.BundleID, "already pushed")
	g.requests = nil
	other := writeTree(t, "folder", map[string]string{"SKILL.md": skillMD})
	mustRun(t, adminEnv(g), "skills", "push", "--name", "deploy", other)
	req = protocol.SkillPushRequest{}
	if body(t, g.last(), &req); req.Name != "deploy" || len(req.Files) != 1 {
		t.Errorf("push --name deploy sent %+v", req)
	}
}

// TestSkillsPushRefuses: a folder that is not a bundle is refused before
// anything is sent, with what is wrong.
func TestSkillsPushRefuses(t *testing.T) {
	g := startFakeGateway(t)
	cases := []struct {
		name  string
		setup func(dir string) error
		args  []string
		want  string
	}{
		{"link", func(d string) error { return os.Symlink("/etc/passwd", filepath.Join(d, "passwd")) }, nil, "passwd is a link"},
		{"link to a folder", func(d string) error { return os.Symlink("/etc", filepath.Join(d, "etc")) }, nil, "etc is a link"},
		{"fifo", func(d string) error { return mkfifo(filepath.Join(d, "scripts", "pipe")) }, nil, "scripts/pipe is a named pipe"},
		{"no SKILL.md", func(d string) error { return os.Remove(filepath.Join(d, "SKILL.md")) }, nil, "SKILL.md"},
		{"bad name", nil, []string{"--name", "Bad Name"}, `skill name "Bad Name"`},
		{"bad path", func(d string) error { return os.WriteFile(filepath.Join(d, "a:b"), nil, 0o644) }, nil, `bundle path "a:b"`},
		{"dot-ending path", func(d string) error { return os.WriteFile(filepath.Join(d, "notes."), nil, 0o644) }, nil, "ending in a dot"},
		{"case clash", func(d string) error { return os.WriteFile(filepath.Join(d, "skill.md"), nil, 0o644) }, nil, "differ only in case"},
		{"too large", func(d string) error {
			f, err := os.Create(filepath.Join(d, "big.bin"))
			if err == nil {
				err = f.Truncate(protocol.MaxBundleBytes + 1)
				f.Close()
			}
			return err
		}, nil, "big.bin: too large"},
		{"too many files", func(d string) error {
			for i := range protocol.MaxBundleFiles {
				if err := os.WriteFile(filepath.Join(d, "scripts", "f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+hex.EncodeToString([]byte{byte(i), byte(i >> 8)})), nil, 0o644); err != nil {
					return err
				}
			}
			return nil
		}, nil, "more than 512 files"},
		{"not a folder", func(d string) error { return nil }, []string{"SKILL.md"}, "is not a folder"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g.requests = nil
			dir := writeTree(t, "deploy", map[string]string{"SKILL.md": skillMD, "scripts/run.sh*": "#!/bin/sh\n"})
			if tc.setup != nil {
				if err := tc.setup(dir); errors.Is(err, errors.ErrUnsupported) {
					t.Skipf("%s: not on this system", tc.name)
				} else if err != nil {
					t.Fatal(err)
				}
			}
			target := dir
			args := tc.args
			if len(args) == 1 {
				target, args = filepath.Join(dir, args[0]), nil
			}
			r := fleetctl(t, adminEnv(g), append([]string{"skills", "push", target}, args...)...)
			if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want it to say %q", r.code, r.stderr, tc.want)
			}
			if n := len(g.sent()); n != 0 {
				t.Errorf("fleetctl sent %d requests for a refused folder", n)
			}
		})
	}
}

func TestSkillsRollout(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "skills", "rollout", "deploy", "--selector", "role=web", "--canary", "2", "--batch", "10%",
		"--max_errors", "1", "--auto_rollback", "--batch_timeout", "90s")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminRolloutsPath)
	var req protocol.RolloutRequest
	body(t, got, &req)
	two := 2
	if want := (protocol.RolloutRequest{Skill: "deploy", Selector: "role=web", Canary: &two, Batch: "10%", MaxErrors: 1, AutoRollback: true, BatchTimeout: "1m30s"}); !equalJSON(req, want) {
		t.Errorf("rollout sent %+v; want %+v", req, want)
	}
	contains(t, "skills rollout", r.stdout, "Rollout r-bbbbbbbbbb started", "fleetctl skills status r-bbbbbbbbbb")

	// The defaults: canary 1 (sent, so 0 can be told from unset), 25%.
	g.requests = nil
	mustRun(t, adminEnv(g), "skills", "rollout", "deploy", "--selector", "*", "--canary", "0")
	req = protocol.RolloutRequest{}
	if body(t, g.last(), &req); req.Canary == nil || *req.Canary != 0 || req.Batch != "25%" || req.BatchTimeout != "10m0s" || req.BundleID != "" {
		t.Errorf("rollout with defaults sent %+v", req)
	}

	// NAME@BUNDLE: a whole id as it is; a prefix is looked up among the
	// versions.
	g.requests = nil
	whole := "sha256:" + strings.Repeat("c", 64)
	mustRun(t, adminEnv(g), "skills", "rollout", "deploy@"+whole, "--selector", "*")
	if body(t, g.last(), &req); req.BundleID != whole {
		t.Errorf("deploy@ID sent bundle %q", req.BundleID)
	}
	g.requests = nil
	mustRun(t, adminEnv(g), "skills", "rollout", "deploy@aaaaaaa", "--selector", "*")
	sent := g.sent()
	if len(sent) != 2 {
		t.Fatalf("deploy@PREFIX sent %d requests", len(sent))
	}
	checkRequest(t, sent[0], "GET", protocol.AdminSkillsPath+"/deploy")
	if body(t, sent[1], &req); req.BundleID != "sha256:"+strings.Repeat("a", 64) {
		t.Errorf("deploy@aaaaaaa sent bundle %q", req.BundleID)
	}
	r = fleetctl(t, adminEnv(g), "skills", "rollout", "deploy@sha256:dddddd", "--selector", "*")
	if r.code != 1 || !strings.Contains(r.stderr, "skill deploy has no version sha256:dddddd") {
		t.Errorf("an unknown prefix: exit %d, %q", r.code, r.stderr)
	}

	// Bad flags are refused before anything is sent.
	g.requests = nil
	for _, tc := range []struct{ args []string }{
		{[]string{"deploy"}},
		{[]string{"deploy", "--selector", "*", "--batch", "0"}},
		{[]string{"deploy", "--selector", "*", "--batch", "150%"}},
		{[]string{"deploy", "--selector", "*", "--batch", "x%"}},
		{[]string{"deploy", "--selector", "*", "--canary", "-1"}},
		{[]string{"deploy", "--selector", "*", "--max_errors", "-1"}},
		{[]string{"deploy", "--selector", "*", "--batch_timeout", "100ms"}},
		{[]string{"Deploy!", "--selector", "*"}},
		{[]string{"deploy@abc", "--selector", "*"}},
		{[]string{"deploy", "other", "--selector", "*"}},
	} {
		if r := fleetctl(t, adminEnv(g), append([]string{"skills", "rollout"}, tc.args...)...); r.code != 2 {
			t.Errorf("skills rollout %v: exit %d, %q; want 2", tc.args, r.code, r.stderr)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("refused command lines sent %d requests", n)
	}
}

// TestSkillsStatus: the rollout's state and batch, then an aligned table
// of every host.
func TestSkillsStatus(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "skills", "status", "r-aaaaaaaaaa")
	got := g.last()
	checkRequest(t, got, "GET", protocol.AdminRolloutsPath+"/r-aaaaaaaaaa")
	if got.Query != "hosts=1" {
		t.Errorf("status asked with query %q; want hosts=1", got.Query)
	}
	contains(t, "skills status", r.stdout, "r-aaaaaaaaaa (deploy sha256:"+strings.Repeat("b", 64)+")", "paused, batch 2 of 3",
		"2 hosts failed, more than max_errors 1", "1 installed, 1 failed, 1 refused", "canary 1, batch 25%, max_errors 1")
	lines := strings.Split(r.stdout, "\n")
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "HOST") })
	if i < 0 || len(lines) < i+4 {
		t.Fatalf("no host table:\n%s", r.stdout)
	}
	rows := lines[i : i+4]
	for _, col := range []string{"STATE", "BUNDLE", "REASON"} {
		at := strings.Index(rows[0], col)
		for _, row := range rows[1:] {
			if at < 1 || len(row) <= at || row[at-1] != ' ' || row[at] == ' ' {
				t.Errorf("column %s is not aligned:\n%s", col, strings.Join(rows, "\n"))
			}
		}
	}
	for _, want := range []string{
		`^web-1 +installed +sha256:bbbbbbbbbbbb +-$`,
		`^web-long-name-22 +failed +sha256:aaaaaaaaaaaa +the skills folder is read-only$`,
		`^web-3 +refused +- +the host's policy denies skill deploy$`,
	} {
		if !slices.ContainsFunc(rows, regexp.MustCompile(want).MatchString) {
			t.Errorf("no row %s:\n%s", want, strings.Join(rows, "\n"))
		}
	}

	r = fleetctl(t, adminEnv(g), "skills", "status", "r-nothere00")
	if r.code != 1 || r.stderr != "fleetctl: no rollout r-nothere00 (not_found)\n" {
		t.Errorf("an unknown rollout: exit %d, %q", r.code, r.stderr)
	}
	for _, bad := range []string{"../tokens", "r-a/b", "r-a?x=1"} {
		if r := fleetctl(t, adminEnv(g), "skills", "status", bad); r.code != 2 {
			t.Errorf("skills status %q: exit %d; want 2", bad, r.code)
		}
	}
}

func TestSkillsControl(t *testing.T) {
	g := startFakeGateway(t)
	for action, want := range map[string]string{"resume": "Rollout r-aaaaaaaaaa resumed: now running.", "rollback": "Rollout r-aaaaaaaaaa rolled back: now rolled_back."} {
		g.requests = nil
		r := mustRun(t, adminEnv(g), "skills", action, "r-aaaaaaaaaa")
		got := g.last()
		checkRequest(t, got, "POST", protocol.AdminRolloutsPath+"/r-aaaaaaaaaa/"+action)
		if len(got.Body) != 0 {
			t.Errorf("%s sent a body %q", action, got.Body)
		}
		contains(t, "skills "+action, r.stdout, want)
	}
	// A conflict is the gateway's message, exit 1.
	r := fleetctl(t, adminEnv(g), "skills", "pause", "r-aaaaaaaaaa")
	if r.code != 1 || r.stderr != "fleetctl: rollout r-aaaaaaaaaa is paused, not running (bad_request)\n" {
		t.Errorf("pausing a paused rollout: exit %d, %q", r.code, r.stderr)
	}
}

func TestSkillsRemove(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "skills", "remove", "deploy", "--selector", "role=web")
	got := g.last()
	checkRequest(t, got, "POST", protocol.AdminSkillsPath+"/deploy/remove")
	var req protocol.SkillRemoveRequest
	if body(t, got, &req); req.Selector != "role=web" {
		t.Errorf("remove sent %+v", req)
	}
	contains(t, "skills remove", r.stdout, "Rollout r-remove0001 started: remove deploy from 4 hosts")
	if r := fleetctl(t, adminEnv(g), "skills", "remove", "deploy"); r.code != 2 || !strings.Contains(r.stderr, "--selector is required") {
		t.Errorf("remove without --selector: exit %d, %q", r.code, r.stderr)
	}
}

func TestSkillsLists(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "skills", "list")
	checkRequest(t, g.last(), "GET", protocol.AdminSkillsPath)
	if !regexp.MustCompile(`(?m)^deploy +sha256:bbbbbbbbbbbb +2 +2026-11-30 11:00Z +r-aaaaaaaaaa +Deploys the app\.$`).MatchString(r.stdout) {
		t.Errorf("skills list:\n%s", r.stdout)
	}
	g.requests = nil
	r = mustRun(t, adminEnv(g), "skills", "versions", "deploy")
	checkRequest(t, g.last(), "GET", protocol.AdminSkillsPath+"/deploy")
	if !regexp.MustCompile(`(?s)BUNDLE.*\nsha256:b{64} +2 +200 +2026-11-30 11:00Z +alice\nsha256:a{64} +1 +100 +2026-11-30 10:00Z +ci\n$`).MatchString(r.stdout) {
		t.Errorf("skills versions:\n%s", r.stdout)
	}
	r = fleetctl(t, adminEnv(g), "skills", "versions", "nothing")
	if r.code != 1 || r.stderr != "fleetctl: no skill \"nothing\" was pushed (not_found)\n" {
		t.Errorf("versions of an unknown skill: exit %d, %q", r.code, r.stderr)
	}
	g.requests = nil
	r = mustRun(t, adminEnv(g), "skills", "rollouts")
	checkRequest(t, g.last(), "GET", protocol.AdminRolloutsPath)
	for _, want := range []string{
		`(?m)^r-aaaaaaaaaa +deploy +sha256:bbbbbbbbbbbb +paused +2/3 +1 installed, 1 failed, 1 refused +2026-11-30 10:00Z +alice$`,
		`(?m)^r-remove0001 +old +\(remove\) +done +1/1 +4 removed +- +-$`,
	} {
		if !regexp.MustCompile(want).MatchString(r.stdout) {
			t.Errorf("skills rollouts does not match %s:\n%s", want, r.stdout)
		}
	}
}

// TestSkillsJSON: --json prints the gateway's answer as it came.
func TestSkillsJSON(t *testing.T) {
	g := startFakeGateway(t)
	dir := writeTree(t, "deploy", map[string]string{"SKILL.md": skillMD})
	for _, args := range [][]string{
		{"skills", "push", dir, "--json"},
		{"skills", "list", "--json"},
		{"--json", "skills", "versions", "deploy"},
		{"skills", "rollout", "deploy", "--selector", "*", "--json"},
		{"skills", "status", "r-aaaaaaaaaa", "--json"},
		{"skills", "resume", "r-aaaaaaaaaa", "--json"},
		{"skills", "remove", "deploy", "--selector", "*", "--json"},
		{"skills", "rollouts", "--json"},
	} {
		r := mustRun(t, adminEnv(g), args...)
		if want := string(g.answered()) + "\n"; r.stdout != want {
			t.Errorf("fleetctl %v printed\n%s\nwant the answer as it came:\n%s", args, r.stdout, want)
		}
	}
}

// FuzzCheckBatch: --batch is accepted only as a positive count or a
// percentage from 1 to 100, the gateway's rule.
func FuzzCheckBatch(f *testing.F) {
	for _, s := range []string{"1", "25%", "100%", "101%", "0", "0%", "-1", "x", "", "%", "5%%", " 5", "+3", "9999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := checkBatch(s)
		num, pct := strings.CutSuffix(s, "%")
		n, perr := strconv.Atoi(num)
		valid := perr == nil && n >= 1 && (!pct || n <= 100)
		if (err == nil) != valid {
			t.Fatalf("checkBatch(%q) = %v; the gateway would %s it", s, err, map[bool]string{true: "take", false: "refuse"}[valid])
		}
		var ue *usageError
		if err != nil && !errors.As(err, &ue) {
			t.Fatalf("checkBatch(%q) = %v, not a usage error", s, err)
		}
	})
}
